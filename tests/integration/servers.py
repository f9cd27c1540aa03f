"""Start and stop real servers on loopback for the integration tests: PostgreSQL, an MLflow
tracking server backed by it, a Prefect server, and any helper process (worker, watcher).

Every process is started in its own session (its own process group) and stopped by its
process-group id; each also carries a marker variable in its environment, so that a
grandchild that left the group (a flow-run subprocess) is still found and stopped by pid.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

MARKER = "PRIVFLOW_IT_MARKER"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None) -> None:
    """Poll `check` every half second; fail with the process log when it never holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.popen.returncode}\n{proc.tail()}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f} s\n{proc.tail() if proc else ''}")


class Proc:
    """A subprocess in its own process group, logging to a file."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        log_dir: Path,
        env: dict[str, str],
        user: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._fh = self.log.open("wb")
        self.popen = subprocess.Popen(
            cmd, stdout=self._fh, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True, user=user
        )
        self.pgid = self.popen.pid  # a new session: the leader's pid is the group id

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Signal the process group, wait, then SIGKILL what is left of it."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pgid, signal.SIGKILL)  # stragglers of the group, if any
        except ProcessLookupError:
            pass
        if self.popen.poll() is None:
            self.popen.wait(10)
        self._fh.close()


def marked_pids(token: str) -> list[int]:
    """Live processes whose environment carries our marker (readable as root or as their owner)."""
    needle = f"{MARKER}={token}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(entry))
    return out


def kill_marked(token: str) -> list[int]:
    """SIGKILL, by pid, every process that still carries the marker; returns their pids."""
    pids = marked_pids(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


class Stack:
    """The processes of one test, stopped in reverse order of start."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = uuid.uuid4().hex
        self.procs: list[Proc] = []
        self.cleanup: list[Callable[[], None]] = []
        (root / "logs").mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "MLFLOW_TRACKING_URI"))}
        base.update({MARKER: self.token, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
        base.update(extra)
        return base

    def start(self, name: str, cmd: list[str], env: dict[str, str], **kw: object) -> Proc:
        proc = Proc(name, cmd, self.root / "logs", env, **kw)  # type: ignore[arg-type]
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            sig = signal.SIGINT if proc.name == "postgres" else signal.SIGTERM  # SIGINT: fast shutdown
            proc.stop(sig)
        kill_marked(self.token)
        for fn in reversed(self.cleanup):
            fn()


# -- PostgreSQL ------------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """Folder with initdb and postgres: on PATH, else the Debian layout."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(folder, "initdb").exists() and Path(folder, "postgres").exists():
            return Path(folder)
    return None


def start_postgres(stack: Stack, timeout: float = 120.0) -> str:
    """initdb into a fresh folder and run postgres in the foreground on a free loopback port.

    PostgreSQL refuses to run as root: as root, the cluster belongs to and runs as `nobody`
    (in a folder under /tmp that `nobody` owns). Returns a SQLAlchemy URL of database `mlflow`.
    """
    bindir = postgres_bin()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL server binaries (initdb, postgres) are not installed")
    user = None
    base = Path(tempfile.mkdtemp(prefix="privflow-pg-"))
    stack.cleanup.append(lambda: shutil.rmtree(base, ignore_errors=True))
    if os.geteuid() == 0:
        user = "nobody"
        pw = pwd.getpwnam(user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    data = base / "data"
    env = stack.env(LC_ALL="C", LANG="C")
    init = subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "privflow",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ],
        env=env,
        user=user,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=base,
    )
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
    port = free_port()
    proc = stack.start(
        "postgres",
        [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            str(base),
            "-F",
            "-c",
            "max_connections=50",
        ],
        env,
        user=user,
        cwd=base,
    )
    import psycopg2

    def connect() -> bool:
        psycopg2.connect(host="127.0.0.1", port=port, user="privflow", dbname="postgres", connect_timeout=2).close()
        return True

    wait_until(connect, timeout, "postgres accepting connections", proc)
    con = psycopg2.connect(host="127.0.0.1", port=port, user="privflow", dbname="postgres")
    con.autocommit = True
    with con.cursor() as cur:
        cur.execute("CREATE DATABASE mlflow")
    con.close()
    return f"postgresql+psycopg2://privflow@127.0.0.1:{port}/mlflow"  # SQLAlchemy 2.1 defaults to psycopg 3


# -- MLflow and Prefect servers --------------------------------------------------------------


def start_mlflow(stack: Stack, backend: str, artifacts: Path) -> tuple[str, Proc]:
    port = free_port()
    artifacts.mkdir(parents=True, exist_ok=True)
    proc = stack.start(
        "mlflow",
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            backend,
            "--artifacts-destination",
            str(artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stack.env(MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_ENABLE_TELEMETRY="false"),
        cwd=stack.root,
    )
    return f"http://127.0.0.1:{port}", proc


def mlflow_up(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=2).status_code == 200


def start_prefect(stack: Stack, home: Path) -> tuple[str, Proc]:
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    env = stack.env(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5",
    )
    proc = stack.start(
        "prefect-server",
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
        cwd=stack.root,
    )
    return f"http://127.0.0.1:{port}/api", proc


def prefect_up(api: str) -> bool:
    r = httpx.get(f"{api}/health", timeout=2)
    return r.status_code == 200 and r.json() is True
