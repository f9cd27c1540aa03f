"""A second process for the curator-only diagnostics, so that they use the core that training
(one torch thread, `train.threads`) and the steps around it leave idle.

The pipeline (flows/pipeline.py) opens one `DiagnosticsWorker` for a run whose diagnostics train
the utility classifiers. It hands the worker what needs no trained model (the classifiers trained
on the real rows, the utility's reference) as soon as the rows are encoded, so that it runs while
DP-SGD trains; afterwards `utility.classify` shares the classifiers trained on the synthetic table
between the worker and this process. The results are the same records, computed by the same
code with the same seeds, only elsewhere.

Privacy: nothing here is released. The worker is a fresh interpreter (spawn: it inherits no
memory and no RNG state of this one); the rows reach it through a pipe and nothing of it is
written anywhere. It computes diagnostics only (for the curator, never released), and any failure in it
is answered by computing the same records here (a failure there also fails here and becomes
the diagnostics' curator-only note). A run that stops ends the worker at once.

On by default where there are two cores; `PRIVFLOW_DIAGNOSTICS_WORKER=0` keeps everything in this
process (benchmarks/bench_demo.py measures both in one sitting).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

_POLL_S = 0.2  # how often a wait checks that the worker is still alive


def enabled() -> bool:
    """Whether runs may use a worker: there are two cores to share, and
    `PRIVFLOW_DIAGNOSTICS_WORKER` does not turn it off (0, false, no, off)."""
    if os.environ.get("PRIVFLOW_DIAGNOSTICS_WORKER", "1").strip().lower() in {"0", "false", "no", "off"}:
        return False
    return (os.cpu_count() or 1) >= 2


def _serve(jobs: Any, results: Any, filters: list[Any]) -> None:
    """The worker's loop: run each job (a module-level function and its arguments) and send back
    (job id, ok, value or error text, seconds), until the parent ends it (`close`). Ctrl-C is the
    parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # typeshed has warnings.filters as a read-only Sequence; it is the module's list
    cast(list[Any], warnings.filters)[:] = filters  # the parent's (quiet unless --verbose)
    while True:
        job_id, fn, args = jobs.get()
        t0 = time.perf_counter()
        try:
            out: tuple[bool, Any] = (True, fn(*args))
        except Exception as exc:  # noqa: BLE001 - sent back; the parent computes it itself
            out = (False, f"{type(exc).__name__}: {exc}")
        results.put((job_id, *out, time.perf_counter() - t0))


@dataclass
class Job:
    """A job handed to the worker; `key` says what it computes, for `DiagnosticsWorker.take`."""

    worker: DiagnosticsWorker
    job_id: int
    key: tuple[Any, ...] | None
    seconds: float | None = None  # the worker's time on it, once done

    def result(self) -> tuple[bool, Any]:
        """(True, value), or (False, why) when it failed or the worker is gone: wait for it."""
        return self.worker._wait(self.job_id, self)  # noqa: SLF001 - the worker's own bookkeeping


@dataclass
class DiagnosticsWorker:
    """One spawned process running jobs in order (`submit`); `take` finds a job by its key."""

    process: Any = None
    jobs: Any = None
    results: Any = None
    pending: list[Job] = field(default_factory=list)
    done: dict[int, tuple[bool, Any, float]] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def start(self) -> DiagnosticsWorker:
        ctx = multiprocessing.get_context("spawn")
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(
            target=_serve,
            args=(self.jobs, self.results, list(warnings.filters)),
            name="privflow-diagnostics",
            daemon=True,
        )
        self.process.start()
        return self

    def submit(self, fn: Callable[..., Any], *args: Any, key: tuple[Any, ...] | None = None) -> Job:
        """Queue `fn(*args)` (a module-level function: it is sent by name) and return at once."""
        job = Job(self, next(self.ids), key)
        self.jobs.put((job.job_id, fn, args))
        if key is not None:
            self.pending.append(job)
        return job

    def take(self, key: tuple[Any, ...]) -> Job | None:
        """The queued job submitted with `key` (data frames compared by identity, other parts by
        equality), removed from the pending ones; None when there is none."""
        for job in self.pending:
            if job.key is not None and _same(job.key, key):
                self.pending.remove(job)
                return job
        return None

    def _wait(self, job_id: int, job: Job) -> tuple[bool, Any]:
        while job_id not in self.done:
            try:
                got_id, ok, value, seconds = self.results.get(timeout=_POLL_S)
            except queue.Empty:
                if self.process is None or not self.process.is_alive():
                    return False, "the diagnostics worker stopped"
                continue
            except (EOFError, OSError) as exc:
                return False, f"the diagnostics worker stopped ({type(exc).__name__})"
            self.done[got_id] = (ok, value, seconds)
        ok, value, job.seconds = self.done.pop(job_id)
        return ok, value

    def close(self) -> None:
        """End the worker at once: whatever it still has queued has no reader any more, and its
        interpreter's teardown is not worth waiting for."""
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=2.0)
        for q in (self.jobs, self.results):
            q.cancel_join_thread()  # never block this process's exit on a pipe nobody reads
            q.close()
        self.process = None


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is y:
            continue
        if hasattr(x, "shape") or hasattr(y, "shape"):  # frames and arrays: the very same object only
            return False
        try:
            if not bool(x == y):
                return False
        except Exception:  # noqa: BLE001 - not comparable: not the same
            return False
    return True


_CURRENT: ContextVar[DiagnosticsWorker | None] = ContextVar("privflow_diagnostics_worker", default=None)


def current() -> DiagnosticsWorker | None:
    """The worker open in this context, or None (then everything runs in this process)."""
    return _CURRENT.get()


@contextmanager
def diagnostics_worker(wanted: bool = True) -> Iterator[DiagnosticsWorker | None]:
    """A worker for the block (None when not `wanted` or not `enabled()`), ended when the block
    ends, however it ends."""
    if not (wanted and enabled()):
        yield None
        return
    try:
        worker = DiagnosticsWorker().start()
    except (OSError, ValueError, RuntimeError):  # no process to be had: everything runs here
        yield None
        return
    token = _CURRENT.set(worker)
    try:
        yield worker
    finally:
        _CURRENT.reset(token)
        worker.close()


__all__ = ["DiagnosticsWorker", "Job", "current", "diagnostics_worker", "enabled"]
