"""Prefect's temporary server, started while the CLI imports the flow stack (issue 15).

With no PREFECT_API_URL, Prefect 3.8 starts a temporary server (a uvicorn subprocess on
loopback with SQLite under PREFECT_HOME) when a flow first asks for a client, and waits for
it: 6-13 s of a run's start here, most of it the subprocess importing and starting the server
app. Nothing in the CLI process needs it until the flow starts, so `start_early` spawns the
same subprocess, through Prefect's own per-process `SubprocessASGIServer` (the instance every
Prefect client of this process then uses), as soon as pre-flight has passed, and the CLI
imports torch, MLflow and the pipeline on the other core meanwhile; `ready()` then waits
for its health check exactly as Prefect's `start()` does. Anything unexpected falls back to
Prefect's own start at the flow's first client.

Uses `SubprocessASGIServer`'s port search and launch command (`_run_uvicorn_command`), which
are Prefect 3.8's (pyproject pins prefect < 3.9); `tests/flows/test_prefect_server.py` checks
that a flow then runs against this server and that no second one starts.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable

__all__ = ["start_early", "waits"]


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
