"""Anomaly detection against epsilon: DP-NF's section 5 protocol, one command.

    .venv/bin/python -m benchmarks.bench_anomaly      # minutes on 2 CPU cores; writes
                                                       # benchmarks/results/anomaly.md and anomaly.png

Data (Waites & Cummings 2021, section 5 and Appendix C):

- adult-numeric: the six numeric columns of the bundled UCI Adult (age, fnlwgt, education-num,
  capital-gain, capital-loss, hours-per-week), the published train/test files. Anomalies as in
  the paper's Figure 5: as many as test rows, each column drawn uniformly from the test rows'
  5th-30th or 70th-95th percentile band (a fair coin per column), integers floored.
- half-moons: 30,000 points (benchmarks/datasets.py; 27,000 train, 3,000 test). The paper says
  only that anomalies "were added" (Figure 8); here as many as test rows, uniform in the public
  box, rejected when closer than 0.15 (three noise standard deviations) to either noise-free
  arc, so that none is an inlier by chance.

Methods, at each epsilon in EPSILONS (DP randomness from the OS CSPRNG):

- DP flow + DP threshold: the pipeline's fit (tasks/fit.py) of the flow at 0.9 epsilon, and the
  threshold the DP FPR-quantile (privacy/mechanisms/dp_quantile.py, as `privflow score --fpr`) of
  its held-out training rows' log-likelihoods at 0.1 epsilon; the total is the PLD composition.
  ROC AUC from the log-likelihood (threshold-free), accuracy at the DP threshold; the mean of
  REPEATS runs. Every query is then free (post-processing).
- DP-AD: PARTITIONS non-private flows on disjoint parts of the training rows (tasks/dpad.py), each
  part's threshold its own held-out rows' FPR-quantile, votes aggregated per query by
  Report-Noisy-Max at epsilon PER QUERY (privacy/mechanisms/dp_ad.py). Its answer is one bit, so
  its ROC AUC is its balanced accuracy; accuracy is the mean over DRAWS draws of the noise (the
  closed form `prob_anomalous` gives the expectation; both are reported). Answering many
  queries composes: the table gives the PLD epsilon of 100 of them.
- Non-private flow: the same fit without clipping or noise, threshold the exact FPR-quantile of
  the held-out rows; and the DP-AD ensemble's noiseless majority vote.

Configuration (public, small so the run fits in minutes on 2 cores): MAF (DP-NF's backbone) with
3 blocks of 32 hidden units, DP-Adam, 8 epochs, batch 512 (each part: batch 64, so a part of
~2,200 rows still takes ~270 steps), delta 1e-5, FPR 0.05, 10 parts, one torch thread; DP marginals
off, so every method trains and scores in the schema's codec (privflow/data/codec.py) and the DP
flow's whole training share goes to DP-SGD.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"

EPSILONS = (0.5, 1.0, 2.0, 5.0)
PARTITIONS = 10
FPR = 0.05
QUANTILE_SHARE = 0.1  # of each epsilon, for the DP threshold; the flow gets the rest
DELTA = 1e-5
DRAWS = 3
REPEATS = 3  # DP flow runs per epsilon (their metrics averaged)
ANOMALY_SEED = 20210602
MODEL: dict[str, Any] = {"name": "maf", "blocks": 3, "hidden": 32}
TRAIN: dict[str, Any] = {"epochs": 8, "batch_size": 512, "device": "cpu", "threads": 1, "seed": 0}
PART_TRAIN: dict[str, Any] = {**TRAIN, "batch_size": 64}
ADULT_NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
MOON_MARGIN = 0.15


@dataclass
class Task:
    """A dataset ready for the benchmark: training rows, normal test rows and anomalies."""

    name: str
    schema: Any
    train: pl.DataFrame
    test: pl.DataFrame
    anomalies: pl.DataFrame
    note: str


def _datasets() -> Any:
    from benchmarks import datasets

    return datasets


def tail_anomalies(test: pl.DataFrame, schema: Any, n: int, rng: np.random.Generator) -> pl.DataFrame:
    """DP-NF Figure 5: per column uniform in the test rows' [p5, p30] or [p70, p95] (a fair coin)."""
    cols = {}
    for col in schema.columns:
        v = test[col.name].cast(pl.Float64).to_numpy()
        p5, p30, p70, p95 = np.percentile(v, [5, 30, 70, 95])
        low = rng.random(n) < 0.5
        draw = np.where(low, rng.uniform(p5, p30, n), rng.uniform(p70, p95, n))
        lo, hi = col.bounds
        if col.type == "integer":
            cols[col.name] = pl.Series(col.name, np.clip(np.floor(draw), lo, hi).astype(np.int64))
        else:
            cols[col.name] = pl.Series(col.name, np.clip(draw, lo, hi))
    return pl.DataFrame(cols).cast(test.schema)


def moon_distance(p: np.ndarray) -> np.ndarray:
    """Distance of each point to the nearer of the two noise-free half-moon arcs."""

    def arc(c: tuple[float, float], upper: bool, ends: tuple[tuple[float, float], ...]) -> np.ndarray:
        d = p - np.asarray(c)
        on_side = d[:, 1] >= 0 if upper else d[:, 1] <= 0
        radial = np.abs(np.hypot(d[:, 0], d[:, 1]) - 1.0)
        to_ends = np.min([np.hypot(*(p - np.asarray(e)).T) for e in ends], axis=0)
        return np.where(on_side, radial, to_ends)

    upper = arc((0.0, 0.0), True, ((1.0, 0.0), (-1.0, 0.0)))
    lower = arc((1.0, 0.5), False, ((0.0, 0.5), (2.0, 0.5)))
    return np.minimum(upper, lower)


def off_manifold_anomalies(n: int, bounds: Any, rng: np.random.Generator) -> pl.DataFrame:
    """Half-moons anomalies: uniform in the public box, at least MOON_MARGIN from both arcs."""
    (x0, x1), (y0, y1) = bounds
    keep: list[np.ndarray] = []
    have = 0
    while have < n:
        p = np.column_stack([rng.uniform(x0, x1, 4 * n), rng.uniform(y0, y1, 4 * n)])
        p = p[moon_distance(p) >= MOON_MARGIN]
        keep.append(p)
        have += len(p)
    pts = np.concatenate(keep)[:n]
    return pl.DataFrame({"x": pts[:, 0], "y": pts[:, 1]})


def adult_numeric(work: Path) -> Task:
    from privflow.data.schema import Schema

    dm = _datasets()
    data = dm.load("adult", work)
    doc = data.schema.model_dump(mode="json")
    doc["columns"] = [c for c in doc["columns"] if c["name"] in ADULT_NUMERIC]
    doc["target"] = None
    doc["dataset"]["name"] = "adult-numeric"
    schema = Schema.model_validate(doc)
    train, test = data.train.select(ADULT_NUMERIC), data.test.select(ADULT_NUMERIC)
    anomalies = tail_anomalies(test, schema, test.height, np.random.default_rng(ANOMALY_SEED))
    note = "tails of the test rows: each column uniform in its [p5, p30] or [p70, p95]"
    return Task("adult-numeric", schema, train, test, anomalies, note)


def half_moons(work: Path) -> Task:
    dm = _datasets()
    data = dm.load("half-moons", work)
    anomalies = off_manifold_anomalies(data.test.height, dm.BOUNDS["half-moons"], np.random.default_rng(ANOMALY_SEED))
    note = f"uniform in the public box, at least {MOON_MARGIN} from both arcs"
    return Task("half-moons", data.schema, data.train, data.test, anomalies, note)


# ------------------------------------------------------------------------------------- methods


def _config(train: dict[str, Any], epsilon: float = 1.0) -> Any:
    from privflow.core.config import RunConfig

    return RunConfig.build(
        data=Path("benchmark"), schema_path=Path("benchmark"), model=MODEL, train=train,
        privacy={"epsilon": epsilon, "delta": DELTA}, marginals={"enabled": False},
    )  # fmt: skip


def _scores(ll: np.ndarray) -> np.ndarray:
    """Anomaly scores for ROC AUC: minus the log-likelihood (NaN and -inf: the most anomalous)."""
    return -np.nan_to_num(np.asarray(ll, dtype=np.float64), nan=-1e30, neginf=-1e30, posinf=1e30)


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def evaluate_flow(flow: Any, x: np.ndarray, y: np.ndarray, threshold: float) -> dict[str, float]:
    from privflow.tasks.select import row_loglik

    ll = row_loglik(flow, x).astype(np.float64)
    return _rates(y, ~(ll >= threshold), _scores(ll)) | {"threshold": threshold}


def _rates(y: np.ndarray, flagged: np.ndarray, score: np.ndarray) -> dict[str, float]:
    """ROC AUC of `score`; accuracy, TPR and FPR of `flagged`; and the best accuracy over all
    thresholds on `score` (the paper's setting: a threshold tuned on a labelled public set)."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(y, score)
    pos = float(np.mean(y))
    return {
        "auc": _auc(y, score),
        "accuracy": float(np.mean(flagged == y.astype(bool))),
        "tpr": float(np.mean(flagged[y == 1])),
        "fpr": float(np.mean(flagged[y == 0])),
        "best_accuracy": float(np.max(pos * tpr + (1.0 - pos) * (1.0 - fpr))),
    }


def run_task(task: Task, epsilons: tuple[float, ...], log: Any) -> dict[str, Any]:
    """Every method at every epsilon on one dataset."""
    from privflow.data.codec import Codec
    from privflow.privacy.accounting.events import PureDPEvent, RepeatedEvent
    from privflow.privacy.ledger import compose_epsilon
    from privflow.privacy.mechanisms.dp_ad import VoteAggregation, prob_anomalous, votes_out
    from privflow.privacy.mechanisms.dp_quantile import DPQuantile
    from privflow.tasks.dpad import EnsembleSettings, ensemble_loglik, train_partitions
    from privflow.tasks.fit import Spend, fit, prepare
    from privflow.tasks.select import row_loglik

    codec = Codec.from_schema(task.schema)
    rng = np.random.default_rng(ANOMALY_SEED + 1)
    x = np.concatenate([codec.encode(task.test, rng), codec.encode(task.anomalies, rng)])
    y = np.concatenate([np.zeros(task.test.height, dtype=np.int64), np.ones(task.anomalies.height, dtype=np.int64)])
    out: dict[str, Any] = {
        "dataset": task.name,
        "note": task.note,
        "train_rows": task.train.height,
        "test_rows": task.test.height,
        "anomalies": task.anomalies.height,
        "dp_flow": [],
        "dpad": [],
    }

    t0 = time.perf_counter()
    cfg = _config(TRAIN)
    _, x_train, x_val = prepare(cfg, task.schema, task.train, None, Spend())
    flow = fit(cfg, task.schema, codec, x_train, x_val, private=False).flows[0]
    tau = float(np.quantile(np.nan_to_num(row_loglik(flow, x_val), nan=-np.inf), FPR, method="inverted_cdf"))
    out["nonprivate"] = evaluate_flow(flow, x, y, tau) | {"seconds": time.perf_counter() - t0}
    log(f"{task.name}: non-private flow {out['nonprivate']}")

    for eps in epsilons:
        t0 = time.perf_counter()
        runs = []
        for _ in range(REPEATS):  # each a fresh DP run (its noise from the OS CSPRNG)
            cfg = _config(TRAIN, (1.0 - QUANTILE_SHARE) * eps)
            fitted = fit(cfg, task.schema, codec, x_train, x_val, private=True)
            quantile = DPQuantile(FPR, QUANTILE_SHARE * eps)
            flow = fitted.flows[0]
            tau = quantile.release(row_loglik(flow, x_val))
            total = compose_epsilon([*fitted.events, quantile.event()], DELTA)
            runs.append({"epsilon_total_pld": total} | evaluate_flow(flow, x, y, tau))
        row: dict[str, Any] = {"epsilon": eps} | {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        row |= {"auc_runs": [r["auc"] for r in runs], "threshold_runs": [r["threshold"] for r in runs]}
        out["dp_flow"].append(row | {"seconds": time.perf_counter() - t0})
        log(f"{task.name}: DP flow eps={eps:g} {row}")

    t0 = time.perf_counter()
    settings = EnsembleSettings(PARTITIONS, 1.0, fpr=FPR, holdout_fraction=0.2)
    salts = (secrets.randbits(63), secrets.randbits(63))
    parts = train_partitions(task.train, task.schema, _config(PART_TRAIN), settings, salts)
    votes = votes_out(ensemble_loglik(parts, x), parts.thresholds)
    majority = votes > PARTITIONS / 2
    out["dpad_noiseless"] = _rates(y, majority, votes.astype(np.float64)) | {
        "seconds": time.perf_counter() - t0,
        "part_train_rows": parts.train_rows,
    }
    log(f"{task.name}: DP-AD votes without noise {out['dpad_noiseless']}")
    for eps in epsilons:
        t0 = time.perf_counter()
        agg = VoteAggregation(PARTITIONS, eps)
        accs, aucs = [], []
        for _ in range(DRAWS):
            answers = agg.release(votes)
            accs.append(float(np.mean(answers == y.astype(bool))))
            aucs.append(_auc(y, answers.astype(np.float64)))
        p = prob_anomalous(votes, PARTITIONS, eps)
        expected_acc = float(np.mean(np.where(y == 1, p, 1.0 - p)))
        expected_bal = float(0.5 * (p[y == 1].mean() + (1.0 - p[y == 0]).mean()))
        row = {
            "epsilon_per_query": eps,
            "epsilon_100_queries_pld": compose_epsilon([RepeatedEvent(PureDPEvent(eps), 100)], DELTA),
            "accuracy": float(np.mean(accs)),
            "auc": float(np.mean(aucs)),
            "accuracy_expected": expected_acc,
            "auc_expected": expected_bal,
            "tpr": float(p[y == 1].mean()),
            "fpr": float(p[y == 0].mean()),
            "seconds": time.perf_counter() - t0,
        }
        out["dpad"].append(row)
        log(f"{task.name}: DP-AD eps/query={eps:g} {row}")
    return out


# ------------------------------------------------------------------------------------- report


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "models", "privacy", "tasks", "flows", "privflow", "benchmarks",
             ":(exclude)benchmarks/results"],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
    except OSError:
        return "unknown"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def figure(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5.2 * len(results), 7.0), squeeze=False)
    for j, r in enumerate(results):
        for i, metric in enumerate(("auc", "accuracy")):
            ax = axes[i][j]
            e1 = [row["epsilon"] for row in r["dp_flow"]]
            ax.plot(e1, [row[metric] for row in r["dp_flow"]], "o-", label="DP flow + DP threshold (total eps)")
            e2 = [row["epsilon_per_query"] for row in r["dpad"]]
            ax.plot(e2, [row[metric] for row in r["dpad"]], "s-", label=f"DP-AD, k={PARTITIONS} (eps per query)")
            ax.axhline(r["nonprivate"][metric], color="k", ls="--", lw=1, label="non-private flow")
            ax.axhline(r["dpad_noiseless"][metric], color="gray", ls=":", lw=1.5, label="DP-AD votes, no noise")
            ax.set_xscale("log")
            ax.minorticks_off()
            ax.set_xticks(e1, [f"{e:g}" for e in e1])
            ax.set_xlabel("epsilon")
            ax.set_ylabel("ROC AUC" if metric == "auc" else "accuracy")
            ax.set_title(f"{r['dataset']}: {'ROC AUC' if metric == 'auc' else 'accuracy'}")
            ax.set_ylim(0.45, 1.0)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0.0, 0.04, 1.0, 1.0))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(results: list[dict[str, Any]], command: str, wall: float, png: Path) -> str:
    lines = [
        "# Anomaly detection against epsilon",
        "",
        "DP-NF's section 5 protocol (Waites & Cummings 2021): likelihood thresholding under a DP flow against",
        "DP-AD (Algorithm 2: non-private flows on disjoint parts, a noisy vote per query) and the non-private",
        "flow. Produced by `benchmarks/bench_anomaly.py` (its docstring has the protocol and configuration).",
        "",
        f"- command: `{command}`",
        f"- commit: {git_commit()}; {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}; wall time {wall / 60:.1f} min",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPU cores, one torch thread",
        f"- model: MAF {MODEL['blocks']} blocks x {MODEL['hidden']} hidden; {TRAIN['epochs']:g} epochs, batch "
        f"{TRAIN['batch_size']} (DP-AD parts: batch {PART_TRAIN['batch_size']}); delta {DELTA:g}; target FPR {FPR:g}; "
        f"k = {PARTITIONS} parts; DP marginals off (all methods in the schema's codec); DP-AD accuracy: mean of "
        f"{DRAWS} draws of the aggregation noise",
        f"- DP flow: mean of {REPEATS} DP runs per epsilon (each run's AUC in the notes); DP-AD and the non-private",
        "  flow: one fit each. DP noise comes from the OS CSPRNG, so a rerun gives other numbers of the same size",
        "",
        "How to read the epsilons. **DP flow**: epsilon is the whole release (training at 0.9 eps plus the DP",
        "threshold at 0.1 eps, PLD-composed: `eps total`), after which every query is free. **DP-AD**: epsilon is",
        "**per answered query**; q queries compose (`eps for 100 queries`, PLD at delta 1e-5), so a DP-AD column at",
        "the same epsilon answers one query for what the DP flow pays for all of them. DP-AD's answer is one bit,",
        "so its ROC AUC is its balanced accuracy; `expected` is the closed form over the aggregation noise",
        "(`prob_anomalous`) for the same fitted parts (DP-AD's TPR / FPR are expectations too). Accuracy and",
        f"TPR / FPR are at the method's own threshold (target FPR {FPR:g}); `best accuracy` is at the threshold",
        "that maximises accuracy on these labelled test rows (the paper's setting, an oracle, not DP).",
        "",
        f"![anomaly detection against epsilon]({png.name})",
    ]
    for r in results:
        np_ = r["nonprivate"]
        nl = r["dpad_noiseless"]
        lines += [
            "",
            f"## {r['dataset']}",
            "",
            f"{r['train_rows']} training rows; {r['test_rows']} normal test rows and {r['anomalies']} anomalies "
            f"({r['note']}).",
            "",
            "| method | epsilon | ROC AUC | accuracy | TPR / FPR | best accuracy | notes |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| non-private flow | inf | {np_['auc']:.3f} | {np_['accuracy']:.3f} | {np_['tpr']:.3f} / "
            f"{np_['fpr']:.3f} | {np_['best_accuracy']:.3f} | threshold {np_['threshold']:.3g} (exact FPR-quantile "
            "of held-out rows) |",
            f"| DP-AD votes without noise | inf | {nl['auc']:.3f} | {nl['accuracy']:.3f} | {nl['tpr']:.3f} / "
            f"{nl['fpr']:.3f} | {nl['best_accuracy']:.3f} | majority of {PARTITIONS}; AUC from the vote count |",
        ]
        for row in r["dp_flow"]:
            aucs = ", ".join(f"{a:.3f}" for a in row["auc_runs"])
            taus = ", ".join(f"{t:.3g}" for t in row["threshold_runs"])
            lines.append(
                f"| DP flow + DP threshold | {row['epsilon']:g} (total {row['epsilon_total_pld']:.3f}) | "
                f"{row['auc']:.3f} | {row['accuracy']:.3f} | {row['tpr']:.3f} / {row['fpr']:.3f} | "
                f"{row['best_accuracy']:.3f} | mean of {len(row['auc_runs'])} runs: AUC {aucs}; DP thresholds {taus} |"
            )
        for row in r["dpad"]:
            lines.append(
                f"| DP-AD (Report-Noisy-Max) | {row['epsilon_per_query']:g} per query | {row['auc']:.3f} | "
                f"{row['accuracy']:.3f} | {row['tpr']:.3f} / {row['fpr']:.3f} | - | expected accuracy "
                f"{row['accuracy_expected']:.3f}; 100 queries cost eps {row['epsilon_100_queries_pld']:.1f} |"
            )
    lines += [
        "",
        "## Reading",
        "",
        "- DP-AD's accuracy is capped by its noiseless vote (parts see 1/k of the rows each) and approaches it as",
        "  epsilon per query grows: a query with margin |2 c_out - k| is answered with the majority with probability",
        "  1 - exp(-eps |2 c_out - k| / 2) / 2.",
        "- The DP flow's AUC is threshold-free; its accuracy also depends on how far the DP threshold lands from",
        "  the true FPR-quantile (one DP quantile at 0.1 eps on a 0.1-nat grid).",
        "- Privacy per query is the deciding difference: the DP flow answers unlimited queries at its epsilon;",
        "  DP-AD pays every query, so it suits few, high-stakes queries (or `--svt` when anomalies are rare).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--datasets", default="adult-numeric,half-moons")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "privflow-benchmark")
    args = parser.parse_args(argv)
    os.environ.setdefault("PRIVFLOW_HOME", str(args.work / "home"))
    from privflow.core import env

    env.configure(args.work / "home", verbose=False)
    import torch

    torch.set_num_threads(1)
    epsilons = tuple(float(e) for e in args.epsilons.split(","))
    builders = {"adult-numeric": adult_numeric, "half-moons": half_moons}
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {msg}", flush=True)

    results = []
    for name in args.datasets.split(","):
        task = builders[name](args.work)
        log(f"{name}: {task.train.height} train, {task.test.height} test, {task.anomalies.height} anomalies")
        results.append(run_task(task, epsilons, log))
    wall = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "anomaly.png"
    figure(results, png)
    given = list(argv) if argv is not None else sys.argv[1:]
    command = " ".join([".venv/bin/python -m benchmarks.bench_anomaly", *given])
    (args.out / "anomaly.md").write_text(markdown(results, command, wall, png))
    (args.out / "anomaly.json").write_text(json.dumps(results, indent=1, default=float))
    log(f"wrote {args.out / 'anomaly.md'}, {png} ({wall / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
