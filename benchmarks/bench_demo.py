"""`privflow demo` end to end, stage by stage: the whole run on the bundled Adult table at
epsilon 1 (validation gate, DP marginals and head, DP statistics, DP training, Report-Noisy-Max,
the curator-only diagnostics with figures and HTML report, MLflow logging and registration,
the synthetic table), target < 60 s on this machine when idle.

Each run is the real console script, ``privflow demo --verbose --store <fresh folder>``, in its
own process; the parent times it end to end (exit included) and reads the stage table the CLI
prints under --verbose (privflow/core/timing.py). ``--modes`` runs each one with the curator-only
diagnostics' worker process (``worker``: PRIVFLOW_DIAGNOSTICS_WORKER=1) and without it (``no-worker``:
PRIVFLOW_DIAGNOSTICS_WORKER=0, everything in one process), alternating, so that both meet the
same load; the load average is recorded before each run.

    .venv/bin/python -m benchmarks.bench_demo [--runs 2] [--modes worker,no-worker] \
        [--out benchmarks/results/demo_time.md]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PRIVFLOW = ROOT / ".venv" / "bin" / "privflow"
TARGET_S = 60.0
MODES = {"worker": {"PRIVFLOW_DIAGNOSTICS_WORKER": "1"}, "no-worker": {"PRIVFLOW_DIAGNOSTICS_WORKER": "0"}}

_ROW = re.compile(r"^[│|]\s(.+?)\s+[│|]\s+([0-9.]+)\s[│|]$")


def stage_table(stdout: str) -> dict[str, float]:
    """The rows of the 'stage times (wall clock)' table the CLI printed (a part indented by two spaces)."""
    start = stdout.rfind("stage times (wall clock)")
    if start < 0:
        return {}
    stages: dict[str, float] = {}
    for line in stdout[start:].splitlines():
        m = _ROW.match(line.rstrip())
        if m:
            stages[m.group(1).rstrip()] = float(m.group(2))
    return stages


def one_run(mode: str, work: Path, index: int) -> dict:
    """One `privflow demo --verbose` in a fresh store: its stage table, wall time, load before."""
    store = work / f"demo-{mode}-{index}"
    shutil.rmtree(store, ignore_errors=True)
    env = {**os.environ, "COLUMNS": "160", **MODES[mode]}
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    done = subprocess.run(
        [str(PRIVFLOW), "demo", "--verbose", "--store", str(store)], capture_output=True, text=True, env=env
    )
    wall = time.monotonic() - t0
    shutil.rmtree(store, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(
            f"privflow demo ({mode}) exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return {"mode": mode, "wall": wall, "load": load, "stages": stage_table(done.stdout)}


def report(runs: list[dict], modes: list[str], started: datetime, load_before: str, commit: str) -> str:
    notes = [
        f"Target: the whole demo in under {TARGET_S:.0f} s on this machine when idle (1-minute load average "
        "below 1 before a run; each run is one process at a time, so its own load is about 1).",
        "`worker` (the default): PRIVFLOW_DIAGNOSTICS_WORKER=1 (the curator-only diagnostics share the "
        "utility classifiers with a second process, "
        "which trains the real-data reference while DP-SGD trains); `no-worker`: PRIVFLOW_DIAGNOSTICS_WORKER=0, "
        "everything in one process. The modes alternate, so both meet the same load.",
        "Stage times are the table `privflow demo --verbose` prints (privflow/core/timing.py); an indented row is "
        "a part of the row above it, and the real-data reference row ran in the worker while DP-SGD trained "
        "(not on the run's critical path). Wall time is the parent's clock around the whole process.",
    ]
    lines = common.header("privflow demo end to end, by stage", started, load_before, notes, commit)
    cols = [f"{r['mode']} #{i + 1}" for i, r in enumerate(runs)]
    lines += ["| stage | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]
    names: list[str] = []
    for r in runs:
        names += [n for n in r["stages"] if n not in names]
    for name in names:
        label = f"&nbsp;&nbsp;{name.strip()}" if name.startswith("  ") else name
        cells = [f"{r['stages'][name]:.2f}" if name in r["stages"] else "" for r in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| **wall time (parent's clock, s)** | " + " | ".join(f"**{r['wall']:.1f}**" for r in runs) + " |")
    lines.append("| load average before (1 min) | " + " | ".join(f"{r['load']:.2f}" for r in runs) + " |")
    lines += [
        "",
        "| mode | runs | wall time median (s) | min | max | under 60 s |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for mode in modes:
        walls = [r["wall"] for r in runs if r["mode"] == mode]
        if walls:
            ok = "yes" if max(walls) < TARGET_S else ("median" if statistics.median(walls) < TARGET_S else "no")
            lines.append(
                f"| {mode} | {len(walls)} | {statistics.median(walls):.1f} | {min(walls):.1f} | "
                f"{max(walls):.1f} | {ok} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per mode")
    parser.add_argument("--modes", default="worker,no-worker", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "demo_time.md")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    started, load_before, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        for i in range(args.runs):
            for mode in modes:
                run = one_run(mode, Path(tmp), i)
                print(f"{mode} #{i + 1}: {run['wall']:.1f} s (load before {run['load']:.2f})", file=sys.stderr)
                runs.append(run)
    common.publish(report(runs, modes, started, load_before, commit), args.out)


if __name__ == "__main__":
    main()
