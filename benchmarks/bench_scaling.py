"""Training time and memory against the number of rows ("Fast at every size").

The bundled Adult training table (validated as ``benchmarks/datasets.py`` loads it) is
replicated to each size with a fixed-seed perturbation, so no two copies of a row are equal:

- integer and numeric columns: a uniform shift of up to 1% of the width of the column's
  public bounds on its own scale (identity or log1p), rounded for integers, clipped to the
  bounds; nulls stay null;
- categorical columns: 1% of the cells redrawn uniformly over the column's public cells
  (its categories, and null when it is nullable).

The seed (``SEED``) is public and the perturbation reads nothing but the schema's public
bounds and categories. The schema's ``expected_rows`` is set to each size, so the privacy
plan (``privflow.tasks.run_plan.run_plan``) turns a FIXED number of epochs (default 1)
into a Poisson rate batch/rows and rows/batch steps. Each size runs in its own subprocess
that reads the replicated table from Parquet, times the pipeline's ``privflow.tasks.fit.prepare``
(DP marginals, encode, split) and ``privflow.tasks.fit.fit`` (DP statistics, DP-SGD, the
epsilon curve, Report-Noisy-Max selection) at the default configuration, and reports its own
peak RSS, so memory is per size. Phase times come from wrappers this script puts around the
module attributes ``tasks/fit.py`` calls; nothing in the package is changed.

    .venv/bin/python -m benchmarks.bench_scaling [--sizes 32000 320000 3200000] [--epochs 1] \
        [--out benchmarks/results/scaling.md]

The delta is 1e-8 at every size (the pre-flight rule delta < 1/expected_rows at 3.2M rows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261123  # public: the perturbation's only randomness
JITTER = 0.01  # share of a numeric column's public width
RESAMPLE = 0.01  # share of categorical cells redrawn
EPSILON, DELTA = 1.0, 1e-8
# the module attributes of privflow.tasks.fit that the phases run through (the steps' plain functions)
TASK_PHASES = {
    "dp_marginal_codec": "dp_marginals",
    "dp_target_head": "dp_head",
    "encode_rows": "encode",
    "dp_statistics": "dp_stats",
    "dp_prior": "dp_prior",
    "train_flow_model": "train",
    "select_checkpoints": "select",
}


def replicate(df: pl.DataFrame, schema: Any, rows: int, seed: int = SEED) -> pl.DataFrame:
    """`rows` rows: the table repeated in order, then perturbed column by column (module
    docstring) with a generator of the public `seed`, so copies of a row differ."""
    rng = np.random.default_rng(seed)
    base = df[np.arange(rows) % df.height]
    cols: list[pl.Series] = []
    for col in schema.columns:
        s = base.get_column(col.name)
        if col.is_categorical:
            cats = list(col.categories or ())
            null_code = len(cats)
            codes = s.to_physical().fill_null(null_code).to_numpy().astype(np.int64)
            redraw = rng.random(rows) < RESAMPLE
            cells = null_code + 1 if col.nullable else null_code
            codes = np.where(redraw, rng.integers(0, cells, rows), codes)
            labels = pl.Series(col.name, [*cats, None], dtype=pl.String)
            cols.append(labels.gather(codes).cast(pl.Enum(cats)).alias(col.name))
            continue
        lo, hi = (float(b) for b in col.bounds)  # type: ignore[union-attr]
        x = s.cast(pl.Float64).to_numpy()
        log = col.transform == "log1p"
        t_lo, t_hi = (np.log1p(lo), np.log1p(hi)) if log else (lo, hi)
        shift = rng.uniform(-JITTER, JITTER, rows) * (t_hi - t_lo)
        t = (np.log1p(np.clip(x, lo, hi)) if log else x) + shift
        y = np.clip(np.expm1(t) if log else t, lo, hi)
        if col.type == "integer":
            out = pl.Series(col.name, np.clip(np.rint(y), np.ceil(lo), np.floor(hi)).astype(np.int64), pl.Int64)
        else:
            out = pl.Series(col.name, y, pl.Float64)
        nulls = s.is_null()
        cols.append(out.set(nulls, None) if nulls.any() else out)
    return pl.DataFrame(cols)


def _with_rows(schema: Any, rows: int) -> Any:
    from privflow.data.schema import Schema

    doc = schema.model_dump(mode="json")
    doc["dataset"]["expected_rows"] = int(rows)
    return Schema.model_validate(doc)


def _emit(**record: Any) -> None:
    """One JSON line to the parent, flushed at once: a size stopped for taking too long still
    reports the phases it finished."""
    print(json.dumps(record), flush=True)


_PEAK = {"mb": 0.0}  # the process's peak RSS, kept across the per-phase resets of VmHWM


def _reset_peak() -> None:
    """Fold the peak so far into _PEAK, then reset the kernel's VmHWM to the current RSS
    (/proc/self/clear_refs, value 5), so the next reading is the peak of what runs next."""
    _PEAK["mb"] = max(_PEAK["mb"], common.peak_rss_mb())
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` reporting its wall seconds, CPU seconds and own peak RSS as a phase line."""

    def run(*args: Any, **kwargs: Any) -> Any:
        _reset_peak()
        t0, c0 = time.perf_counter(), common.cpu_seconds()
        try:
            return fn(*args, **kwargs)
        finally:
            peak = common.peak_rss_mb()
            _PEAK["mb"] = max(_PEAK["mb"], peak)
            _emit(phase=name, seconds=time.perf_counter() - t0, cpu=common.cpu_seconds() - c0, peak_mb=peak)

    return run


def child(rows: int, path: str, epochs: float) -> None:
    """One size: read the table, plan, time prepare + fit with phase wrappers, report peak RSS."""
    import torch

    from privflow.core.config import RunConfig
    from privflow.data.schema import Schema
    from privflow.tasks import fit as fit_module
    from privflow.tasks.run_plan import run_plan

    schema = _with_rows(Schema.from_yaml(ROOT / "src" / "privflow" / "demo" / "adult.yaml"), rows)
    df = pl.read_parquet(path)
    df = df.with_columns(
        [pl.col(c.name).cast(pl.Enum(list(c.categories or ()))) for c in schema.columns if c.is_categorical]
    )
    config = RunConfig.build(
        data=path,
        schema_path=ROOT / "src" / "privflow" / "demo" / "adult.yaml",
        privacy={"epsilon": EPSILON, "delta": DELTA},
        train={"epochs": epochs},
    )
    torch.set_num_threads(config.train.threads)  # as the train flow does (tasks/train.py: cpu_threads)
    for attr, phase in TASK_PHASES.items():
        setattr(fit_module, attr, _timed(phase, getattr(fit_module, attr)))
    fit_module.cumulative_epsilon = _timed("epsilon_curve", fit_module.cumulative_epsilon)
    fit_module.calibrated = _timed("head_calibration", fit_module.calibrated)
    plan = run_plan(config, schema)
    rss_before = common.peak_rss_mb()
    _emit(
        loaded=df.height,
        rss_before_mb=rss_before,
        planned_steps=plan.stage("train").event.steps if plan.has("train") else 0,
    )
    spend = fit_module.Spend()
    t0, c0 = time.perf_counter(), common.cpu_seconds()
    codec, x_train, x_val = fit_module.prepare(config, schema, df, plan, spend)
    result = fit_module.fit(config, schema, codec, x_train, x_val, plan=plan, spend=spend)
    _emit(
        done=True,
        rows=rows,
        train_rows=int(x_train.shape[0]),
        val_rows=int(x_val.shape[0]),
        steps=int(result.train.steps),
        checkpoints=len(result.train.checkpoints),
        fit_seconds=time.perf_counter() - t0,
        fit_cpu=common.cpu_seconds() - c0,
        peak_rss_mb=max(_PEAK["mb"], common.peak_rss_mb()),
        copula_only=bool(result.copula_only),
    )


def run_size(rows: int, path: Path, epochs: float, timeout: float) -> dict[str, Any]:
    """Run one size's child; collect its JSON lines (phases, then the totals)."""
    cmd = [sys.executable, __file__, "--epochs", str(epochs), "--child", str(rows), str(path)]
    record: dict[str, Any] = {"rows": rows, "phases": {}, "phase_cpu": {}, "phase_peak": {}}
    started = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        stdout, code = out.stdout, out.returncode
        if code != 0:
            record["error"] = (out.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        stdout = raw.decode() if isinstance(raw, bytes) else raw
        record["error"] = f"stopped after {timeout:.0f} s (--timeout)"
    record["wall"] = time.perf_counter() - started
    for line in stdout.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "phase" in item:
            record["phases"][item["phase"]] = record["phases"].get(item["phase"], 0.0) + item["seconds"]
            record["phase_cpu"][item["phase"]] = record["phase_cpu"].get(item["phase"], 0.0) + item["cpu"]
            record["phase_peak"][item["phase"]] = max(record["phase_peak"].get(item["phase"], 0.0), item["peak_mb"])
        else:
            record.update(item)
    return record


PHASE_ORDER = (
    "dp_marginals",
    "dp_head",
    "encode",
    "dp_stats",
    "dp_prior",
    "train",
    "epsilon_curve",
    "select",
    "head_calibration",
)


def render(results: list[dict[str, Any]], epochs: float, started: datetime, load_before: str, commit: str) -> str:
    """The results file: header, the size table, the phase table, and the verdicts."""
    notes = [
        f"Adult training table (32,561 validated rows) replicated with a fixed-seed perturbation (seed {SEED}: "
        f"integer/numeric columns shifted by up to {JITTER:.0%} of their public width on their scale, "
        f"{RESAMPLE:.0%} of categorical cells redrawn); `expected_rows` = the size.",
        f"Default configuration (DP-HFlow, DP marginals on, batch 512, checkpoint every 50 steps, one torch "
        f"thread), epsilon {EPSILON:g}, delta {DELTA:g}, **{epochs:g} epoch(s) at every size** (steps = rows/512 "
        "x epochs).",
        "Fit = `prepare` (DP marginals, the target head, encode, split) + `fit` (DP statistics, DP-SGD, epsilon "
        "curve, selection, the head's calibration); "
        "one subprocess per size; peak RSS is the child's VmHWM (whole process: the table, its encoding, the "
        "fit); RSS before fit is after reading the table.",
        "CPU s counts every thread of the child: less sensitive to other work on the machine than wall seconds.",
    ]
    lines = common.header("Training time and memory against rows", started, load_before, notes, commit)
    base = next((r for r in results if "fit_seconds" in r), None)
    lines += [
        "| rows | steps | checkpoints | fit s | s per 1k rows | fit s ratio | fit CPU s | CPU ratio | rows ratio "
        "| train s per step | peak RSS MB | RSS before fit MB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        if "fit_seconds" not in r:
            done = ", ".join(f"{k} {v:.0f} s" for k, v in r["phases"].items())
            lines.append(
                f"| {r['rows']:,} | {r.get('planned_steps', '?')} (planned) | - | not finished: {r.get('error', '?')}"
                f"{'; phases done: ' + done if done else ''} | | | | | | | | {r.get('rss_before_mb', 0):.0f} |"
            )
            continue
        train = r["phases"].get("train", float("nan"))
        lines.append(
            f"| {r['rows']:,} | {r['steps']:,} | {r['checkpoints']} | {r['fit_seconds']:.1f} "
            f"| {1000 * r['fit_seconds'] / r['rows']:.3f} | {r['fit_seconds'] / base['fit_seconds']:.2f} "
            f"| {r['fit_cpu']:.1f} | {r['fit_cpu'] / base['fit_cpu']:.2f} | {r['rows'] / base['rows']:.0f} "
            f"| {train / max(r['steps'], 1):.3f} | {r['peak_rss_mb']:.0f} | {r['rss_before_mb']:.0f} |"
        )
    lines += [
        "",
        "Seconds per phase (wall; the rest of `fit s` is model building and bookkeeping):",
        "",
        "| rows | " + " | ".join(PHASE_ORDER) + " |",
        "| ---: | " + " | ".join("---:" for _ in PHASE_ORDER) + " |",
    ]
    for r in results:
        cells = [f"{r['phases'][p]:.1f}" if p in r["phases"] else "-" for p in PHASE_ORDER]
        lines.append(f"| {r['rows']:,} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Peak RSS (MB) while each phase ran (the kernel's high-water mark reset at each phase's start, "
        "`/proc/self/clear_refs`; it includes what was already resident, about the 'RSS before fit' column plus "
        "the encoded rows):",
        "",
        "| rows | " + " | ".join(PHASE_ORDER) + " |",
        "| ---: | " + " | ".join("---:" for _ in PHASE_ORDER) + " |",
    ]
    for r in results:
        cells = [f"{r['phase_peak'][p]:.0f}" if p in r["phase_peak"] else "-" for p in PHASE_ORDER]
        lines.append(f"| {r['rows']:,} | " + " | ".join(cells) + " |")
    lines += ["", "## Verdict", ""]
    done = [r for r in results if "fit_seconds" in r]
    for r in done[1:]:
        k = r["rows"] / base["rows"]
        t, c = r["fit_seconds"] / base["fit_seconds"], r["fit_cpu"] / base["fit_cpu"]
        grow = (r["peak_rss_mb"] - base["peak_rss_mb"]) / ((r["rows"] - base["rows"]) / 1e6)
        phases = ", ".join(
            f"{p} x{r['phase_cpu'][p] / base['phase_cpu'][p]:.1f}"
            for p in PHASE_ORDER
            if p in r["phase_cpu"] and base["phase_cpu"].get(p, 0) > 0
        )
        lines.append(
            f"- {r['rows']:,} rows ({k:.0f}x the first): fit CPU x{c:.1f}, wall x{t:.1f} "
            f"({'linear' if c <= 1.15 * k else 'worse than linear'} by CPU time; CPU ratio per phase: {phases}); "
            f"peak RSS x{r['peak_rss_mb'] / base['peak_rss_mb']:.2f} "
            f"({'flat, within 25%' if r['peak_rss_mb'] <= 1.25 * base['peak_rss_mb'] else 'not flat'}; "
            f"+{grow:.0f} MB per extra million rows)."
        )
    for r in results:
        if r not in done:
            lines.append(f"- {r['rows']:,} rows: {r.get('error', 'failed')} ({r['wall'] / 60:.1f} min).")
        elif r["wall"] > 600:
            lines.append(f"- {r['rows']:,} rows took {r['wall'] / 60:.1f} min in all (over 10 minutes).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parent: build each size's table, run its child, write the Markdown file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32_000, 320_000, 3_200_000])
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds before a size is stopped")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scaling.md")
    ap.add_argument("--child", nargs=2, metavar=("ROWS", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(int(args.child[0]), args.child[1], args.epochs)
        return 0
    from privflow.core import env

    env.configure(Path(tempfile.gettempdir()) / "privflow-bench-scaling", verbose=False)
    started, load_before, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    from benchmarks import datasets

    data = datasets.load("adult")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sorted(args.sizes):
            path = Path(tmp) / f"adult-{rows}.parquet"
            replicate(data.train, data.schema, rows).write_parquet(path)
            results.append(run_size(rows, path, args.epochs, args.timeout))
            path.unlink()
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    text = render(results, args.epochs, started, load_before, commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
