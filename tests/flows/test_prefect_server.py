"""Prefect's temporary server started early (privflow/core/startup.py, `start_early`): it is the one server the
process uses (a flow then runs against it and Prefect starts no second one), it is stopped at
exit, and it is left alone when an API is configured.

Each case runs in a fresh interpreter with its own PREFECT_HOME, as a CLI call does (the test
session's own Prefect harness would otherwise answer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EARLY = """
    import json, sys
    import psutil
    from privflow.core import env

    env.configure(sys.argv[1])
    from prefect.server.api.server import SubprocessASGIServer

    from privflow.core.startup import start_early

    ready = start_early()
    server = SubprocessASGIServer()
    spawned = server.server_process is not None and not server.running
    ready()

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    @flow(name="early-server-check")
    def check() -> str:
        return str(flow_run.id)

    run_id = check()
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state_name
        api = str(client.api_url)
    servers = [p for p in psutil.Process().children(recursive=True) if "uvicorn" in " ".join(p.cmdline())]
    print(json.dumps({"spawned": spawned, "running": server.running, "api": api, "server": server.api_url,
                      "state": state, "servers": len(servers), "pid": servers[0].pid if servers else None}))
"""


def _python(tmp_path: Path, body: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PRIVFLOW_", "MLFLOW_"))}
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=400, env={**clean, **env}
    )


def test_the_early_server_is_the_one_the_flow_uses_and_it_stops_at_exit(tmp_path: Path) -> None:
    import psutil

    done = _python(tmp_path, EARLY, str(tmp_path / "home"))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["spawned"] and out["running"]
    assert out["api"].rstrip("/") == out["server"].rstrip("/")
    assert out["state"] == "Completed"
    assert out["servers"] == 1  # Prefect started no second server
    assert not psutil.pid_exists(out["pid"]) or psutil.Process(out["pid"]).status() == psutil.STATUS_ZOMBIE


def test_nothing_starts_when_an_api_is_configured(tmp_path: Path) -> None:
    body = """
        import sys
        from privflow.core import env

        env.configure(sys.argv[1])
        from prefect.server.api.server import SubprocessASGIServer

        from privflow.core.startup import start_early

        ready = start_early()
        ready()
        print(SubprocessASGIServer().server_process is None and not SubprocessASGIServer().running)
    """
    done = _python(tmp_path, body, str(tmp_path / "home"), PREFECT_API_URL="http://127.0.0.1:9/api")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"
