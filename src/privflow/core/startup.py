"""Start-up and exit engineering, in one module so that it can be reviewed, measured
(benchmarks/bench_overhead.py) or removed on its own. Each measure saves seconds of a command's
fixed cost; the ones that lean on a library's or the interpreter's internals say which:

- `imports_without_gc`: the heavy imports (torch, MLflow, Great Expectations, opacus) allocate
  millions of long-lived objects; with the cyclic collector paused while they load and
  `gc.freeze()` afterwards, later collections no longer walk them (public `gc` API).
- `meanwhile`: an import the run makes later anyway, done in a thread while the process waits on
  another one (Prefect's temporary server starting).
- `use_prefect`: the one rule that sends `privflow run` and `fit` through Prefect's engine or the
  in-process pipeline (no server, the simplification that saves most).
- `start_early` / `waits`: Prefect's temporary server spawned as soon as pre-flight has passed,
  through Prefect 3.8's own per-process `SubprocessASGIServer` and its PRIVATE launch command
  (`_run_uvicorn_command`; pyproject pins prefect < 3.9). Anything unexpected falls back to
  Prefect's own start at the flow's first client; tests/flows/test_prefect_server.py checks that
  the flow runs against this server and that no second one starts.
- `FastExit` / `FAST_EXIT`: the console script ends the process once every exit handler has run,
  without the interpreter's teardown. It relies on the PRIVATE `atexit._ncallbacks()` (it arms
  only when it would be the process's first handler, so a host process keeps its normal exit;
  where the function is missing it does not arm), on `os._exit`, and on the C library's
  `fflush(NULL)` through ctypes for output C code buffered.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from privflow.core.errors import ExitStatus


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
    """Prefect's engine when asked for (`prefect`: --engine prefect) or when an operator configured
    a Prefect API (PREFECT_API_URL: a deployment's server records the run), unless the run is asked
    to stay in this process (`no_server`: --engine local); otherwise the same pipeline in this
    process, since a temporary server would only add start-up (the fixed overhead). The
    CLI's run and the Python API's `fit` decide by this one rule."""
    if prefect and no_server:
        from privflow.core.errors import ConfigError

        raise ConfigError("Prefect's engine and this process (--engine prefect and local) contradict each other.")
    return not no_server and (prefect or bool(os.environ.get("PREFECT_API_URL")))


# -- Prefect's temporary server, started early ---------------------------------------------


def _nothing() -> None:
    """Prefect starts (or reaches) its server itself."""


def waits(ready: Callable[[], None]) -> bool:
    """Whether `ready` (from `start_early`) waits for a server this process spawned: time the
    CLI can spend on imports the run needs later."""
    return ready is not _nothing


def start_early() -> Callable[[], None]:
    """Spawn Prefect's temporary server now, when Prefect would start one for a flow; return a
    function that waits until it answers (call it before the flow). A configured API
    (PREFECT_API_URL), ephemeral mode off, or a server already started: nothing to do."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    )

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return _nothing
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # port None: the instance get_client() and the event workers use
    if server.running or server.server_process is not None:
        return _nothing
    try:
        server.port = server.find_available_port()
        server.server_process = server._run_uvicorn_command()  # noqa: SLF001 - Prefect's own launch
    except Exception:  # noqa: BLE001 - leave it to Prefect's start at the flow's first client
        server.server_process = None
        return _nothing
    atexit.register(server.stop)
    timeout = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())

    def ready() -> None:
        """Wait for the server's health check (as `SubprocessASGIServer.start` does), then mark it
        running so that Prefect's clients use it; if it never answers, stop it and let Prefect
        start its own at the flow's first client (and report its error there)."""
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                process = server.server_process
                if process is None:
                    break
                if process.poll() == 3:  # the port was taken meanwhile: Prefect's own retry
                    server.port = server.find_available_port()
                    server.server_process = server._run_uvicorn_command()  # noqa: SLF001
                    continue
                if process.poll() is not None:
                    break
                try:
                    if client.get(f"{server.api_url}/health").status_code == 200:
                        server.running = True
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        server.stop()

    return ready


# -- the console script's fast exit ------------------------------------------------------------


class FastExit:
    """Skip the interpreter's teardown once every exit handler has run.

    After a run, Python frees torch, MLflow, Prefect and the rest module by module before the
    process ends, with nothing left to do. Registered first, this exit handler runs last, after
    the handlers that matter (Prefect stopping its temporary server, MLflow ending its run,
    logging's flush); non-daemon threads were joined before any of them.
    It flushes Python's and C's output buffers and ends the process with the command's status.
    The ledger and MLflow's SQLite stores commit each write when it is made, so nothing is lost.
    Armed only when no other handler was registered before it (logging's own shutdown aside,
    which it calls itself), so a host process (a test runner) keeps its normal exit.
    """

    def __init__(self) -> None:
        self.code = int(ExitStatus.INTERNAL)  # until main() learns the status

    def arm(self) -> bool:
        count = getattr(atexit, "_ncallbacks", None)
        earlier = 1 if "logging" in sys.modules else 0  # logging registers its shutdown at import
        if count is None or count() != earlier:
            return False
        atexit.register(self._exit)
        return True

    def _exit(self) -> None:
        if "logging" in sys.modules:
            import logging

            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            import ctypes

            ctypes.CDLL(None).fflush(None)  # output a C library buffered
        except (OSError, AttributeError):
            pass
        os._exit(self.code)


FAST_EXIT = FastExit()


__all__ = ["FAST_EXIT", "FastExit", "imports_without_gc", "meanwhile", "start_early", "use_prefect", "waits"]
