"""Data-parallel DP-SGD (`privflow run --workers N`) against one process on Adult.

Each run is one benchmark cell of ``benchmarks/cells.py`` (Adult, DP-HFlow, epsilon 1, the
benchmark's configuration and its evaluation: the pipeline's ``prepare`` + ``fit``, the test
NLL, and the nine classifiers trained on the synthetic table and scored on the real test
split), with ``train.workers`` set to 1 or N; nothing else differs. The cells run in one
process, in the order 1, N, N, 1, ... over the seeds (so slow drift in the shared machine's
load falls on both sides), and each reports:

- DP-SGD's steady step rate: steps per second between the first and the last step the
  trainer reports (wrappers this script puts around ``tasks/train.py``'s ``train`` and
  ``train_data_parallel`` time the progress callback); the train phase's wall time, the
  start-up before its first step (for N processes: torchrun, the workers' imports and the
  rows' hand-over), and its CPU seconds (this process and its waited children);
- the privacy spent (PLD epsilon of the recorded events: the same plan for every N);
- utility, not differentially private, for the comparison only: held-out NLL (nats per row of
  the DP-marginals copula space, ``nll_copula``, or of the schema codec, ``nll``), macro-F1,
  AUROC and AP of the nine classifiers, marginal TV.

With DP noise drawn afresh in every run, two runs never give the same model; the spread
between seeds at one N is the yardstick for "within noise". To separate the implementation
from that noise, one more pair trains the first seed's DP-SGD stage alone (same DP marginals,
DP statistics and plan) with the trainer's TEST-ONLY ``noise_seed`` fixed, in 1 and in N
processes: the same coins and the same noise, so the two differ by float summation order
only; it reports the weights' largest difference and the held-out (selection split) mean
log-likelihood of the last checkpoint of each. That pair is a diagnostic of this script,
never a release.

    .venv/bin/python -m benchmarks.bench_workers [--workers 2] [--seeds 0 1] [--quick] \
        [--out benchmarks/results/workers.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATASET, MODEL, EPSILON = "adult", "dphflow", 1.0
UTILITY = ("nll_copula", "nll", "macro_f1", "auroc", "ap", "tv_mean")
SAME_NOISE_SEED = 20261124  # test-only noise seed of the diagnostic pair (module docstring)


def run_cell(bench: Any, data: Any, seed: int, workers: int, quick: bool) -> dict[str, Any]:
    """One benchmark cell with train.workers = `workers`: its record plus the timing figures."""
    from privflow.tasks import train as train_task

    original = (bench.run_config, train_task.train, train_task.train_data_parallel)
    timing = common.TrainTiming()

    def with_workers(*args: Any, **kwargs: Any) -> Any:
        cfg = original[0](*args, **kwargs)
        train = {"workers": workers} | ({"min_effective_batch": 0.0} if quick else {})  # quick: train the tiny table
        return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})

    bench.run_config = with_workers
    train_task.train = timing.wrap(original[1], 3)
    train_task.train_data_parallel = timing.wrap(original[2], 3)
    try:
        t0 = time.perf_counter()
        record = bench.cell_body(bench.Cell(DATASET, MODEL, EPSILON, seed), data, quick)
        record["cell_s"] = time.perf_counter() - t0
    finally:
        bench.run_config, train_task.train, train_task.train_data_parallel = original
    record.update(timing.figures(), workers=workers, seed=seed)
    return record


def same_noise_pair(bench: Any, data: Any, seed: int, workers: int, quick: bool) -> dict[str, float]:
    """The first seed's DP-SGD stage in 1 and in `workers` processes with one fixed test-only
    noise seed (module docstring): weight difference and held-out log-likelihood of each."""
    import copy
    from dataclasses import replace

    import numpy as np
    import torch

    from privflow.privacy.dpsgd.distributed import train_data_parallel
    from privflow.privacy.dpsgd.dp_sgd import train
    from privflow.tasks.fit import Spend, initial_model, initialise, model_factory, prepare
    from privflow.tasks.run_plan import run_plan
    from privflow.tasks.select import loglik_matrix
    from privflow.tasks.train import settings_for

    cfg = bench.run_config(data, bench.Cell(DATASET, MODEL, EPSILON, seed), quick)
    if quick:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"min_effective_batch": 0.0})})
    plan = run_plan(cfg, data.schema)
    spend = Spend()
    codec, x_train, x_val = prepare(cfg, data.schema, data.train, plan, spend)
    model = initial_model(cfg, codec)
    initialise(model, cfg, plan, x_train, spend)
    settings = replace(settings_for(cfg.train, plan.stage("train")), noise_seed=SAME_NOISE_SEED)
    rows = torch.as_tensor(x_train, dtype=torch.float32)
    one = train(copy.deepcopy(model), rows, settings)
    many = train_data_parallel(copy.deepcopy(model), rows, replace(settings, workers=workers))
    cpu0 = (
        common.cpu_with_children()
    )  # what starting N workers costs: a 1-step run, minus nothing (its one step is noise)
    train_data_parallel(copy.deepcopy(model), rows, replace(settings, workers=workers, steps=1))
    startup_cpu = common.cpu_with_children() - cpu0
    a, b = one.checkpoints[-1][1], many.checkpoints[-1][1]
    ll = loglik_matrix(model_factory(cfg, codec), [a, b], x_val)
    lo, hi = cfg.select.score_low, cfg.select.score_high
    mean = np.clip(np.nan_to_num(ll, nan=lo, neginf=lo, posinf=hi), lo, hi).mean(axis=1)
    return {
        "steps": one.steps,
        "max_weight_diff": max(float((a[k].double() - b[k].double()).abs().max()) for k in a),
        "max_weight": max(float(a[k].double().abs().max()) for k in a),
        "loglik_one": float(mean[0]),
        "loglik_many": float(mean[1]),
        "startup_cpu_s": startup_cpu,
    }


def _mean(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def render(
    records: list[dict[str, Any]], pair: dict[str, float], workers: int, started: datetime, load: str, commit: str
) -> str:
    """The results file: provenance, one row per run, then N against 1."""
    notes = [
        f"Cells: {DATASET}, {MODEL}, epsilon {EPSILON:g} at delta {records[0].get('delta', '1e-5')}, the benchmark's "
        "configuration (benchmarks/cells.py `run_config`), torch 1 thread per process; only `train.workers` differs.",
        "What the step rate means here: this machine has 2 CPU cores shared with other agents' tests and "
        "benchmarks (see the load), so the wall-clock ratio below mostly measures contention for the cores. "
        "N processes of 1 thread each can at best be N times one process when N cores are free, less the work "
        "every rank repeats at every step (the coins over the whole table, the optimizer and EMA updates, the "
        "all-reduce, the per-call overhead of a small model on a share of the batch): the CPU-per-step row "
        "measures that cost, independently of the load. On a machine with N free cores (or N GPUs) the "
        "wall-clock ratio is the one to read.",
    ]
    lines = common.header(f"Data-parallel DP-SGD: {workers} processes against 1", started, load, notes, commit)
    cols = ["workers", "seed", "steps", "steps/s", "start-up s", "train s", "train CPU s", "epsilon", "chosen step"]
    cols += list(UTILITY)
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        row = [
            str(r["workers"]),
            str(r["seed"]),
            str(r["steps"]),
            f"{r['steps_per_s']:.2f}",
            f"{r['startup_s']:.1f}",
            f"{r['train_s']:.1f}",
            f"{r['train_cpu_s']:.1f}",
            f"{r['epsilon_spent']:.4f}",
            f"{r.get('chosen_step', '-')} ({r.get('release', '?')})",
            *[f"{r[k]:.3f}" if k in r else "-" for k in UTILITY],
        ]
        lines.append("| " + " | ".join(row) + " |")
    by = {w: [r for r in records if r["workers"] == w] for w in (1, workers)}

    def cpu_ms(r: dict[str, Any]) -> float:
        """CPU per step: the train phase's CPU less (for N processes) a 1-step run's, per step."""
        return 1000 * (r["train_cpu_s"] - (pair["startup_cpu_s"] if r["workers"] > 1 else 0.0)) / r["steps"]

    rate = {w: statistics.mean(r["steps_per_s"] for r in rs) for w, rs in by.items()}
    eps = {round(r["epsilon_spent"], 9) for r in records}
    lines += [
        "",
        f"## {workers} processes against 1 (mean ± sample std over the seeds)",
        "",
        f"| | 1 process | {workers} processes |",
        "|---|---|---|",
        f"| steady DP-SGD steps/s | {_mean([r['steps_per_s'] for r in by[1]])} | "
        f"{_mean([r['steps_per_s'] for r in by[workers]])} |",
        f"| start-up before the first step, s | {_mean([r['startup_s'] for r in by[1]])} | "
        f"{_mean([r['startup_s'] for r in by[workers]])} |",
        f"| train phase wall, s | {_mean([r['train_s'] for r in by[1]])} | "
        f"{_mean([r['train_s'] for r in by[workers]])} |",
        f"| CPU ms per step, all processes, start-up excluded | {_mean([cpu_ms(r) for r in by[1]])} | "
        f"{_mean([cpu_ms(r) for r in by[workers]])} |",
    ]
    for k in UTILITY:
        if all(k in r for r in records):
            lines.append(f"| {k} | {_mean([r[k] for r in by[1]])} | {_mean([r[k] for r in by[workers]])} |")
    lines += [
        "",
        f"- Step rate ratio, {workers} processes / 1: **{rate[workers] / rate[1]:.2f}x** (steady state, wall clock "
        "under the load above).",
        f"- Start-up CPU of {workers} workers (torchrun, imports, the rows' hand-over; a 1-step run): "
        f"{pair['startup_cpu_s']:.1f} s. CPU per step is less sensitive to the shared machine's load than wall "
        f"time: where {workers} cores are free, the step rate of {workers} processes is at most {workers} x 1000 / "
        "(their CPU ms per step) steps/s.",
        f"- Epsilon spent: {'the same for every run' if len(eps) == 1 else 'DIFFERENT between runs'} "
        f"({', '.join(f'{e:.4f}' for e in sorted(eps))}): one PoissonGaussianEvent of the same plan whatever N.",
        "- Utility: DP noise is drawn afresh in every run, so compare the gap between the columns with the "
        "spread between seeds within a column.",
        "",
        f"## The same noise in 1 and {workers} processes (seed {records[0]['seed']}, DP-SGD stage only)",
        "",
        f"The trainer's test-only noise seed fixed: same coins, same noise. Over {pair['steps']} Adam steps the "
        f"weights of the last checkpoint differ by at most {pair['max_weight_diff']:.2g} (largest weight "
        f"{pair['max_weight']:.3g}; float summation order, amplified by Adam's normalisation); held-out mean "
        f"log-likelihood (selection split, clipped as selection clips it): {pair['loglik_one']:.4f} nats/row in "
        f"1 process, {pair['loglik_many']:.4f} in {workers}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--quick", action="store_true", help="tiny data and steps (a smoke test, not a result)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "workers.md")
    args = parser.parse_args(argv)

    from privflow.core import env

    env.configure(Path(tempfile.gettempdir()) / "privflow-bench-workers", verbose=False)
    import torch

    from benchmarks import cells as bench

    torch.set_num_threads(1)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    data = bench.load_dataset(DATASET, args.quick, str(bench.WORK_DIR))
    order = [(s, w) for i, s in enumerate(args.seeds) for w in ((1, args.workers) if i % 2 == 0 else (args.workers, 1))]
    records = []
    for seed, workers in order:
        record = run_cell(bench, data, seed, workers, args.quick)
        record["delta"] = bench.DELTA
        print(
            f"seed {seed} workers {workers}: {record['steps_per_s']:.2f} steps/s, "
            f"start-up {record['startup_s']:.1f} s, "
            f"eps {record['epsilon_spent']:.4f}, macro-F1 {record.get('macro_f1', float('nan')):.3f}",
            flush=True,
        )
        records.append(record)
    pair = same_noise_pair(bench, data, args.seeds[0], args.workers, args.quick)
    print(f"same noise: max weight difference {pair['max_weight_diff']:.2g}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(records, pair, args.workers, started, load, commit))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
