"""How long CI and the two test tiers take on a fresh clone: `.ci/run` step by step (the venv and
installs, ruff, mypy, import-linter, the README's test command), then optionally the slow tier.

The clone is of HEAD (committed work only), in a temporary folder, so nothing of this checkout's
caches (bytecode, numba's kernels, mypy's cache) helps. `.ci/run` runs under ``bash -x`` with a
timestamp in the trace prompt; each top-level command's time is the gap to the next one. The
targets: the default tier's pytest under 5 minutes and `.ci/run` under 8 minutes in all.

With `--repeat K --load N`, `.ci/run` runs K times in a row, each on its own fresh clone, while N
CPU-bound processes (`while 1: pass`) compete for the cores: the default tier must pass every
time on a loaded machine (no test may depend on speed).

    .venv/bin/python -m benchmarks.bench_tests [--slow] [--out benchmarks/results/test_tiers.md]
    .venv/bin/python -m benchmarks.bench_tests --repeat 3 --load 2 --out benchmarks/results/ci_under_load.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYTEST_TARGET_S = 300.0
CI_TARGET_S = 480.0
_TRACE = re.compile(r"^\+ (\d+\.\d+) (.*)$")  # a top-level command of `bash -x` with PS4='+ $EPOCHREALTIME '
_SUMMARY = re.compile(r"^=*\s*(.*\b(?:passed|failed|error)\b.*) in ([0-9.]+)s")


def step_times(trace: str, end: float) -> list[tuple[str, float]]:
    """(command, seconds) of each top-level command in a `bash -x` trace whose prompt carries the
    epoch time; the last command runs until `end`."""
    starts = [(float(m.group(1)), m.group(2)) for m in map(_TRACE.match, trace.splitlines()) if m]
    bounds = [t for t, _ in starts[1:]] + [end]
    return [(cmd, stop - t) for (t, cmd), stop in zip(starts, bounds[: len(starts)], strict=True)]


def pytest_summary(output: str) -> tuple[str, float] | None:
    """pytest's closing line ('1516 passed, 12 skipped ...') and the seconds it reports."""
    for line in reversed(output.splitlines()):
        m = _SUMMARY.match(line.strip())
        if m:
            return m.group(1).strip(" ="), float(m.group(2))
    return None


def slowest(output: str) -> list[str]:
    """The 'slowest N durations' lines pytest printed."""
    lines = output.splitlines()
    try:
        first = next(i for i, line in enumerate(lines) if "slowest" in line and "durations" in line)
    except StopIteration:
        return []
    return [line for line in lines[first + 1 :] if re.match(r"^[0-9.]+s ", line)]


def failures(output: str) -> list[str]:
    """pytest's FAILED and ERROR lines of its short summary (-ra)."""
    return [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`processes` busy loops on this machine for the block, ended with it however it ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(processes)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def ci_once(env: dict[str, str]) -> tuple[int, str, str, float, float]:
    """`.ci/run` under `bash -x` on a fresh clone of HEAD: (exit, stdout, trace, seconds, end time)."""
    with tempfile.TemporaryDirectory(prefix="privflow-ci-") as tmp:
        clone = Path(tmp) / "privflow"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        code, out, trace, total = _run(["bash", "-x", ".ci/run"], clone, env)
        return code, out, trace, total, time.time()


def repeated(args: argparse.Namespace, env: dict[str, str]) -> None:
    """`.ci/run` `args.repeat` times in a row under `args.load` busy loops, into one results file."""
    commit, load_before, started_at = common.git_commit(), common.load_average(), datetime.now(UTC)
    rows = []
    failed: list[str] = []
    with cpu_load(args.load):
        for i in range(args.repeat):
            print(f"running .ci/run {i + 1}/{args.repeat} under {args.load} busy loops ...", flush=True)
            code, out, _, total, _ = ci_once(env)
            summary = pytest_summary(out)
            said = f"{summary[0]} in {summary[1]:.1f} s" if summary else "no pytest summary line"
            rows.append(f"| {i + 1} | {code} | {total:.0f} | {said} |")
            failed += [f"run {i + 1}: {line}" for line in failures(out)]
            if code != 0 and not failures(out):
                failed += [f"run {i + 1}: " + line for line in out.splitlines()[-5:]]
    notes = [
        f"`.ci/run` {args.repeat} times in a row, each on a fresh `git clone` of HEAD, while {args.load} "
        "CPU-bound processes (`python -c 'while 1: pass'`) ran on the same machine."
    ]
    lines = [
        *common.header("CI on a loaded machine, several times in a row", started_at, load_before, notes, commit),
        "| run | exit | seconds | default tier |",
        "| ---: | ---: | ---: | --- |",
        *rows,
        "",
    ]
    if failed:
        lines += ["Failures:", "", "```", *failed, "```", ""]
    common.publish("\n".join(lines) + "\n", args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", action="store_true", help="also run the slow tier (pytest -n 2 -m slow)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "test_tiers.md")
    parser.add_argument("--repeat", type=int, default=0, help="run .ci/run this many times in a row (fresh clones)")
    parser.add_argument("--load", type=int, default=0, help="busy loops competing for the cores meanwhile")
    args = parser.parse_args()
    if args.repeat:
        env = {**os.environ}
        env.pop("VIRTUAL_ENV", None)
        repeated(args, env)
        return
    commit, load_before, started_at = common.git_commit(), common.load_average(), datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="privflow-ci-") as tmp:
        clone = Path(tmp) / "privflow"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        # bash takes no PS4 from the environment when run as root: it is set by a startup file
        startup = Path(tmp) / "trace-prompt.sh"
        startup.write_text("PS4='+ $EPOCHREALTIME '\n")
        env = {**os.environ, "BASH_ENV": str(startup)}
        env.pop("VIRTUAL_ENV", None)
        print("running .ci/run on a fresh clone ...", flush=True)
        code, out, trace, total = _run(["bash", "-x", ".ci/run"], clone, env)
        steps = step_times(trace, time.time())
        summary = pytest_summary(out)
        slow = None
        if args.slow and code == 0:
            print("running the slow tier ...", flush=True)
            slow = _run([str(clone / ".venv/bin/python"), "-m", "pytest", "-n", "2", "-m", "slow"], clone, env)
    notes = ["A fresh `git clone` of HEAD in a temporary folder; `.ci/run` under `bash -x`, timed per command."]
    lines = [
        *common.header("CI and the test tiers on a fresh clone", started_at, load_before, notes, commit),
        f"`.ci/run`: exit {code}, **{total:.0f} s** in all (target < {CI_TARGET_S:.0f} s: "
        f"{'met' if code == 0 and total < CI_TARGET_S else 'not met'}).",
        "",
        "| step | seconds |",
        "| --- | ---: |",
        *[f"| `{cmd[:90]}` | {seconds:.1f} |" for cmd, seconds in steps if seconds >= 0.5],
        "",
    ]
    if summary is not None:
        met = "met" if code == 0 and summary[1] < PYTEST_TARGET_S else "not met"
        lines += [
            f"Default tier: {summary[0]} in **{summary[1]:.1f} s** (target < {PYTEST_TARGET_S:.0f} s: {met}).",
            "",
        ]
    lines += ["Slowest tests of the default tier:", "", "```", *slowest(out), "```", ""]
    if code != 0:
        lines += ["`.ci/run` failed; the end of its output:", "", "```", *(out + trace).splitlines()[-40:], "```", ""]
    if slow is not None:
        slow_summary = pytest_summary(slow[1])
        said = f"{slow_summary[0]} in {slow_summary[1]:.1f} s" if slow_summary else "no summary line"
        lines += [f"Slow tier (`pytest -n 2 -m slow`): exit {slow[0]}, {said}.", ""]
        failed = failures(slow[1])
        if failed:
            lines += ["Its failures:", "", "```", *failed, "```", ""]
    common.publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
