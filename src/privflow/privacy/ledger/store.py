"""The privacy ledger: a persistent, per-dataset record of every privacy event ever spent.

One SQLite file (stdlib sqlite3, WAL journal) holds datasets with their total budget and
runs with their events as JSON. A run reserves its events before it reads a row
(docs/architecture.md, privacy rules 3 and 6): inside `BEGIN IMMEDIATE` (the database write
lock, so concurrent reservers are serialised across processes) the ledger composes every
event already recorded for the dataset (reserved, settled or failed: any of them may have
read data) with the new ones using the PLD accountant at the dataset's delta, and refuses
the run if the total would pass the budget (`compose.budget_verdict`). The reported epsilon comes
only from here.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from privflow.core.errors import PrivacyPlanError, StoreError
from privflow.privacy.accounting.events import Event, events_from_json, events_to_json
from privflow.privacy.fingerprint import ROW_DIGEST_BYTES, sampled_rows
from privflow.privacy.ledger.compose import REL_TOL, budget_verdict, check_budget, compose_epsilon

log = logging.getLogger(__name__)


# Statuses whose events count against the budget and show in the publishable summary:
# 'reserved' (an open reservation), 'settled' (the run finished and spent its events) and
# 'failed' (abandoned after a mechanism ran: its reservation stays counted). A 'released'
# reservation read no row and spent nothing; a refused run is never recorded at all.
CHARGED_STATUSES = ("reserved", "settled", "failed")

# public_sources: the data owner's declarations, one per version `privflow pretrain` registered
# (tasks/warm_start.py): the exact version (its weights' digest) and the keyed fingerprint of the
# table declared public. Only a version declared here warm-starts for free; a registry tag does not.
# versions: every version registered from a charged run (and every pretraining on generated rows),
# with the ledger node it came from and its weights' digest: a private parent's run is read from
# here, never from registry tags (privacy rule 9).
# lineage_links: a run's parents, several per run (a warm start's parent version, the schema's DP
# draft, ...): the parent's name and, for a private one, its ledger node, so that a version's
# epsilon is its lineage's composition (`Ledger.lineage`). A node is a ledger run, or for a
# pretraining on generated rows `pretrain:NAME/VERSION`, which spends nothing and links the runs
# behind the rows. `lineage` is the one-link-per-run table of older ledgers, copied into
# lineage_links when the ledger is opened.
# row_prints: curator-only keyed digests of the rows a run was charged for ('charged') and of the
# rows `privflow generate` (or a run's own synthetic table) wrote ('generated'), privacy/fingerprint.py.
_LINEAGE_TEXT = re.compile(r"ledger run (\S+) \(already counted")  # the stages' init_from of older ledgers
_PRETRAIN_NODE = "pretrain:"  # the ledger node of a pretraining on generated rows: pretrain:NAME/VERSION
# Notes that are functions of a private file's bytes (its keyed fingerprint changed, or came
# back): recorded in `curator_notes`, shown by `curator_notes()` / `privflow ledger curator-notes`
# only, never in `notes()` or the publishable summary (privacy rules 5 and 8).
_FINGERPRINT_NOTE = "%content fingerprint%"
# The curator's link of two datasets holding the same rows (`Ledger.link`, tasks/dataset_identity.py).
_LINK_NOTE = "same rows as dataset '"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY,
    budget_epsilon REAL NOT NULL,
    budget_delta REAL NOT NULL,
    fingerprint TEXT,
    created TEXT NOT NULL,
    spent_epsilon REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS fingerprints (
    dataset TEXT NOT NULL REFERENCES datasets(name),
    fingerprint TEXT NOT NULL,
    first_seen TEXT NOT NULL,
    PRIMARY KEY (dataset, fingerprint)
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL REFERENCES datasets(name),
    status TEXT NOT NULL CHECK (status IN ('reserved', 'settled', 'failed', 'released')),
    events TEXT NOT NULL,
    reserved_events TEXT NOT NULL,
    reserved_epsilon REAL NOT NULL,
    epsilon REAL NOT NULL,
    stages TEXT NOT NULL,
    created TEXT NOT NULL,
    settled_at TEXT
);
CREATE TABLE IF NOT EXISTS public_sources (
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    weights TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    dataset TEXT NOT NULL,
    declared TEXT NOT NULL,
    PRIMARY KEY (model, version)
);
CREATE TABLE IF NOT EXISTS lineage (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
    parent TEXT NOT NULL,
    parent_run TEXT
);
CREATE TABLE IF NOT EXISTS lineage_links (
    run_id TEXT NOT NULL,
    parent TEXT NOT NULL,
    parent_run TEXT,
    PRIMARY KEY (run_id, parent)
);
CREATE TABLE IF NOT EXISTS versions (
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    run_id TEXT NOT NULL,
    weights TEXT NOT NULL,
    dataset TEXT NOT NULL,
    recorded TEXT NOT NULL,
    PRIMARY KEY (model, version)
);
CREATE TABLE IF NOT EXISTS row_prints (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('charged', 'generated')),
    dataset TEXT NOT NULL,
    run_id TEXT,
    model TEXT,
    version TEXT,
    rows INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    digests BLOB NOT NULL,
    recorded TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL,
    at TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS curator_notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL,
    at TEXT NOT NULL,
    message TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class RunRecord:
    """One run's row: `events` are what it spent (or holds in reserve); `epsilon` is that run alone."""

    run_id: str
    dataset: str
    status: str
    events: tuple[Event, ...]
    created: str
    settled_at: str | None
    epsilon: float
    reserved_events: tuple[Event, ...] = ()
    stages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PublicSource:
    """A version `privflow pretrain` registered from a table the data owner declared public."""

    model: str
    version: str
    weights: str  # digest of the registered weights (tasks/warm_start.py, `weights_digest`)
    fingerprint: str  # keyed HMAC of the public table (privacy/fingerprint.py)
    dataset: str  # the schema's dataset name it was pretrained for
    declared: str


@dataclass(frozen=True)
class VersionRecord:
    """A registered version the ledger knows: `run_id` is the ledger node its weights came from
    (a charged run, or `pretrain:NAME/VERSION` for a pretraining on generated rows) and
    `weights` the digest of the weights registered then (tasks/warm_start.py, `weights_digest`)."""

    model: str
    version: str
    run_id: str
    weights: str
    dataset: str
    recorded: str

    @property
    def derived(self) -> bool:
        """A pretraining on generated rows: its node spends nothing and links the runs behind them."""
        return self.run_id.startswith(_PRETRAIN_NODE)


@dataclass(frozen=True)
class RowPrints:
    """Keyed digests of a table's rows (privacy/fingerprint.py), curator-only: 'charged', the rows a
    run read (its passing rows); 'generated', a table sampled from version `model/version`, whose
    ledger node is `run_id` (None when the ledger knows the version neither as charged nor public)."""

    kind: str
    dataset: str
    run_id: str | None
    model: str | None
    version: str | None
    rows: int
    fingerprint: str
    digests: bytes  # sorted little-endian uint64, `fingerprint.digests_blob`
    recorded: str


@dataclass(frozen=True)
class Lineage:
    """A run's lineage: every ledger run its weights depend on, oldest first (this run last): the
    private parents' runs and theirs, the schema's DP draft, the runs behind generated rows a
    parent was pretrained on; the parent versions (and drafts) they came from, oldest first (a
    public root marked "(public)"; the run's own version is not known here); and the PLD
    composition of those runs' recorded events, each run's once, at the dataset's delta."""

    runs: tuple[str, ...]
    parents: tuple[str, ...]
    epsilon: float
    delta: float

    @property
    def private_parents(self) -> bool:
        """Whether the lineage holds any run other than this one (else the run's epsilon is its own)."""
        return len(self.runs) > 1


@dataclass(frozen=True)
class DatasetRecord:
    """A dataset's budget and what its runs have spent (PLD composition at budget_delta)."""

    name: str
    budget_epsilon: float
    budget_delta: float
    fingerprint: str | None
    created: str
    spent_epsilon: float
    runs: int
    fingerprints: tuple[str, ...] = ()

    @property
    def remaining_epsilon(self) -> float:
        """Budget minus spent: NOT what a next run can ask for (composition is not subtraction,
        a next run of epsilon e adds less than e to the total); see `headroom_epsilon`."""
        return max(0.0, self.budget_epsilon - self.spent_epsilon)


def attempt_run_id(base: str, attempt: int | None) -> str:
    """A ledger run id for one attempt of a run: the base id for the first (no `-attempt1` on
    every run), `<base>#attempt<n>` for a retry, which reruns the mechanisms and is counted again."""
    return base if (attempt or 1) <= 1 else f"{base}#attempt{attempt}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


_LEDGER_TABLES = {"datasets", "runs"}  # a database holding tables but neither of these is someone else's

# SQLite's words for a disk that is full or failing, not a damaged file (kept, never replaced)
_MACHINE_FAULTS = ("disk I/O error", "database or disk is full")


class Ledger:
    """Persistent privacy ledger in one SQLite file; safe across threads and processes."""

    def __init__(self, path: str | Path, timeout: float = 300.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        if not self.path.parent.is_dir():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = self._connect()
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if tables and not tables & _LEDGER_TABLES:
                    raise StoreError(
                        f"'{self.path}' is a SQLite database but not a privacy ledger (it holds the tables "
                        f"{', '.join(sorted(tables)[:5])}); privflow will not write into it. Point --store at the "
                        "store folder privflow runs used, or move that file out of the way. Nothing was changed."
                    )
                con.execute("PRAGMA journal_mode=WAL")
                con.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        con.execute(statement)
                self._move_curator_notes(con)
                # an older ledger's single links, kept there for older readers
                con.execute(
                    "INSERT OR IGNORE INTO lineage_links (run_id, parent, parent_run)"
                    " SELECT run_id, parent, parent_run FROM lineage"
                )
                con.execute("COMMIT")
            finally:
                con.close()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise  # another process holds it past the timeout: not the file's fault
            if isinstance(exc, sqlite3.OperationalError) and any(s in str(exc) for s in _MACHINE_FAULTS):
                raise StoreError(
                    f"The privacy ledger '{self.path}' cannot be used ({exc}): the disk that holds it may be full "
                    "or failing. Free some space on it (or fix the disk) and rerun; the ledger is left as it is."
                ) from None
            raise StoreError(
                f"The privacy ledger '{self.path}' cannot be opened as a SQLite database ({exc}). It holds every "
                "epsilon spent on its datasets, so privflow will not replace it: restore it from a backup (do not "
                "delete it, that would forget what was spent). Nothing was changed."
            ) from None

    @staticmethod
    def _move_curator_notes(con: sqlite3.Connection) -> None:
        """A ledger written before fingerprint notes were curator-only kept them in `notes`, which
        the publishable summary prints: move them to `curator_notes` (same time, same text)."""
        moved = "SELECT dataset, at, message FROM notes WHERE message LIKE ?"
        con.execute(f"INSERT INTO curator_notes (dataset, at, message) {moved}", (_FINGERPRINT_NOTE,))
        con.execute("DELETE FROM notes WHERE message LIKE ?", (_FINGERPRINT_NOTE,))

    # -- connections -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        con.row_factory = sqlite3.Row
        con.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
        con.execute("PRAGMA foreign_keys=ON")
        con.execute("PRAGMA synchronous=FULL")
        return con

    @contextmanager
    def _tx(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        """A transaction: IMMEDIATE takes the write lock at once, so check-then-write is atomic."""
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        finally:
            con.close()

    # -- datasets ---------------------------------------------------------------------------

    def ensure_dataset(
        self, name: str, budget_epsilon: float, budget_delta: float, fingerprint: str | None = None
    ) -> list[str]:
        """Register a dataset or check it against the record; returns warnings (empty when all agrees).

        A known dataset keeps its recorded budget (change it deliberately with `set_budget`).
        A fingerprint different from the recorded ones is stored and noted, never ignored: new
        rows under an old name still share the old name's budget. That note is a function of the
        private file's bytes, so it is curator-only: written to `curator_notes` (read it with
        `curator_notes()`), neither returned nor logged, never in the publishable summary.
        """
        if not (math.isfinite(budget_epsilon) and budget_epsilon > 0):
            raise PrivacyPlanError(f"Dataset '{name}': budget epsilon must be a finite positive number.")
        if not 0 < budget_delta < 1:
            raise PrivacyPlanError(f"Dataset '{name}': budget delta must lie in (0, 1).")
        warnings: list[str] = []
        with self._tx() as con:
            row = con.execute("SELECT * FROM datasets WHERE name = ?", (name,)).fetchone()
            now = _now()
            if row is None:
                con.execute(
                    "INSERT INTO datasets (name, budget_epsilon, budget_delta, fingerprint, created)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (name, float(budget_epsilon), float(budget_delta), fingerprint, now),
                )
                if fingerprint is not None:
                    con.execute("INSERT INTO fingerprints VALUES (?, ?, ?)", (name, fingerprint, now))
                return warnings
            recorded = (float(row["budget_epsilon"]), float(row["budget_delta"]))
            lowered = (min(recorded[0], float(budget_epsilon)), min(recorded[1], float(budget_delta)))
            if lowered != recorded:  # a lower budget is always safe to apply: it takes effect at once
                self._set_budget(con, name, *lowered, "lowered by the schema")
            if (float(budget_epsilon), float(budget_delta)) != lowered:
                warnings.append(
                    f"Dataset '{name}' keeps its recorded budget (epsilon={lowered[0]:g}, delta={lowered[1]:g}); "
                    f"the schema's higher (epsilon={budget_epsilon:g}, delta={budget_delta:g}) was not applied. "
                    f"Raise it on purpose with `privflow ledger set-budget {name} --epsilon E --delta D`."
                )
            if fingerprint is not None and fingerprint != row["fingerprint"]:
                seen = {r[0] for r in con.execute("SELECT fingerprint FROM fingerprints WHERE dataset = ?", (name,))}
                if row["fingerprint"] is not None:
                    # Curator-only (no fingerprint value in it either): whether the bytes changed is
                    # decided by every row, so it never reaches a message or the publishable summary.
                    con.execute(
                        "INSERT INTO curator_notes (dataset, at, message) VALUES (?, ?, ?)",
                        (
                            name,
                            now,
                            f"Dataset '{name}' now has a content fingerprint different from the one recorded"
                            + (" (a version seen earlier)" if fingerprint in seen else "")
                            + ". The data changed under the same name; its spent budget still counts.",
                        ),
                    )
                if fingerprint not in seen:
                    con.execute("INSERT INTO fingerprints VALUES (?, ?, ?)", (name, fingerprint, now))
                con.execute("UPDATE datasets SET fingerprint = ? WHERE name = ?", (fingerprint, name))
            for w in warnings:
                con.execute("INSERT INTO notes (dataset, at, message) VALUES (?, ?, ?)", (name, now, w))
        for w in warnings:
            log.warning(w)
        return warnings

    def set_budget(self, name: str, budget_epsilon: float, budget_delta: float) -> None:
        """Change a dataset's total budget on purpose (recorded in its notes); spend is recomputed."""
        if not (math.isfinite(budget_epsilon) and budget_epsilon > 0) or not 0 < budget_delta < 1:
            raise PrivacyPlanError(f"Dataset '{name}': need epsilon > 0 and 0 < delta < 1.")
        with self._tx() as con:
            self._set_budget(con, name, float(budget_epsilon), float(budget_delta), "set on purpose")

    def _set_budget(self, con: sqlite3.Connection, name: str, epsilon: float, delta: float, why: str) -> None:
        """The budget update, its note, and every run's epsilon recomposed at the new delta."""
        row = self._dataset_row(con, name)
        con.execute("UPDATE datasets SET budget_epsilon = ?, budget_delta = ? WHERE name = ?", (epsilon, delta, name))
        msg = (
            f"budget changed from (epsilon={row['budget_epsilon']:g}, delta={row['budget_delta']:g}) "
            f"to (epsilon={epsilon:g}, delta={delta:g}): {why}"
        )
        con.execute("INSERT INTO notes (dataset, at, message) VALUES (?, ?, ?)", (name, _now(), msg))
        for r in con.execute("SELECT run_id, events FROM runs WHERE dataset = ?", (name,)).fetchall():
            eps = compose_epsilon(events_from_json(r["events"]), delta)
            con.execute("UPDATE runs SET epsilon = ? WHERE run_id = ?", (eps, r["run_id"]))
        self._refresh_spent(con, name, delta)

    @staticmethod
    def _dataset_row(con: sqlite3.Connection, name: str) -> sqlite3.Row:
        row = con.execute("SELECT * FROM datasets WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise PrivacyPlanError(f"Dataset '{name}' is not in the privacy ledger; register it first.")
        return row

    @staticmethod
    def _dataset_events(con: sqlite3.Connection, name: str, exclude: str | None = None) -> list[Event]:
        out: list[Event] = []
        for r in con.execute("SELECT run_id, events FROM runs WHERE dataset = ? ORDER BY rowid", (name,)):
            if r["run_id"] != exclude:
                out.extend(events_from_json(r["events"]))
        return out

    def _refresh_spent(self, con: sqlite3.Connection, name: str, delta: float) -> float:
        total = compose_epsilon(self._dataset_events(con, name), delta)
        con.execute("UPDATE datasets SET spent_epsilon = ? WHERE name = ?", (total, name))
        return total

    # -- runs -------------------------------------------------------------------------------

    def reserve(self, dataset: str, run_id: str, events: list[Event], stages: dict[str, str] | None = None) -> None:
        """Atomically reserve `events` for a run, or raise BudgetExceeded without recording anything.

        Idempotent per run_id: a retried task finds its reservation and adds nothing.
        """
        with self._tx() as con:
            ds = self._dataset_row(con, dataset)
            existing = con.execute("SELECT dataset, status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if existing is not None:
                if existing["dataset"] != dataset:
                    raise PrivacyPlanError(
                        f"Run '{run_id}' is recorded on dataset '{existing['dataset']}', not '{dataset}'."
                    )
                if existing["status"] == "failed":
                    con.execute("UPDATE runs SET status = 'reserved' WHERE run_id = ?", (run_id,))
                return
            requested, total = self._verdict(
                con, dataset, float(ds["budget_epsilon"]), float(ds["budget_delta"]), events, f"Run '{run_id}'"
            )
            now = _now()
            js = events_to_json(list(events))
            con.execute(
                "INSERT INTO runs (run_id, dataset, status, events, reserved_events, reserved_epsilon, epsilon,"
                " stages, created) VALUES (?, ?, 'reserved', ?, ?, ?, ?, ?, ?)",
                (run_id, dataset, js, js, requested, requested, json.dumps(stages or {}), now),
            )
            con.execute("UPDATE datasets SET spent_epsilon = ? WHERE name = ?", (total, dataset))

    @staticmethod
    def _verdict(
        con: sqlite3.Connection,
        dataset: str,
        budget: float,
        delta: float,
        events: Sequence[Event],
        who: str,
    ) -> tuple[float, float]:
        """The budget verdict (`compose.budget_verdict`) on what the dataset's runs recorded."""
        earlier = [
            events_from_json(r["events"])
            for r in con.execute(
                f"SELECT events FROM runs WHERE dataset = ? AND status IN {CHARGED_STATUSES} ORDER BY rowid",
                (dataset,),
            )
        ]
        return budget_verdict(dataset, budget, delta, earlier, events, who)

    def check(
        self, dataset: str, events: list[Event], budget: tuple[float, float] | None = None, who: str = "This run"
    ) -> None:
        """Dry run of `reserve`: raise BudgetExceeded if `events` would pass the dataset's budget;
        records nothing and takes no write lock.

        A dataset not yet in the ledger is checked against `budget` (epsilon, delta), the one
        `ensure_dataset` would record; without it, PrivacyPlanError.
        """
        with self._tx(immediate=False) as con:
            row = con.execute("SELECT * FROM datasets WHERE name = ?", (dataset,)).fetchone()
            if row is None:
                if budget is None:
                    raise PrivacyPlanError(f"Dataset '{dataset}' is not in the privacy ledger; register it first.")
                check_budget(dataset, events, budget, who=who)
                return
            # a schema that lowered the budget applies at once (ensure_dataset): check against it already
            eps, delta = float(row["budget_epsilon"]), float(row["budget_delta"])
            if budget is not None:
                eps, delta = min(eps, float(budget[0])), min(delta, float(budget[1]))
            self._verdict(con, dataset, eps, delta, events, who)

    def settle(self, run_id: str, events: list[Event]) -> None:
        """Replace a run's reservation by what it actually spent (at most what it reserved).

        If the actual events cost more than the reservation, they are still recorded (the
        ledger must never under-count) with status 'failed', and PrivacyPlanError is raised.
        """
        js = events_to_json(list(events))
        overspent: str | None = None
        with self._tx() as con:
            run = con.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if run is None:
                raise PrivacyPlanError(f"Run '{run_id}' has no reservation in the privacy ledger.")
            if run["status"] == "settled":
                if run["events"] == js:
                    return
                raise PrivacyPlanError(f"Run '{run_id}' is already settled with other events.")
            ds = self._dataset_row(con, run["dataset"])
            delta = float(ds["budget_delta"])
            actual = compose_epsilon(events, delta)
            reserved = float(run["reserved_epsilon"])
            status = "settled"
            if not actual <= reserved * (1 + REL_TOL):
                status = "failed"
                overspent = (
                    f"Run '{run_id}' spent epsilon={actual:.4g} but reserved only {reserved:.4g}; "
                    "the ledger records what it spent and marks the run failed."
                )
            con.execute(
                "UPDATE runs SET events = ?, epsilon = ?, status = ?, settled_at = ? WHERE run_id = ?",
                (js, actual, status, _now(), run_id),
            )
            self._refresh_spent(con, run["dataset"], delta)
        if overspent is not None:
            log.error(overspent)
            raise PrivacyPlanError(overspent)

    def abandon(self, run_id: str) -> None:
        """Mark a reserved run failed; its reserved events stay counted (it may have read data)."""
        with self._tx() as con:
            run = con.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if run is None:
                raise PrivacyPlanError(f"Run '{run_id}' has no reservation in the privacy ledger.")
            if run["status"] == "reserved":
                con.execute("UPDATE runs SET status = 'failed', settled_at = ? WHERE run_id = ?", (_now(), run_id))

    def release(self, run_id: str) -> None:
        """Return a reservation whose run stopped before any mechanism read its rows (a failed
        validation, a bad file): its events stop counting; the record stays, as 'released'."""
        with self._tx() as con:
            run = con.execute("SELECT dataset, status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if run is None:
                raise PrivacyPlanError(f"Run '{run_id}' has no reservation in the privacy ledger.")
            if run["status"] != "reserved":
                raise PrivacyPlanError(f"Run '{run_id}' is {run['status']}; only a reservation can be released.")
            con.execute(
                "UPDATE runs SET status = 'released', events = '[]', epsilon = 0, settled_at = ? WHERE run_id = ?",
                (_now(), run_id),
            )
            self._refresh_spent(con, run["dataset"], float(self._dataset_row(con, run["dataset"])["budget_delta"]))

    # -- public sources and lineage -----------------------------------------------------------

    def declare_public(self, model: str, version: str, weights: str, fingerprint: str, dataset: str) -> None:
        """Record the data owner's declaration (`privflow pretrain`): version `model/version`,
        whose weights have digest `weights`, was trained on the table of keyed fingerprint
        `fingerprint`, declared public. Replaces an earlier declaration of the same version."""
        with self._tx() as con:
            con.execute(
                "INSERT OR REPLACE INTO public_sources (model, version, weights, fingerprint, dataset, declared)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (model, str(version), weights, fingerprint, dataset, _now()),
            )

    def public_source(self, model: str, version: str) -> PublicSource | None:
        """The declaration of `model/version`, or None when `privflow pretrain` made none here."""
        with self._tx(immediate=False) as con:
            r = con.execute(
                "SELECT * FROM public_sources WHERE model = ? AND version = ?", (model, str(version))
            ).fetchone()
        if r is None:
            return None
        return PublicSource(r["model"], r["version"], r["weights"], r["fingerprint"], r["dataset"], r["declared"])

    def record_parent(self, run_id: str, parent: str, parent_run: str | None) -> None:
        """Add a link to a run's lineage: a parent (a warm start's version NAME/VERSION, the schema's
        draft, ...) and, for a private one, its ledger node. A run may have several; recording the
        same parent again replaces its link."""
        with self._tx() as con:
            if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise PrivacyPlanError(f"Run '{run_id}' has no reservation in the privacy ledger.")
            con.execute(
                "INSERT OR REPLACE INTO lineage_links (run_id, parent, parent_run) VALUES (?, ?, ?)",
                (run_id, parent, parent_run),
            )

    def links(self, node: str) -> list[tuple[str, str | None]]:
        """A run's (or a pretraining node's) recorded parents: (name, ledger node or None)."""
        with self._tx(immediate=False) as con:
            return [(r[0], r[1]) for r in self._links(con, node)]

    def record_version(self, model: str, version: str, run_id: str, weights: str) -> None:
        """Record that version `model/version`, whose weights have digest `weights`, was registered
        from ledger run `run_id` (which must be recorded): what a warm start from it composes."""
        with self._tx() as con:
            run = con.execute("SELECT dataset FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if run is None:
                raise PrivacyPlanError(f"Run '{run_id}' has no reservation in the privacy ledger.")
            con.execute(
                "INSERT OR REPLACE INTO versions (model, version, run_id, weights, dataset, recorded)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (model, str(version), run_id, weights, run["dataset"], _now()),
            )

    def record_derived_version(
        self, model: str, version: str, weights: str, dataset: str, links: Sequence[tuple[str, str]]
    ) -> str:
        """Record a pretraining on generated rows (`privflow pretrain`, tasks/warm_start.py): version
        `model/version` (weights digest `weights`, pretrained for `dataset`'s schema) is not public;
        its ledger node `pretrain:model/version` spends nothing and links every (name, node) in
        `links`, the versions whose sampled rows it read. Returns the node."""
        node = f"{_PRETRAIN_NODE}{model}/{version}"
        if not links:
            raise PrivacyPlanError(f"A pretraining node ({node}) needs the ledger nodes of the rows it read.")
        with self._tx() as con:
            for _, parent_run in links:
                if not self._known_node(con, parent_run):
                    raise PrivacyPlanError(f"Ledger node '{parent_run}' is not in the privacy ledger.")
            con.execute("DELETE FROM lineage_links WHERE run_id = ?", (node,))
            con.executemany(
                "INSERT OR REPLACE INTO lineage_links (run_id, parent, parent_run) VALUES (?, ?, ?)",
                [(node, parent, parent_run) for parent, parent_run in links],
            )
            con.execute(
                "INSERT OR REPLACE INTO versions (model, version, run_id, weights, dataset, recorded)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (model, str(version), node, weights, dataset, _now()),
            )
        return node

    def version(self, model: str, version: str) -> VersionRecord | None:
        """The ledger's record of `model/version`, or None when no run of this ledger registered it."""
        with self._tx(immediate=False) as con:
            r = con.execute("SELECT * FROM versions WHERE model = ? AND version = ?", (model, str(version))).fetchone()
        if r is None:
            return None
        return VersionRecord(r["model"], r["version"], r["run_id"], r["weights"], r["dataset"], r["recorded"])

    def record_rows(
        self,
        kind: str,
        dataset: str,
        digests: bytes,
        fingerprint: str,
        run_id: str | None = None,
        model: str | None = None,
        version: str | None = None,
    ) -> None:
        """Keep the keyed row digests of a table (curator-only; privacy/fingerprint.py): 'charged',
        the rows run `run_id` read (a retried run's record replaces its earlier one); 'generated', a
        table sampled from `model/version`, whose ledger node is `run_id` (None where unknown)."""
        if kind not in ("charged", "generated"):
            raise ValueError(f"row prints are 'charged' or 'generated', not {kind!r}")
        with self._tx() as con:
            if kind == "charged":
                con.execute("DELETE FROM row_prints WHERE kind = 'charged' AND run_id = ?", (run_id,))
            con.execute(
                "INSERT INTO row_prints (kind, dataset, run_id, model, version, rows, fingerprint, digests, recorded)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (kind, dataset, run_id, model, version, len(digests) // ROW_DIGEST_BYTES, fingerprint, digests, _now()),
            )

    def row_prints(self, kind: str | None = None) -> list[RowPrints]:
        """The recorded row digests, oldest first, optionally of one kind (curator-only)."""
        with self._tx(immediate=False) as con:
            q = "SELECT * FROM row_prints" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
            rows = con.execute(q, (kind,) if kind else ()).fetchall()
        return [
            RowPrints(
                r["kind"],
                r["dataset"],
                r["run_id"],
                r["model"],
                r["version"],
                int(r["rows"]),
                r["fingerprint"],
                bytes(r["digests"]),
                r["recorded"],
            )
            for r in rows
        ]

    @staticmethod
    def _links(con: sqlite3.Connection, node: str) -> list[sqlite3.Row]:
        """A node's links, public ones first, then by their parent run's age."""
        return con.execute(
            "SELECT l.parent, l.parent_run FROM lineage_links l LEFT JOIN runs r ON r.run_id = l.parent_run"
            " WHERE l.run_id = ? ORDER BY l.parent_run IS NOT NULL, r.rowid, l.parent",
            (node,),
        ).fetchall()

    @staticmethod
    def _known_node(con: sqlite3.Connection, node: str) -> bool:
        if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (node,)).fetchone() is not None:
            return True
        return con.execute("SELECT 1 FROM lineage_links WHERE run_id = ?", (node,)).fetchone() is not None

    def _walk(self, con: sqlite3.Connection, start: str) -> tuple[list[tuple[int, str, list[Event]]], list[str]]:
        """Every ledger run `start` depends on (itself included when it is a run), as (rowid, run,
        events), and the parent names met, ancestors first; a node reached twice is taken once."""
        runs: dict[str, tuple[int, list[Event]]] = {}
        parents: list[str] = []
        done: set[str] = set()
        path: list[str] = []

        def visit(node: str) -> None:
            if node in path:
                raise PrivacyPlanError(f"The lineage of run '{start}' loops back to run '{node}'.")
            if node in done:
                return
            path.append(node)
            row = con.execute("SELECT rowid, events, stages FROM runs WHERE run_id = ?", (node,)).fetchone()
            links: list[tuple[str, str | None]] = [(r[0], r[1]) for r in self._links(con, node)]
            if row is None and not links:
                raise PrivacyPlanError(
                    f"Run '{start}' descends from ledger run '{node}', which this ledger does not hold: "
                    "its lineage's epsilon cannot be composed."
                )
            if row is not None:
                runs[node] = (int(row["rowid"]), events_from_json(row["events"]))
                if not links:  # a ledger from before the lineage table: the stages name the parent
                    text = json.loads(row["stages"]).get("init_from")
                    if text is not None:
                        found = _LINEAGE_TEXT.search(text)
                        links = [(text.split(":", 1)[0], found.group(1) if found else None)]
            for parent, parent_run in links:
                if parent_run is not None:
                    visit(parent_run)
                shown = parent if parent_run is not None else f"{parent} (public)"
                if shown not in parents:
                    parents.append(shown)
            path.pop()
            done.add(node)

        visit(start)
        ordered = sorted((rowid, run, events) for run, (rowid, events) in runs.items())
        return ordered, parents

    def ancestors(self, node: str) -> tuple[str, ...]:
        """The ledger runs a node (a run, or a pretraining node) depends on, oldest first;
        PrivacyPlanError when one of them is not in this ledger."""
        with self._tx(immediate=False) as con:
            runs, _ = self._walk(con, node)
        return tuple(run for _, run, _ in runs)

    def lineage(self, run_id: str) -> Lineage:
        """The run's lineage and its composed epsilon (privacy rule 9): the recorded events of every
        distinct ledger run in its lineage DAG (this run, each private parent's run and theirs, a
        DP schema draft, the runs behind generated rows a parent was pretrained on), each run's
        events once, composed with the ledger's accountant at the dataset's delta. A public root
        adds no events; a fresh run's lineage is itself."""
        with self._tx(immediate=False) as con:
            first = con.execute("SELECT dataset FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if first is None:
                raise PrivacyPlanError(f"Run '{run_id}' is not in the privacy ledger.")
            delta = float(self._dataset_row(con, first["dataset"])["budget_delta"])
            runs, parents = self._walk(con, run_id)
        events = [e for _, _, run_events in runs for e in run_events]
        return Lineage(tuple(run for _, run, _ in runs), tuple(parents), compose_epsilon(events, delta), delta)

    # -- reading ----------------------------------------------------------------------------

    def spent(self, dataset: str) -> tuple[float, float]:
        """(epsilon, delta) spent on a dataset by all its runs; (0, 0) before any run."""
        with self._tx(immediate=False) as con:
            ds = self._dataset_row(con, dataset)
            n = con.execute("SELECT COUNT(*) FROM runs WHERE dataset = ?", (dataset,)).fetchone()[0]
        return (float(ds["spent_epsilon"]), float(ds["budget_delta"])) if n else (0.0, 0.0)

    def runs(self, dataset: str | None = None) -> list[RunRecord]:
        """Runs in the order they reserved, optionally of one dataset."""
        with self._tx(immediate=False) as con:
            if dataset is None:
                rows = con.execute("SELECT * FROM runs ORDER BY rowid").fetchall()
            else:
                rows = con.execute("SELECT * FROM runs WHERE dataset = ? ORDER BY rowid", (dataset,)).fetchall()
        return [
            RunRecord(
                run_id=r["run_id"],
                dataset=r["dataset"],
                status=r["status"],
                events=tuple(events_from_json(r["events"])),
                created=r["created"],
                settled_at=r["settled_at"],
                epsilon=float(r["epsilon"]),
                reserved_events=tuple(events_from_json(r["reserved_events"])),
                stages=tuple(sorted(json.loads(r["stages"]).items())),
            )
            for r in rows
        ]

    def datasets(self) -> list[DatasetRecord]:
        with self._tx(immediate=False) as con:
            rows = con.execute("SELECT * FROM datasets ORDER BY created").fetchall()
            counts = dict(con.execute("SELECT dataset, COUNT(*) FROM runs GROUP BY dataset").fetchall())
            prints: dict[str, list[str]] = {}
            for r in con.execute("SELECT dataset, fingerprint FROM fingerprints ORDER BY first_seen"):
                prints.setdefault(r[0], []).append(r[1])
        return [
            DatasetRecord(
                name=r["name"],
                budget_epsilon=float(r["budget_epsilon"]),
                budget_delta=float(r["budget_delta"]),
                fingerprint=r["fingerprint"],
                created=r["created"],
                spent_epsilon=float(r["spent_epsilon"]),
                runs=int(counts.get(r["name"], 0)),
                fingerprints=tuple(prints.get(r["name"], [])),
            )
            for r in rows
        ]

    def notes(self, dataset: str | None = None) -> list[tuple[str, str, str]]:
        """(dataset, time, message) of the publishable notes: budget changes."""
        return self._notes("notes", dataset)

    def curator_notes(self, dataset: str | None = None) -> list[tuple[str, str, str]]:
        """(dataset, time, message) of the curator-only notes: a dataset's content fingerprint
        changed (or came back). Functions of the private files' bytes: never published."""
        return self._notes("curator_notes", dataset)

    def _notes(self, table: str, dataset: str | None) -> list[tuple[str, str, str]]:
        with self._tx(immediate=False) as con:
            q = f"SELECT dataset, at, message FROM {table}" + (" WHERE dataset = ?" if dataset else "") + " ORDER BY id"
            return [tuple(r) for r in con.execute(q, (dataset,) if dataset else ())]

    # -- one budget per table (tasks/dataset_identity.py) ----------------------------------------

    def link(self, dataset: str, other: str) -> None:
        """Record the curator's decision that `dataset` may be spent on rows `other` was charged for
        (a curator-only note on both): the data-identity check then refuses neither for the other's rows."""
        with self._tx() as con:
            self._dataset_row(con, other)  # `dataset` may be new: its refused run reserved nothing
            at = _now()
            for a, b in ((dataset, other), (other, dataset)):
                con.execute(
                    "INSERT INTO curator_notes (dataset, at, message) VALUES (?, ?, ?)",
                    (a, at, f"{_LINK_NOTE}{b}' by the curator (privflow ledger link); their budgets stay separate"),
                )

    def linked(self, dataset: str) -> tuple[str, ...]:
        """The datasets the curator linked to `dataset` (`link`)."""
        with self._tx(immediate=False) as con:
            rows = con.execute(
                "SELECT message FROM curator_notes WHERE dataset = ? AND message LIKE ?", (dataset, _LINK_NOTE + "%")
            ).fetchall()
        return tuple(sorted({r[0][len(_LINK_NOTE) :].split("'", 1)[0] for r in rows}))

    def rename_dataset(self, old: str, new: str) -> None:
        """Rename dataset `old` to `new` everywhere in the ledger, in one transaction (its runs, budget,
        fingerprints, row prints, versions, public declarations and notes move with it), and record
        it as a publishable note. Refused (ConfigError) when `new` exists or `old` has a run in
        progress (a reservation not settled yet)."""
        from privflow.core.errors import ConfigError

        with self._tx() as con:
            self._dataset_row(con, old)
            if con.execute("SELECT 1 FROM datasets WHERE name = ?", (new,)).fetchone() is not None:
                raise ConfigError(
                    f"Dataset '{new}' is already in the privacy ledger '{self.path}': renaming '{old}' to it would "
                    "merge two budgets. Pick a name the ledger does not hold; nothing was changed."
                )
            if con.execute("SELECT 1 FROM runs WHERE dataset = ? AND status = 'reserved'", (old,)).fetchone():
                raise ConfigError(
                    f"Dataset '{old}' has a run in progress (a reservation not settled yet); rename it once the run "
                    "has ended. Nothing was changed."
                )
            con.execute(
                "INSERT INTO datasets (name, budget_epsilon, budget_delta, fingerprint, created, spent_epsilon)"
                " SELECT ?, budget_epsilon, budget_delta, fingerprint, created, spent_epsilon FROM datasets"
                " WHERE name = ?",
                (new, old),
            )
            for table in ("fingerprints", "runs", "public_sources", "versions", "row_prints", "notes", "curator_notes"):
                con.execute(f"UPDATE {table} SET dataset = ? WHERE dataset = ?", (new, old))
            con.execute(
                "UPDATE curator_notes SET message = replace(message, ?, ?) WHERE message LIKE ?",
                (f"{_LINK_NOTE}{old}'", f"{_LINK_NOTE}{new}'", f"{_LINK_NOTE}{old}'%"),
            )
            con.execute("DELETE FROM datasets WHERE name = ?", (old,))
            con.execute(
                "INSERT INTO notes (dataset, at, message) VALUES (?, ?, ?)",
                (
                    new,
                    _now(),
                    f"dataset renamed from '{old}' to '{new}' (privflow ledger rename); runs and budget kept",
                ),
            )

    def curator_summary(self, dataset: str | None = None) -> list[dict[str, Any]]:
        """Per dataset, what the ledger keeps curator-only, as counts and dates (never a digest):
        charged runs with row prints and the rows recorded for each, generated tables recorded
        per model/version, and the public declarations made for the dataset."""
        with self._tx(immediate=False) as con:
            where, args = (" WHERE dataset = ?", (dataset,)) if dataset else ("", ())
            prints = con.execute(
                f"SELECT kind, dataset, run_id, model, version, rows, fingerprint, recorded FROM row_prints{where} "
                "ORDER BY id",
                args,
            ).fetchall()
            declared = con.execute(
                f"SELECT model, version, dataset, declared FROM public_sources{where} ORDER BY declared", args
            ).fetchall()
            names = [r[0] for r in con.execute(f"SELECT name FROM datasets{where.replace('dataset', 'name')}", args)]
        out: dict[str, dict[str, Any]] = {}

        def entry(name: str) -> dict[str, Any]:
            return out.setdefault(name, {"dataset": name, "charged": [], "generated": {}, "public": []})

        for name in names:
            entry(name)
        for r in prints:
            e = entry(r["dataset"])
            if r["kind"] == "charged":
                e["charged"].append((r["run_id"], sampled_rows(r["fingerprint"]) or int(r["rows"]), r["recorded"][:10]))
            else:
                key = f"{r['model']}/{r['version']}"
                tables, rows, last = e["generated"].get(key, (0, 0, ""))
                e["generated"][key] = (tables + 1, rows + int(r["rows"]), max(last, r["recorded"][:10]))
        for r in declared:
            entry(r["dataset"])["public"].append((f"{r['model']}/{r['version']}", r["declared"][:10]))
        return list(out.values())

    def describe(self, dataset: str | None = None) -> str:
        """The publishable summary (`summary.describe`)."""
        from privflow.privacy.ledger.summary import describe  # the summary reads the store

        return describe(self, dataset)


def check_budget_at(
    path: str | Path, dataset: str, events: Sequence[Event], budget: tuple[float, float], who: str = "This run"
) -> None:
    """Pre-flight: check `events` against the ledger at `path` without reserving or creating
    anything; a missing ledger file means a fresh budget."""
    p = Path(path)
    if not p.exists():
        check_budget(dataset, events, budget, who)
        return
    Ledger(p).check(dataset, list(events), budget, who)
