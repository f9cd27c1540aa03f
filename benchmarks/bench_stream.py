"""Peak memory and time of `privflow run`, the table read whole against streamed.

For each size the bundled Adult training table is replicated with the fixed-seed perturbation
of ``bench_scaling.py`` (public seed, public bounds and categories only) and written as Parquet
(strings for categories, 64-bit integers); the schema's expected_rows is the size. Then the
real CLI runs twice on it, each in a fresh process: `--no-stream` (the table read whole) and
`--stream` (read in chunks of `stream.chunk_rows`, the encoded rows on disk; tasks/stream.py).
Same configuration: epsilon 1, delta 1e-8, 1 epoch (`--epochs`), the default model, in process (no Prefect
server), the synthetic table of 100,000 rows, the diagnostics limited to fidelity (the utility
classifiers' cost grows with the table and is not what this measures).

Peak RSS is the run's own high-water mark (``os.wait4`` on the child: VmHWM of the process);
CPU counts every thread of it. Each run's ledger epsilon is reported, to show the two modes
spend the same. A control cell runs the smallest table streamed once more with the target
head's expected batch at its cap (`head.batch_size`), which the larger tables reach on their
own: the one per-step buffer that grows with expected_rows.

    .venv/bin/python -m benchmarks.bench_stream [--sizes 32000 320000 3200000] [--out benchmarks/results/stream.md]
    # 32M rows streamed, as many DP-SGD steps as one epoch of 3.2M (what grows is the table, not the steps):
    .venv/bin/python -m benchmarks.bench_stream --sizes 32000000 --epochs 0.1 --modes streamed \
        --out benchmarks/results/stream_32m.md
    # 3.2M rows streamed once the selection split is capped (select.max_validation_rows):
    .venv/bin/python -m benchmarks.bench_stream --sizes 3200000 --modes streamed \
        --out benchmarks/results/stream_select_cap.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import yaml

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402
from benchmarks import bench_scaling as scaling  # noqa: E402
from benchmarks import datasets  # noqa: E402
from privflow.privacy.mechanisms.dp_head import BATCH_DIVISOR, head_shape  # noqa: E402
from privflow.privacy.mechanisms.dp_head import MAX_BATCH as HEAD_CAP  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "stream.md"
DELTA = 1e-8
SYNTHETIC_ROWS = 100_000
CAPPED = "streamed, head batch at its cap"


def write_table(rows: int, folder: Path) -> tuple[Path, Path]:
    """The replicated table as Parquet and its schema with expected_rows = rows."""
    data = datasets.load("adult", folder)
    table = scaling.replicate(data.train, data.schema, rows)
    table = table.with_columns(pl.col(c.name).cast(pl.String) for c in data.schema.columns if c.is_categorical)
    path = folder / f"adult-{rows}.parquet"
    table.write_parquet(path, row_group_size=131_072)
    doc = yaml.safe_load((ROOT / "src" / "privflow" / "demo" / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = rows
    schema = folder / f"adult-{rows}.yaml"
    schema.write_text(yaml.safe_dump(doc))
    return path, schema


def write_table_apart(rows: int, folder: Path) -> tuple[Path, Path]:
    """`write_table` in a child process, so that this one stays small: a child's high-water mark
    (os.wait4's ru_maxrss) starts from its parent's, which it shares until it execs (Linux
    carries the old memory's high-water mark over an exec). Replicating 3.2M rows here would
    add that replication's memory to every later cell's figure."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks import bench_stream as b; "
    code += "from pathlib import Path; "
    code += "b.write_table(int(sys.argv[2]), Path(sys.argv[3]))"
    subprocess.run([sys.executable, "-c", code, str(ROOT), str(rows), str(folder)], check=True)
    return folder / f"adult-{rows}.parquet", folder / f"adult-{rows}.yaml"


def head_batch(rows: int) -> float:
    """The target head's expected batch at `rows` expected rows (its `batch_size: auto`)."""
    from privflow.core.config import HeadConfig

    return head_shape(rows, HeadConfig().steps).sample_rate * rows


def run_once(data: Path, schema: Path, stream: bool, store: Path, config: Path) -> dict[str, Any]:
    """One `privflow run` in a fresh process: wall and CPU seconds, peak RSS, exit code, epsilon."""
    cmd = [
        str(Path(sys.executable).parent / "privflow"),
        "run",
        "--data",
        str(data),
        "--schema",
        str(schema),
        "--epsilon",
        "1",
        "--delta",
        str(DELTA),
        "--config",
        str(config),
        "--store",
        str(store),
        "--promote",
        "always",
        "--quiet",
        "--engine",
        "local",
        "--stream" if stream else "--no-stream",
    ]
    # every cell composes its own epsilons, as a first run does (not from an earlier cell's cache)
    env = os.environ | {"PRIVFLOW_ACCOUNTING_CACHE": "off"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = proc.stdout.read() if proc.stdout is not None else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    epsilon = None
    for line in out.splitlines():
        if "epsilon (PLD, reported)" in line:
            epsilon = line.split("│")[2].strip().split()[0]
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024.0,
        "code": code,
        "epsilon": epsilon,
        "tail": "\n".join(out.splitlines()[-5:]) if code else "",
    }


def render(results: list[dict[str, Any]], started: datetime, load: str, commit: str, chunk: int, epochs: float) -> str:
    notes = [
        "Adult training table replicated with bench_scaling.py's fixed-seed perturbation, written as Parquet "
        "(categories as strings, integers as Int64); `expected_rows` = the size.",
        f"`privflow run --epsilon 1 --delta {DELTA:g} --engine local --promote always --quiet`, {epochs:g} epoch(s), "
        f"default model, synthetic table of {SYNTHETIC_ROWS:,} rows, diagnostics: fidelity only; `--no-stream` reads "
        f"the table whole, `--stream` in chunks of {chunk:,} rows with the encoded rows on disk (tasks/stream.py).",
        "Peak RSS: the run process's high-water mark (os.wait4; the tables are written by another process, so the "
        "figure is not raised by the parent's memory, which a child inherits until it execs). CPU: all its threads. "
        "One fresh process per cell, with the composed-epsilon cache off (`PRIVFLOW_ACCOUNTING_CACHE=off`): each cell "
        "composes its epsilons as a first run does.",
    ]
    lines = common.header("privflow run: table read whole against streamed", started, load, notes, commit)
    lines += [
        "| rows | mode | wall s | CPU s | peak RSS MB | epsilon (ledger) | exit |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']:,} | {r['mode']} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['peak_mb']:.0f} | "
            f"{r['epsilon'] or '-'} | {r['code']} |"
        )
    lines += ["", "## Verdict", ""]
    for mode in ("whole", "streamed"):
        rows = [r for r in results if r["mode"] == mode and r["code"] == 0]
        if len(rows) >= 2:
            steps = ", ".join(
                f"{b['peak_mb'] - a['peak_mb']:+.0f} MB from {a['rows']:,} to {b['rows']:,} rows"
                for a, b in zip(rows, rows[1:], strict=False)
            )
            first, last = rows[0], rows[-1]
            lines.append(
                f"- {mode}: peak RSS {first['peak_mb']:.0f} MB at {first['rows']:,} rows, {last['peak_mb']:.0f} MB "
                f"at {last['rows']:,} (x{last['peak_mb'] / first['peak_mb']:.2f}; {steps})."
            )
    capped = [r for r in results if r["mode"] == CAPPED and r["code"] == 0]
    auto = [r for r in results if r["mode"] == "streamed" and capped and r["rows"] == capped[0]["rows"]]
    if capped and auto:
        r, a = capped[0], auto[0]
        lines.append(
            f"- The target head's expected batch grows with expected_rows up to its cap of {HEAD_CAP:,} "
            f"(privacy/mechanisms/dp_head.py; {head_batch(r['rows']):,.0f} at {r['rows']:,} rows, the cap from "
            f"{HEAD_CAP * BATCH_DIVISOR:,} rows), the flow's is fixed: streamed at {r['rows']:,} rows with the head's "
            f"batch set to the cap, the peak is {r['peak_mb']:.0f} MB against {a['peak_mb']:.0f} MB with its own batch."
        )
    failed = [r for r in results if r["code"] != 0]
    for r in failed:
        lines.append(f"- {r['mode']} at {r['rows']:,} rows exited {r['code']}: {r['tail']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32_000, 320_000, 3_200_000])
    ap.add_argument("--chunk-rows", type=int, default=None, help="stream.chunk_rows (default: the configuration's)")
    ap.add_argument("--epochs", type=float, default=1.0, help="train.epochs (default 1)")
    ap.add_argument(
        "--modes", nargs="+", choices=["whole", "streamed"], default=["whole", "streamed"], help="which modes run"
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="privflow-stream-") as tmp:
        folder = Path(tmp)
        config, capped_config = folder / "config.yaml", folder / "capped.yaml"
        settings = {
            "train": {"epochs": args.epochs},
            "stream": {} if args.chunk_rows is None else {"chunk_rows": args.chunk_rows},
            "evaluate": {
                "synthetic_rows": SYNTHETIC_ROWS,
                "utility": False,
                "likelihood": False,
                "privacy_risk": False,
                "report": False,
            },
        }
        config.write_text(yaml.safe_dump(settings))
        capped_config.write_text(yaml.safe_dump(settings | {"head": {"batch_size": HEAD_CAP}}))
        for rows in args.sizes:
            data, schema = write_table_apart(rows, folder)
            for stream in [mode == "streamed" for mode in args.modes]:
                r = run_once(data, schema, stream, folder / f"store-{rows}-{stream}", config)
                r |= {"rows": rows, "mode": "streamed" if stream else "whole"}
                print(
                    f"{rows:>9,} {r['mode']:>8}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU, "
                    f"{r['peak_mb']:.0f} MB peak, epsilon {r['epsilon']}, exit {r['code']}",
                    flush=True,
                )
                results.append(r)
            if rows == min(args.sizes) and head_batch(rows) < HEAD_CAP and "streamed" in args.modes:
                # the control: the smallest table with the head's batch at the cap the larger ones reach
                r = run_once(data, schema, True, folder / f"store-{rows}-capped", capped_config)
                r |= {"rows": rows, "mode": CAPPED}
                print(f"{rows:>9,} {CAPPED}: {r['peak_mb']:.0f} MB peak, exit {r['code']}", flush=True)
                results.append(r)
            data.unlink()
    from privflow.core.config import StreamConfig

    chunk = args.chunk_rows if args.chunk_rows is not None else StreamConfig().chunk_rows
    text = render(results, started, load, commit, chunk, args.epochs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
