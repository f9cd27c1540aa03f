"""The speed figures the default test tier no longer asserts (a test cannot pass or fail by the
machine's speed): measured here, on the inputs those tests use, and written with command, commit
and machine.

- the copula codec decoding 1,000,000 rows of tests/data/test_copula.py's schema (the bound the test
  used to assert: under 2 s wall);
- strict validation of the demo tables, adult_train.csv and adult_test.csv (under 2 s of CPU);
- pre-flight on the demo in a fresh process, imports included (under 8 s of CPU);
- every case of the bad-input corpus (tests/cli/test_bad_inputs.py, ``CASES``) through ``privflow
  run`` in process: its exit status and seconds (each under 15 s), and three refusals of the
  installed console script in a fresh process (each under 10 s).

Each figure is the median of ``--rounds`` runs; CPU seconds are beside wall seconds where the
machine's other work would make wall time misleading.

    .venv/bin/python -m benchmarks.bench_test_bounds [--rounds 3] [--no-corpus] \
        [--out benchmarks/results/test_bounds.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "src" / "privflow" / "demo"
OUT = ROOT / "benchmarks" / "results" / "test_bounds.md"
PRIVFLOW = Path(sys.executable).parent / "privflow"

# the child of tests/preflight/test_preflight.py, timed: pre-flight on the demo, imports included
PREFLIGHT_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from privflow.core.config import RunConfig
from privflow.preflight import preflight
cfg = RunConfig.build(data=sys.argv[1], schema_path=sys.argv[2], store=sys.argv[3],
                      evaluate={"test_data": sys.argv[4]})
checked = preflight(cfg)
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time()}))
"""


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def median_pair(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def copula_decode(rounds: int) -> list[str]:
    import numpy as np

    from privflow.data.copula import CopulaCodec
    from tests.data.test_copula import make_schema, positive_marginals

    schema = make_schema()
    codec = CopulaCodec.from_marginals(schema, positive_marginals(schema))
    u = np.random.default_rng(0).random((1_000_000, codec.dim))
    codec.decode(u[:1000])  # warm-up
    wall, cpu = median_pair([timed(lambda: codec.decode(u)) for _ in range(rounds)])
    return [
        f"| copula decode, 1,000,000 rows (tests/data/test_copula.py's schema) | {wall:.2f} | {cpu:.2f} | 2 s wall |"
    ]


def validation(rounds: int) -> list[str]:
    from privflow.data.io import read_table
    from privflow.data.schema import Schema
    from privflow.data.validation import validate

    schema = Schema.from_yaml(DEMO / "adult.yaml")
    rows = []
    for name in ("adult_train.csv", "adult_test.csv"):
        df = read_table(DEMO / name)
        validate(df.head(50), schema)  # warm-up
        wall, cpu = median_pair([timed(lambda df=df: validate(df, schema, policy="strict")) for _ in range(rounds)])
        rows.append(f"| strict validation of {name} ({df.height:,} rows) | {wall:.2f} | {cpu:.2f} | 2 s CPU |")
    return rows


def preflight_child(rounds: int) -> list[str]:
    runs = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, "-c", PREFLIGHT_CHILD, str(DEMO / "adult_train.csv"), str(DEMO / "adult.yaml"),
                 str(Path(tmp) / "store"), str(DEMO / "adult_test.csv")],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append((out["wall"], out["cpu"]))
    wall, cpu = median_pair(runs)
    return [f"| pre-flight on the demo in a fresh process, imports included | {wall:.2f} | {cpu:.2f} | 8 s CPU |"]


def _workspace(tmp: Path, frame: object) -> dict:
    """tests/cli/test_bad_inputs.py's `ws` fixture: the first 400 demo rows, the demo schema, a store."""
    data = tmp / "adult.csv"
    frame.write_csv(data)  # type: ignore[attr-defined]
    schema = tmp / "adult.yaml"
    shutil.copy(DEMO / "adult.yaml", schema)
    return {"dir": tmp, "data": data, "schema": schema, "store": tmp / "store", "frame": frame}


def corpus(rounds: int) -> list[str]:
    """Each bad-input case through `privflow run` in process (as the test runs it), then the
    installed console script's refusals in a fresh process."""
    import polars as pl
    import pytest

    from tests.cli import test_bad_inputs as corpus_tests  # its import sets the tests' offline environment

    frame = pl.read_csv(DEMO / "adult_train.csv", infer_schema=False, n_rows=400)
    rows = []
    for name, build, status, _needles in corpus_tests.CASES:
        runs, codes = [], set()
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                ws = _workspace(Path(tmp), frame)
                try:
                    extra = build(ws)
                except pytest.skip.Exception as skipped:  # a case this machine cannot build (as the test skips it)
                    rows.append(f"| corpus case `{name}`: not run ({skipped.msg}) | - | - | 15 s wall |")
                    break
                saved = dict(os.environ)  # the CLI sets variables for its process (tests' cli_process_state)
                try:
                    wall, cpu = time.perf_counter(), time.process_time()
                    result = corpus_tests._invoke(ws, extra)
                    runs.append((time.perf_counter() - wall, time.process_time() - cpu))
                    codes.add(result.exit_code)
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
        if not runs:
            continue
        wall, cpu = median_pair(runs)
        exits = ", ".join(str(c) for c in sorted(codes)) + (
            "" if codes == {status} else f" (the test expects {status})"
        )
        rows.append(f"| corpus case `{name}`: exit {exits} | {wall:.2f} | {cpu:.2f} | 15 s wall |")
    for extra, what in [(["--epsilon", "inf"], "epsilon inf"), (["--data", "."], "a folder as --data"),
                        (["--data", "nope.csv"], "a missing data file")]:  # fmt: skip
        runs = []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                ws = _workspace(Path(tmp), frame)
                args = [str(PRIVFLOW), "run", "--data", str(ws["data"]), "--schema", str(ws["schema"]),
                        "--store", str(ws["store"]), *extra]  # fmt: skip
                t0 = time.perf_counter()
                proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp)
                runs.append((time.perf_counter() - t0, float("nan")))
        wall = statistics.median(r[0] for r in runs)
        rows.append(
            f"| installed `privflow run`, {what}: exit {proc.returncode}, fresh process | {wall:.2f} | - | 10 s wall |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-corpus", action="store_true", help="leave out the bad-input corpus (the longest part)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    lines = [
        "| what | wall s | CPU s | the bound a test used to assert |",
        "| --- | ---: | ---: | --- |",
    ]
    parts = [copula_decode, validation, preflight_child] + ([] if args.no_corpus else [corpus])
    for part in parts:
        for row in part(args.rounds):
            lines.append(row)
            print(row, flush=True)
    notes = [
        f"Medians over {args.rounds} rounds. CPU: seconds of this process (the pre-flight row: of its child); "
        "the in-process corpus cases run in this process, one after another.",
        "These bounds are no longer asserted by tests (a test cannot fail by the machine's speed): a figure "
        "past its bound here is a regression to look into, on this machine's load.",
    ]
    header = common.header("Speed figures the default test tier does not assert", started, load, notes, commit)
    common.publish("\n".join(header) + "\n" + "\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
