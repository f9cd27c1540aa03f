"""Start-up without the cyclic garbage collector: heavy imports built once per process.

Importing torch, MLflow, Great Expectations and opacus allocates millions of objects that
live as long as the process. With the collector on, every full collection on the way walks
all of them again: about 1.2 s of `privflow run`'s start on the 2-core machine
(benchmarks/bench_overhead.py, issue 15). `imports_without_gc` pauses collection while such
work runs, then `gc.freeze()` moves what it built out of every later collection's way;
reference counting still frees everything as usual, and collection resumes for the work.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """No cyclic collection inside the block; afterwards, what exists is frozen and the
    collector is back as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def meanwhile(work: Callable[[], object]) -> Iterator[None]:
    """Run `work` in a thread while the block waits on something outside this process (Prefect's
    temporary server starting in its own), and wait for it at the end. For imports the run makes
    later anyway: a failure is dropped here and raised where the run imports for real."""

    def run() -> None:
        try:
            work()
        except Exception:  # noqa: BLE001, S110 - the real import reports it, in its place
            pass

    thread = threading.Thread(target=run, name="privflow-warm-imports", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def use_prefect(prefect: bool, no_server: bool) -> bool:
    """Prefect's engine when asked for (--prefect) or when an operator configured a Prefect API
    (PREFECT_API_URL: a deployment's server records the run); otherwise the same pipeline in this
    process, since a temporary server would only add start-up (issue 15: fixed overhead). The
    CLI's run and the Python API's `fit` decide by this one rule."""
    if prefect and no_server:
        from privflow.errors import ConfigError

        raise ConfigError(
            "--prefect and --no-server (or PRIVFLOW_PREFECT and PRIVFLOW_NO_SERVER) contradict each other; "
            "give at most one."
        )
    return not no_server and (prefect or bool(os.environ.get("PREFECT_API_URL")))


__all__ = ["imports_without_gc", "meanwhile", "use_prefect"]
