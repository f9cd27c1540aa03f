"""Wall-clock seconds per stage of one command, collected in one place and printed by the CLI
under `--verbose` (privflow/cli/summary.py, `print_stage_times`).

A command opens a collector (`collecting`); any code below it marks its stages with `stage(name)`
or `record(name, seconds)`, which do nothing when no collector is open (a library caller, a test).
Stage times are timings of the curator's machine, not released values: they travel in the
`RunSummary` and the console only, never into the MLflow run or any other release (the gaps
between private steps are timings of private work, privflow/tasks/release.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class StageTimes:
    """Stage name -> wall-clock seconds, in the order the stages were first seen; a stage met
    twice adds up. A name 'parent/part' is a part of the stage before it named 'parent ...'."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as `name`, listed where it starts (before the stages inside it)."""
        self.seconds.setdefault(name, 0.0)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def as_dict(self) -> dict[str, float]:
        return dict(self.seconds)


_CURRENT: ContextVar[StageTimes | None] = ContextVar("privflow_stage_times", default=None)


def current() -> StageTimes | None:
    """The open collector of this context, or None."""
    return _CURRENT.get()


@contextmanager
def collecting(times: StageTimes | None = None) -> Iterator[StageTimes]:
    """Open a collector (a new one, or `times`, to continue it) for the block and what it calls."""
    times = times if times is not None else StageTimes()
    token = _CURRENT.set(times)
    try:
        yield times
    finally:
        _CURRENT.reset(token)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block as `name` in the open collector; nothing when none is open."""
    times = _CURRENT.get()
    if times is None:
        yield
        return
    with times.stage(name):
        yield


@contextmanager
def remainder(name: str) -> Iterator[None]:
    """Time the block as `name`, less what stages inside it recorded themselves: the share of a
    step that its own marked stages (the mechanisms inside it, say) leave unexplained."""
    times = _CURRENT.get()
    if times is None:
        yield
        return
    before, t0 = sum(times.seconds.values()), time.perf_counter()
    try:
        yield
    finally:
        inside = sum(times.seconds.values()) - before
        times.add(name, max(0.0, time.perf_counter() - t0 - inside))


def record(name: str, seconds: float) -> None:
    """Add `seconds` to stage `name` in the open collector, if any."""
    times = _CURRENT.get()
    if times is not None:
        times.add(name, seconds)


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): the interpreter's and
    the first imports' share of a command, before any of its code could start a clock."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 (starttime), 0-based after the name
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


__all__ = ["StageTimes", "collecting", "current", "process_age", "record", "remainder", "stage"]
