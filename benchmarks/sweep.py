"""The benchmark sweep: datasets x models x epsilon x seeds, one Prefect task per cell, run in
parallel on a task runner, written to a Markdown results file beside the papers' figures.

Run from the repository root (benchmarks/ is a package of the checkout, not of the installed
privflow):

    python -m benchmarks.sweep --datasets adult,pinwheel --models dphflow,maf,dpmog \
        --epsilons 1,inf --seeds 0,1,2
    python -m benchmarks.sweep --preset peers   # -> benchmarks/results/peers.md

- datasets: adult (published train/test), german (seeded 70/30 split), and DP-NF's 2-D
  densities pinwheel, half-moons, 8-gaussians (benchmarks/datasets.py);
- models: see benchmarks/cells.py (the flows, DP-NF's DP-MoG baseline, privflow's
  ablations and the peers MST and AIM, benchmarks/peers);
- epsilon: any positive values at delta = 1e-5, and ``inf`` (non-private: same data split,
  shapes, steps and selection rule, with no clipping and no noise);
- presets (benchmarks/presets.py): ``peers``, ``stability``, ``ceiling``, each with its own
  results file and target set.

Task runners: local processes by default (Prefect's ProcessPoolTaskRunner), a local Dask
cluster of processes with ``--task-runner dask``, and an existing Dask cluster when
``--dask-address`` or the environment variable PRIVFLOW_DASK_ADDRESS is set (its workers must
import ``benchmarks``: run them from the repository root, or with it on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from privflow.core import env as _env

if __name__ == "__main__":  # offline, quiet settings before prefect is imported
    _env.configure()

from prefect import flow  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.task_runners import ProcessPoolTaskRunner  # noqa: E402

from benchmarks.cells import MODELS, PEERS, WORK_DIR, Cell, build_cells, cell_task, cost, parse_epsilon  # noqa: E402
from benchmarks.peers import driver as peers  # noqa: E402
from benchmarks.presets import DEFAULT_SWEEP, PRESETS, RESULTS, TARGET_SETS, default_out  # noqa: E402
from benchmarks.report import default_command, write_results  # noqa: E402


def make_task_runner(
    kind: Literal["process", "dask"] = "process", dask_address: str | None = None, workers: int = 2
) -> Any:
    """ProcessPoolTaskRunner (local processes), a local Dask cluster of processes, or the
    Dask cluster at `dask_address` / $PRIVFLOW_DASK_ADDRESS when one is configured (the
    sweep's cells then run on that cluster's workers, whatever `kind`)."""
    if kind not in ("process", "dask"):  # checked first: a configured cluster must not hide a typo
        raise ValueError(f"task_runner must be 'process' or 'dask', got {kind!r}")
    address = dask_address or os.environ.get("PRIVFLOW_DASK_ADDRESS")
    if address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=address)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(
            cluster_class="distributed.LocalCluster",
            cluster_kwargs={
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "host": "127.0.0.1",
                "dashboard_address": None,
            },
        )
    return ProcessPoolTaskRunner(max_workers=workers)


@contextmanager
def _workers_report_here() -> Iterator[None]:
    """Worker processes started inside this block inherit PREFECT_API_URL = this flow's API
    (the temporary local server included), so they report their task runs to it instead of
    each starting a temporary server of its own. Restored on exit."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    with get_client(sync_client=True) as client:
        url = str(client.api_url).rstrip("/")
    os.environ["PREFECT_API_URL"] = url
    try:
        yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)


@flow(name="privflow-benchmark")
def benchmark(
    datasets: Sequence[str],
    models: Sequence[str],
    epsilons: Sequence[float | None],
    seeds: Sequence[int],
    out: str | Path = RESULTS / "sweep.md",
    task_runner: Literal["process", "dask"] = "process",
    dask_address: str | None = None,
    quick: bool = False,
    workers: int = 2,
    command: str | None = None,
    work_dir: str | None = None,
    target_set: str = "papers",
) -> list[dict[str, Any]]:
    """Run every cell as a Prefect task on the chosen runner and write the results file."""
    cells = sorted(build_cells(datasets, models, epsilons, seeds), key=cost, reverse=True)
    if target_set not in TARGET_SETS:
        raise ValueError(f"unknown target set '{target_set}'; choose from {sorted(TARGET_SETS)}")
    if any(c.model in PEERS for c in cells):
        peers.ensure_peers_venv(install=True)  # builds .venv-peers once, or names the command
    started = time.perf_counter()
    runner = make_task_runner(task_runner, dask_address, workers)
    wd = work_dir or str(WORK_DIR)
    with _workers_report_here(), runner:
        futures = [runner.submit(cell_task, {"cell": asdict(c), "quick": quick, "work_dir": wd}) for c in cells]
        records = [f.result() for f in futures]
    wall = time.perf_counter() - started
    runner_name = (
        f"dask@{dask_address or os.environ.get('PRIVFLOW_DASK_ADDRESS')}"
        if (dask_address or os.environ.get("PRIVFLOW_DASK_ADDRESS"))
        else f"{task_runner} x{workers}"
    )
    write_results(
        records,
        Path(out),
        command or default_command(datasets, models, epsilons, seeds, quick),
        wall,
        runner_name,
        quick,
        target_set,
    )
    return records


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep from the command line: explicit options, else the preset's, else the defaults."""
    values = dict(DEFAULT_SWEEP)
    values.update(PRESETS[args.preset] if args.preset else {})
    values.update({k: v for k, v in vars(args).items() if k in values and v is not None})
    items = {
        k: [x.strip() for x in values[k].split(",") if x.strip()] for k in ("datasets", "models", "epsilons", "seeds")
    }
    return {
        "datasets": items["datasets"],
        "models": items["models"],
        "epsilons": [parse_epsilon(e) for e in items["epsilons"]],
        "seeds": [int(x) for x in items["seeds"]],
        "targets": values["targets"],
    }


def parser() -> argparse.ArgumentParser:
    """The command line (`python -m benchmarks.sweep --help`)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a named comparison (its own results file)")
    p.add_argument("--datasets", default=None, help="default: adult,pinwheel,half-moons,8-gaussians")
    p.add_argument("--models", default=None, help=f"default: dphflow,maf,dpmog; any of {','.join(MODELS)}")
    p.add_argument("--epsilons", default=None, help="comma-separated; 'inf' = non-private (default 0.5,1,2,5,inf)")
    p.add_argument("--seeds", default=None, help="default 0,1,2")
    p.add_argument("--out", default=None, help="default: benchmarks/results/sweep.md or results/<preset>.md")
    p.add_argument("--task-runner", choices=("process", "dask"), default="process")
    p.add_argument("--dask-address", default=None, help="an existing Dask scheduler (else $PRIVFLOW_DASK_ADDRESS)")
    p.add_argument("--workers", type=int, default=2, help="local worker processes")
    p.add_argument("--quick", action="store_true", help="tiny data and steps (a smoke test, not a result)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _env.configure()
    picked = resolve(args)
    out = Path(args.out) if args.out else default_out(args.preset, args.quick)
    records = benchmark(
        datasets=picked["datasets"],
        models=picked["models"],
        epsilons=picked["epsilons"],
        seeds=picked["seeds"],
        out=out,
        task_runner=args.task_runner,
        dask_address=args.dask_address,
        quick=args.quick,
        workers=args.workers,
        command="python -m benchmarks.sweep "
        + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        target_set=picked["targets"],
    )
    bad = [r for r in records if r.get("status") != "ok"]
    print(f"{len(records) - len(bad)}/{len(records)} cells ok; results in {out}")
    for r in bad:
        print(f"FAILED {Cell(r['dataset'], r['model'], r['epsilon'], r['seed']).label}: {r.get('error')}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
