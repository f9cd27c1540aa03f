"""What every benchmark of this folder writes above its results: commit, command, machine, load.

Imported as ``benchmarks.bench_common`` by the bench_*.py scripts and by the sweep's results
file (benchmarks/report.py). The machine is shared by other work, so each results file of a
speed benchmark records the load average before and after its run: its rates are comparable
within one run only.
"""

from __future__ import annotations

import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CODE_PATHS = ("src", "benchmarks", "pyproject.toml")  # the code a figure depends on


def git_commit() -> str:
    """HEAD's hash, with the code files that differ from it: a figure is tied to the code that made it.
    PRIVFLOW_COMMIT, when set, names it instead: a copy of the tree on another machine (a GPU
    machine's) may carry no .git, or a stale one."""
    if os.environ.get("PRIVFLOW_COMMIT"):
        return os.environ["PRIVFLOW_COMMIT"] + " (PRIVFLOW_COMMIT: a copy of that commit's tree)"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", *CODE_PATHS, ":(exclude)benchmarks/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    dirty = [line[3:] for line in status.splitlines() if line[3:].endswith(".py") or line[3:].endswith(".toml")]
    more = f" and {len(dirty) - 8} more" if len(dirty) > 8 else ""
    return head + (f" (uncommitted changes in {', '.join(dirty[:8])}{more})" if dirty else "")


def machine() -> str:
    """Architecture, CPU model, cores and memory in words."""
    cpu, mem = platform.processor() or "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        kb = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return f"{platform.machine()}{', ' + cpu if cpu else ''}, {os.cpu_count()} CPU cores{mem}"


def load_average() -> str:
    """The 1-minute load average: how busy the shared machine was (2 cores: above 2 is contention)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def command() -> str:
    """The command line that reproduces the file, run from the repository root
    (``.venv/bin/python -m benchmarks.bench_x ...``)."""
    script = Path(sys.argv[0]).resolve()
    try:
        module = ".".join(script.relative_to(ROOT).with_suffix("").parts)
    except ValueError:
        return shlex.join([".venv/bin/python", str(script), *sys.argv[1:]])
    return shlex.join([".venv/bin/python", "-m", module, *sys.argv[1:]])


def header(title: str, started: datetime, load_before: str, notes: list[str], commit: str) -> list[str]:
    """The Markdown lines above a results table: title, command, commit, machine, load, notes.
    `commit` is `git_commit()` taken when the run started: others may commit while it runs."""
    versions = f"Python {platform.python_version()}"
    try:
        import torch

        versions += f", torch {torch.__version__}"
    except ImportError:
        pass
    minutes = (datetime.now(UTC) - started).total_seconds() / 60
    return [
        f"# {title}",
        "",
        "```bash",
        command(),
        "```",
        "",
        f"- Commit (when the run started): `{commit}`",
        f"- Date (UTC): {started:%Y-%m-%d %H:%M}; the run took {minutes:.1f} min",
        f"- Machine: {machine()}; {versions}",
        f"- Load average (1 min) before / after: {load_before} / {load_average()}. The machine is shared with "
        "other work (tests, other benchmarks): compare figures within this file, not with other runs.",
        *[f"- {n}" for n in notes],
        "",
    ]


def peak_rss_mb() -> float:
    """This process's peak resident set (MB): VmHWM from /proc, else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process, all threads (a figure less sensitive to a shared machine)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class TrainTiming:
    """The trainer's progress callbacks, timed: (step, seconds since the train phase began)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.ended = 0.0
        self.steps: list[tuple[int, float]] = []
        self.cpu = 0.0

    def wrap(self, fn: Callable[..., Any], on_step_at: int) -> Callable[..., Any]:
        """`fn` (a trainer taking on_step as its `on_step_at`-th argument or keyword), timed."""

        def run(*args: Any, **kwargs: Any) -> Any:
            args_l = list(args)
            inner = kwargs.pop("on_step", None) if len(args_l) <= on_step_at else args_l.pop(on_step_at)

            def on_step(step: int, loss: float) -> None:
                self.steps.append((step, time.perf_counter() - self.started))
                if inner is not None:
                    inner(step, loss)

            cpu0 = cpu_with_children()
            self.started = time.perf_counter()
            try:
                return fn(*args_l, on_step=on_step, **kwargs)
            finally:
                self.ended = time.perf_counter()
                self.cpu = cpu_with_children() - cpu0

        return run

    def figures(self) -> dict[str, float]:
        if len(self.steps) < 2:
            raise RuntimeError("fewer than two DP-SGD steps ran: the plan released the DP marginals alone")
        (first, t_first), (last, t_last) = self.steps[0], self.steps[-1]
        return {
            "steps": last,
            "steps_per_s": (last - first) / (t_last - t_first),
            "startup_s": t_first,
            "train_s": self.ended - self.started,
            "train_cpu_s": self.cpu,
        }


def cpu_with_children() -> float:
    """CPU seconds of this process and of its children that have been waited for (the workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def publish(text: str, out: Path | None) -> None:
    """Write a results file (its folder made if missing) when `out` is given, and print it."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    print(text)


def cuda_missing(device: str) -> bool:
    """True (after saying so) when `device` asks for CUDA that torch cannot see: a GPU benchmark
    then measures nothing and its script exits 2."""
    if not device.startswith("cuda"):
        return False
    import torch

    if torch.cuda.is_available():
        return False
    print(f"--device {device}: no CUDA device on this machine; nothing measured.")
    return True


def device_name(device: str) -> str:
    """'cpu', or 'cuda (NAME)' as torch names the GPU: for a results file's notes."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return f"cuda ({torch.cuda.get_device_name(0)})"
