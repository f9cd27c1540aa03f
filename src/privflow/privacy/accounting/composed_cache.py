"""Composed epsilons remembered across processes: a scheduled run whose plan did not change
skips the privacy-loss compositions of its calibration (a process's first plan is its costliest start-up
step; benchmarks/results/overhead.md).

An accountant's answer is a deterministic function of (its kind and settings, the events,
delta) and of the library that composes them, so the key is exactly that: a JSON text of the
events (`event_to_dict`; floats written round-trip exact), the settings, delta, the
composing library's version and `FORMAT`, which changes whenever privflow's mapping from
events to that library changes. Only finite epsilons are kept. What is kept is public: a
plan is made from public inputs, and a ledger's events are what the ledger itself records.

The file is a small SQLite table in the user's cache folder (``$PRIVFLOW_ACCOUNTING_CACHE``,
"off" to disable), readable by its owner only. Any problem reading or writing it (a
read-only home, a locked or damaged file) leaves the answer to the accountant: the cache
never fails a run, and a wrong entry can only come from someone who can also edit the
ledger in the same account.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from privflow.privacy.accounting.events import Event, event_to_dict

__all__ = ["FORMAT", "ComposedCache", "default_path"]

FORMAT = 1
ENV = "PRIVFLOW_ACCOUNTING_CACHE"


def default_path() -> Path | None:
    """``$PRIVFLOW_ACCOUNTING_CACHE`` (a file; "off" or "" disables), else
    ``$XDG_CACHE_HOME/privflow/composed-epsilons.sqlite`` (``~/.cache`` by default)."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "0", "false", "no") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "privflow" / "composed-epsilons.sqlite"


@cache
def library_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def cache_key(
    accountant: str, library: str, settings: Sequence[object], pairs: Sequence[tuple[Event, int]], delta: float
) -> str:
    """The text that identifies one composition (see the module docstring)."""
    body = {
        "format": FORMAT,
        "accountant": accountant,
        "library": [library, library_version(library)],
        "settings": [float(s) if isinstance(s, int | float) else str(s) for s in settings],
        "events": [[event_to_dict(e), int(n)] for e, n in pairs],
        "delta": float(delta),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


class ComposedCache:
    """One SQLite file of (key, epsilon); opened per call, so processes share it safely."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._broken = False

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        con = sqlite3.connect(self.path, timeout=2.0, isolation_level=None)
        con.execute("CREATE TABLE IF NOT EXISTS composed (key TEXT PRIMARY KEY, epsilon REAL NOT NULL)")
        return con

    def _execute(self, sql: str, args: tuple[object, ...]) -> tuple[object, ...] | None:
        """One statement on a fresh connection; the first row, or None. A failing file is never
        asked again in this process."""
        if self._broken:
            return None
        try:
            with self._lock:
                con = self._connect()
                try:
                    return con.execute(sql, args).fetchone()
                finally:
                    con.close()
        except (OSError, sqlite3.Error):
            self._broken = True
            return None

    def get(self, key: str) -> float | None:
        if not self.path.exists():
            return None
        row = self._execute("SELECT epsilon FROM composed WHERE key = ?", (key,))
        if row is None or not isinstance(row[0], float) or not math.isfinite(row[0]) or row[0] < 0:
            return None
        return row[0]

    def put(self, key: str, epsilon: float) -> None:
        if math.isfinite(epsilon) and epsilon >= 0:
            self._execute("INSERT OR REPLACE INTO composed (key, epsilon) VALUES (?, ?)", (key, float(epsilon)))
