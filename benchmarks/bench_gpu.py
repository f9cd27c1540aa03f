"""`privflow run` on Adult at (1, 1e-5) on a GPU against the CPU of the same machine (target:
"On a GPU (H100 class): Adult at (1, 1e-5) trained in under a minute").

For each of ``--devices`` (default ``cuda cpu``), a fresh subprocess runs the real CLI
(``privflow.cli.main``) on the bundled demo table, ``privflow run --data
src/privflow/demo/adult_train.csv --schema src/privflow/demo/adult.yaml --epsilon 1 --delta 1e-5
--test-data src/privflow/demo/adult_test.csv --device DEVICE`` with every other setting at its
default, in a new store. The child wraps the DP-SGD trainer (``tasks/train.py``'s ``train``,
looked up at call time) in ``bench_common.TrainTiming``, so besides the run's wall time it
reports the training phase's: seconds from the trainer's call to its return, DP-SGD steps and
the steady step rate (first to last step). Nothing in the package is edited.

The other two GPU figures have their own commands, run with ``--device cuda``:
``bench_dp_step.py`` (DP step against the non-private step) and ``bench_sampling.py``
(sampling rate).

    python -m benchmarks.bench_gpu [--devices cuda cpu] [--out benchmarks/results/gpu.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
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
DEMO = ROOT / "src" / "privflow" / "demo"
TARGET_TRAIN_S = 60.0


def run_args(device: str, store: Path) -> list[str]:
    """The `privflow run` arguments of one measured run."""
    return [
        "run",
        "--data",
        str(DEMO / "adult_train.csv"),
        "--schema",
        str(DEMO / "adult.yaml"),
        "--epsilon",
        "1",
        "--delta",
        "1e-5",
        "--test-data",
        str(DEMO / "adult_test.csv"),
        "--device",
        device,
        "--store",
        str(store),
        "--quiet",
    ]


def child(device: str, store: Path) -> None:
    """One run through the CLI with the trainer timed; prints one JSON line last."""
    from privflow.tasks import train as train_task

    timing = common.TrainTiming()
    train_task.train = timing.wrap(train_task.train, 3)
    from privflow import cli

    sys.argv = ["privflow", *run_args(device, store)]
    t0 = time.perf_counter()
    code: Any = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    wall = time.perf_counter() - t0
    out = {"device": device, "exit": code, "run_s": wall, **timing.figures()}
    print(json.dumps(out), flush=True)


def _device_name(device: str) -> str:
    """The device's name; for the CPU with the thread count a child's torch starts with."""
    import torch

    return common.device_name(device) + ("" if device == "cuda" else f", {torch.get_num_threads()} torch threads")


def render(rows: list[dict[str, Any]], names: dict[str, str], started: datetime, load: str, commit: str) -> str:
    """The results file: one row per device, the verdict on the one-minute target."""
    notes = [
        "Each run: `privflow run` on the bundled Adult table (32,561 rows) at epsilon 1, delta 1e-5, defaults "
        "otherwise, `--device` as in the table, a new store, in its own process (`privflow.cli.main`).",
        "Run s: the CLI call, pre-flight to registration (imports before it excluded). Train s: the DP-SGD "
        "trainer's call (data to the device, every step, checkpoints); steps/s between its first and last step.",
        "Devices: " + "; ".join(f"{d} = {n}" for d, n in names.items()) + ".",
    ]
    lines = common.header("Adult on a GPU: `privflow run` at (1, 1e-5)", started, load, notes, commit)
    lines += [
        "| device | exit | run s | train s | DP-SGD steps | steps/s | start-up to first step s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['device']} | {r['exit']} | {r['run_s']:.1f} | {r['train_s']:.1f} | {r['steps']:.0f} "
            f"| {r['steps_per_s']:.1f} | {r['startup_s']:.2f} |"
        )
    lines += ["", "## Verdict", ""]
    gpu = [r for r in rows if r["device"] == "cuda"]
    if gpu:
        ok = all(r["exit"] == 0 and r["train_s"] < TARGET_TRAIN_S for r in gpu)
        train_s = ", ".join(f"{r['train_s']:.1f}" for r in gpu)
        run_s = ", ".join(f"{r['run_s']:.1f}" for r in gpu)
        lines.append(
            f"- Adult at (1, 1e-5) trained on the GPU in under a minute: **{'met' if ok else 'not met'}** "
            f"(train phase {train_s} s; whole run {run_s} s)."
        )
    cpu = [r for r in rows if r["device"] == "cpu"]
    if gpu and cpu:
        lines.append(
            f"- Train phase on the GPU against this machine's CPU: {cpu[0]['train_s'] / gpu[0]['train_s']:.1f}x "
            "faster (one run each)."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parent: one child per device, then the Markdown file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", nargs="+", default=["cuda", "cpu"], choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=None, help="Markdown file (default: print only)")
    ap.add_argument("--child", nargs=2, metavar=("DEVICE", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    if any(common.cuda_missing(d) for d in args.devices):
        return 2
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for device in args.devices:
            store = Path(tmp) / f"store-{device}"
            res = subprocess.run(
                [sys.executable, __file__, "--child", device, str(store)], capture_output=True, text=True, cwd=tmp
            )
            if res.returncode != 0 and not res.stdout.strip():
                print(res.stdout[-4000:], res.stderr[-4000:], sep="\n", file=sys.stderr)
                raise SystemExit(f"the {device} run failed (exit {res.returncode})")
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    text = render(rows, {d: _device_name(d) for d in args.devices}, started, load, commit)
    common.publish(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
