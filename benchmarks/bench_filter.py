"""The budget's two figures side by side: the PLD composition of a dataset's runs and the
Rényi-DP privacy filter's bound, valid when runs are chosen adaptively (privacy/ledger/filter.py),
with basic composition for scale, and what a next run can ask for under both.

Stores of k identical runs: one Gaussian mechanism calibrated to epsilon per run, and the demo's
own plan (`privflow demo`'s configuration and schema at epsilon 1). Functions of mechanism
parameters only: no data is read.

    .venv/bin/python -m benchmarks.bench_filter [--out benchmarks/results/adaptive_filter.md]
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402
from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon  # noqa: E402
from privflow.privacy.accounting.events import Event, GaussianEvent  # noqa: E402
from privflow.privacy.ledger import compose_epsilon, headroom_epsilon  # noqa: E402
from privflow.privacy.ledger.filter import adaptive_epsilon  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DELTA = 1e-5


def demo_events(epsilon: float) -> list[Event]:
    """The events `privflow demo` plans at `epsilon` (its schema and configuration, no row read)."""
    from privflow.core.config import RunConfig
    from privflow.data.schema import Schema
    from privflow.tasks.run_plan import plan_privacy

    demo = ROOT / "src" / "privflow" / "demo"
    config = RunConfig.model_validate(
        {"data": demo / "adult_train.csv", "schema_path": demo / "adult.yaml", "privacy": {"epsilon": epsilon}}
    )
    return list(plan_privacy(config, Schema.from_yaml(demo / "adult.yaml")).events)  # the plain function: no Prefect


def rows(name: str, run: list[Event], counts: tuple[int, ...], alone: float) -> list[str]:
    out = []
    for k in counts:
        runs = [run] * k
        flat = [e for r in runs for e in r]
        pld, adaptive = compose_epsilon(flat, DELTA), adaptive_epsilon(runs, DELTA)
        out.append(f"| {name} | {k} | {pld:.4f} | {adaptive:.4f} | {k * alone:.4f} | {adaptive / pld:.3f} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "adaptive_filter.md")
    args = parser.parse_args()
    commit, load_before, started = common.git_commit(), common.load_average(), datetime.now(UTC)
    table = [
        "| store | runs | PLD | adaptive bound | basic composition | adaptive / PLD |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for eps in (0.5, 1.0):
        gauss = [GaussianEvent(gaussian_noise_for_epsilon(eps, DELTA))]
        table += rows(f"Gaussian at epsilon {eps:g}", gauss, (1, 2, 3, 5, 10), eps)
    demo = demo_events(1.0)
    table += rows("the demo's plan at epsilon 1", demo, (1, 2, 3), compose_epsilon(demo, DELTA))
    head = [
        "| budget | runs already (Gaussian at 1) | next run can ask for (both figures) |",
        "| ---: | ---: | ---: |",
    ]
    one = [GaussianEvent(gaussian_noise_for_epsilon(1.0, DELTA))]
    for budget, k in ((1.0, 0), (1.1, 0), (1.5, 1), (2.0, 1), (3.0, 2), (10.0, 5)):
        head.append(f"| {budget:g} | {k} | {headroom_epsilon(one * k, budget, DELTA):.4f} |")
    notes = [
        f"delta = {DELTA:g} (the budget's); the adaptive bound: 20 Rényi orders, a union bound over them at "
        "delta/2, (epsilon, delta) events' deltas capped at delta/4, a dataset's first run alone by its own PLD "
        "at delta/4 (docs/privacy.md, Adaptivity).",
        "Basic composition: the runs' epsilons summed (each at the full delta, so its delta is k * delta: shown for "
        "scale only).",
    ]
    lines = [
        *common.header("Budgets: PLD beside the adaptive (Rényi filter) bound", started, load_before, notes, commit),
        *table,
        "",
        "What a next run can ask for (`headroom_epsilon`, the figure `ledger show` prints):",
        "",
        *head,
        "",
    ]
    common.publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
