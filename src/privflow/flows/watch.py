"""A folder watcher: one `privflow.data.arrived` Prefect event per new data file.

    python -m privflow.flows.watch FOLDER [--state FILE] [--store DIR] [--interval 10] [--settle 5] [--once]

It polls the folder (no extra dependency), and for each CSV/Parquet file it has not yet
announced emits, with `prefect.events.emit_event`, the event

    privflow.data.arrived   resource: {prefect.resource.id: <absolute path>,
                                       prefect.resource.name: <file name>,
                                       privflow.folder: <absolute folder>}
                            payload:  {fingerprint: <keyed HMAC of the file's bytes>}

that the retraining deployment's trigger turns into a flow run with the path as its
`data_path` parameter (infra/deployments.py). The file is private: the event carries no
unkeyed hash of it and no size (anyone holding every row but one could hash each guess for the
last, and a size counts rows), only its keyed fingerprint (privacy/fingerprint.py: HMAC-SHA256
under the store's secret key, `--store`, default $PRIVFLOW_STORE or .privflow). It never emits
twice for the same file: the state file records (path, keyed fingerprint) of every announced
file, written atomically after the events were handed to the server, and the event id is derived
from (path, keyed fingerprint), so a repeat after a crash between the two is dropped by the
server's event de-duplication. A file whose content changes under the same name is new data and
is announced again (so is every file once, should the store's key change). A file still being
written (modified less than `settle` seconds ago), hidden files and `*.tmp`/`*.part` files wait
for a later scan. The watcher reads file bytes to fingerprint them and never parses rows.
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

from privflow.privacy.fingerprint import keyed_fingerprint, store_key

EVENT = "privflow.data.arrived"
FOLDER_LABEL = "privflow.folder"
SUFFIXES = (".csv", ".parquet", ".pq")
_NAMESPACE = uuid.UUID("6f1d3c52-7d0e-4c1b-9a63-2f4e8e5b9a10")


@dataclass(frozen=True)
class Arrival:
    """A file announced by one scan, its keyed fingerprint, and the id of the event that announced it."""

    path: Path
    fingerprint: str
    event_id: uuid.UUID


def _sha256(path: Path) -> str:
    """The unkeyed digest a state file of an older watcher recorded: read only to carry such an
    entry over to the keyed fingerprint (`_unchanged`), never emitted or stored again."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def event_id(path: Path, fingerprint: str) -> uuid.UUID:
    """Deterministic per (path, keyed fingerprint): a re-sent event is recognised by the server,
    and the id, like the fingerprint, says nothing about the bytes to whoever lacks the key."""
    return uuid.uuid5(_NAMESPACE, f"{path}\0{fingerprint}")


def default_store() -> Path:
    """The store whose secret key fingerprints the files: $PRIVFLOW_STORE, else .privflow (the CLI's)."""
    return Path(os.environ.get("PRIVFLOW_STORE", ".privflow"))


def _unchanged(entry: dict[str, str], path: Path, fingerprint: str) -> bool:
    """Whether the state's entry for `path` is the file as it is now. An entry an older watcher
    wrote holds the unkeyed SHA-256 instead: compared once, then replaced by the fingerprint."""
    if "fingerprint" in entry:
        return entry["fingerprint"] == fingerprint
    return "sha256" in entry and entry["sha256"] == _sha256(path)


def default_state(folder: Path) -> Path:
    return folder / ".privflow-watch.json"


def load_state(path: Path) -> dict[str, dict[str, str]]:
    """{absolute path: {fingerprint, event_id, emitted_at}}; empty when the file does not exist yet."""
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


def scan_once(
    folder: str | Path, state: str | Path | None = None, settle: float = 5.0, store: str | Path | None = None
) -> list[Arrival]:
    """Emit one event per new or changed file; returns what was announced. Files are
    fingerprinted with `store`'s secret key (`default_store()` when None)."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise NotADirectoryError(f"Watched folder '{folder}' does not exist.")
    state_path = Path(state).expanduser().resolve() if state is not None else default_state(folder)
    key = store_key(Path(store).expanduser() if store is not None else default_store())
    with _locked(state_path):
        emitted = load_state(state_path)
        todo = []
        carried = False  # entries of an older watcher moved to the keyed fingerprint
        for path in candidates(folder, settle):
            fingerprint = keyed_fingerprint(path, key)
            if fingerprint is None:  # a database source has no bytes; the folder lists files only
                continue
            entry = emitted.get(str(path), {})
            if not _unchanged(entry, path, fingerprint):
                todo.append(Arrival(path, fingerprint, event_id(path, fingerprint)))
            elif "fingerprint" not in entry:
                emitted[str(path)] = {**_without_sha256(entry), "fingerprint": fingerprint}
                carried = True
        if not todo:
            if carried:
                save_state(state_path, emitted)
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
                payload={"fingerprint": a.fingerprint},
                id=a.event_id,
            )
            if sent is None:
                raise RuntimeError("prefect.events.emit_event did not emit (is PREFECT_API_URL set?)")
        EventsWorker.drain_all(timeout=60)  # handed to the server before the state says so
        now = datetime.now(UTC).isoformat(timespec="seconds")
        for a in todo:
            emitted[str(a.path)] = {"fingerprint": a.fingerprint, "event_id": str(a.event_id), "emitted_at": now}
        save_state(state_path, emitted)
    return todo


def _without_sha256(entry: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in entry.items() if k != "sha256"}


def watch(
    folder: str | Path,
    state: str | Path | None = None,
    interval: float = 10.0,
    settle: float = 5.0,
    store: str | Path | None = None,
) -> None:
    """Poll forever; a scan that fails (server down) is retried at the next interval."""
    while True:
        try:
            for a in scan_once(folder, state, settle, store):
                print(f"announced {a.path} ({EVENT}, event {a.event_id})", flush=True)
        except (ConnectionError, OSError, RuntimeError) as exc:
            print(f"scan failed, retrying in {interval:g} s: {exc}", file=sys.stderr, flush=True)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m privflow.flows.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="folder where new data files land")
    parser.add_argument("--state", type=Path, default=None, help="state file (default FOLDER/.privflow-watch.json)")
    parser.add_argument(
        "--store",
        type=Path,
        default=None,
        help="the privflow store whose secret key fingerprints the files (default $PRIVFLOW_STORE or .privflow)",
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between scans")
    parser.add_argument("--settle", type=float, default=5.0, help="skip files modified less than this many seconds ago")
    parser.add_argument("--once", action="store_true", help="scan once and exit")
    args = parser.parse_args(argv)
    from privflow.core import env

    env.configure()
    if args.once:
        for a in scan_once(args.folder, args.state, args.settle, args.store):
            print(f"announced {a.path} ({EVENT}, event {a.event_id})", flush=True)
        return 0
    watch(args.folder, args.state, args.interval, args.settle, args.store)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
