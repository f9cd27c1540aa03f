"""A folder watcher: one `privflow.data.arrived` Prefect event per new data file.

    python -m privflow.flows.watch FOLDER [--state FILE] [--interval 10] [--settle 5] [--once]

It polls the folder (no extra dependency), and for each CSV/Parquet file it has not yet
announced emits, with `prefect.events.emit_event`, the event

    privflow.data.arrived   resource: {prefect.resource.id: <absolute path>,
                                       prefect.resource.name: <file name>,
                                       privflow.folder: <absolute folder>}

that the retraining deployment's trigger turns into a flow run with the path as its
`data_path` parameter (infra/deployments.py). It never emits twice for the same file: the
state file records (path, SHA-256) of every announced file, written atomically after the
events were handed to the server, and the event id is derived from (path, SHA-256), so a
repeat after a crash between the two is dropped by the server's event de-duplication.
A file whose content changes under the same name is new data and is announced again.
A file still being written (modified less than `settle` seconds ago), hidden files and
`*.tmp`/`*.part` files wait for a later scan. The watcher reads file bytes to hash them and
never parses rows.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

EVENT = "privflow.data.arrived"
FOLDER_LABEL = "privflow.folder"
SUFFIXES = (".csv", ".parquet", ".pq")
_NAMESPACE = uuid.UUID("6f1d3c52-7d0e-4c1b-9a63-2f4e8e5b9a10")


@dataclass(frozen=True)
class Arrival:
    """A file announced by one scan, with the id of the event that announced it."""

    path: Path
    sha256: str
    event_id: uuid.UUID


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def event_id(path: Path, sha256: str) -> uuid.UUID:
    """Deterministic per (path, content): a re-sent event is recognised by the server."""
    return uuid.uuid5(_NAMESPACE, f"{path}\0{sha256}")


def default_state(folder: Path) -> Path:
    return folder / ".privflow-watch.json"


def load_state(path: Path) -> dict[str, dict[str, str]]:
    """{absolute path: {sha256, event_id, emitted_at}}; empty when the file does not exist yet."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text() or "{}")
    return dict(data.get("emitted", {}))


def save_state(path: Path, emitted: dict[str, dict[str, str]]) -> None:
    """Atomic replace: a crash leaves the old or the new state, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"emitted": emitted}, indent=1, sort_keys=True))
    os.replace(tmp, path)


@contextmanager
def _locked(state: Path) -> Iterator[None]:
    """One scanner at a time per state file (two watchers on one folder emit nothing twice)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    with open(state.with_name(state.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def candidates(folder: Path, settle: float, now: float | None = None) -> list[Path]:
    """Data files in the folder (not recursive) that have not been modified for `settle` seconds."""
    now = time.time() if now is None else now
    out = []
    for p in sorted(folder.iterdir()):
        name = p.name
        if name.startswith(".") or name.endswith((".tmp", ".part")) or p.suffix.lower() not in SUFFIXES:
            continue
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if p.is_file() and st.st_size > 0 and now - st.st_mtime >= settle:
            out.append(p.resolve())
    return out


def _api_ready() -> None:
    """Fail early (nothing recorded) when no Prefect API answers: the next scan tries again."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        error = client.api_healthcheck()
    if error is not None:
        raise ConnectionError(f"The Prefect API is not reachable ({error}); no event was emitted.")


def scan_once(folder: str | Path, state: str | Path | None = None, settle: float = 5.0) -> list[Arrival]:
    """Emit one event per new or changed file; returns what was announced."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise NotADirectoryError(f"Watched folder '{folder}' does not exist.")
    state_path = Path(state).expanduser().resolve() if state is not None else default_state(folder)
    with _locked(state_path):
        emitted = load_state(state_path)
        todo = []
        for path in candidates(folder, settle):
            digest = _sha256(path)
            if emitted.get(str(path), {}).get("sha256") != digest:
                todo.append(Arrival(path, digest, event_id(path, digest)))
        if not todo:
            return []
        _api_ready()
        for a in todo:
            sent = emit_event(
                event=EVENT,
                resource={
                    "prefect.resource.id": str(a.path),
                    "prefect.resource.name": a.path.name,
                    FOLDER_LABEL: str(folder),
                },
                payload={"sha256": a.sha256, "bytes": a.path.stat().st_size},
                id=a.event_id,
            )
            if sent is None:
                raise RuntimeError("prefect.events.emit_event did not emit (is PREFECT_API_URL set?)")
        EventsWorker.drain_all(timeout=60)  # handed to the server before the state says so
        now = datetime.now(UTC).isoformat(timespec="seconds")
        for a in todo:
            emitted[str(a.path)] = {"sha256": a.sha256, "event_id": str(a.event_id), "emitted_at": now}
        save_state(state_path, emitted)
    return todo


def watch(folder: str | Path, state: str | Path | None = None, interval: float = 10.0, settle: float = 5.0) -> None:
    """Poll forever; a scan that fails (server down) is retried at the next interval."""
    while True:
        try:
            for a in scan_once(folder, state, settle):
                print(f"announced {a.path} ({EVENT}, event {a.event_id})", flush=True)
        except (ConnectionError, OSError, RuntimeError) as exc:
            print(f"scan failed, retrying in {interval:g} s: {exc}", file=sys.stderr, flush=True)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m privflow.flows.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="folder where new data files land")
    parser.add_argument("--state", type=Path, default=None, help="state file (default FOLDER/.privflow-watch.json)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between scans")
    parser.add_argument("--settle", type=float, default=5.0, help="skip files modified less than this many seconds ago")
    parser.add_argument("--once", action="store_true", help="scan once and exit")
    args = parser.parse_args(argv)
    from privflow.core import env

    env.configure()
    if args.once:
        for a in scan_once(args.folder, args.state, args.settle):
            print(f"announced {a.path} ({EVENT}, event {a.event_id})", flush=True)
        return 0
    watch(args.folder, args.state, args.interval, args.settle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
