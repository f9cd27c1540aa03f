"""score: per-row log-likelihood of a user's table under a released model, and an anomaly flag.

Scoring rows under the released model is post-processing of that release: it spends
nothing, whoever's rows they are. Scoring is total over rows (privacy rule 8): a row the
reader cannot read or that fails the schema's checks is a failing row, decided by its own
values alone; it stays in the output, in its place, with an empty `loglik` and `anomaly`.
How many rows were scored, flagged and left unscored are exact counts (not DP): they go to
the curator-only folder, never into a message.

The threshold is either a public number, or the DP q-quantile of a REFERENCE table's
log-likelihoods (privacy/mechanisms/dp_quantile.py, pure epsilon-DP). The reference rows are
charged to the schema's dataset in the ledger exactly as tasks/promote.py does it: the
reference file's structure (it exists, its format, its header against the schema: all public)
is checked first, so a user's mistake there is refused with nothing recorded; then the
mechanism's event is reserved under its own id before any reference row is read (refused,
BudgetExceeded, when the budget cannot hold it), settled after the one release, abandoned
(still counted) if anything fails after rows were read. What a reference row holds never
refuses the release: the mechanism is applied to the reference's PASSING rows. Whether a row
passes is a per-row predicate, so the filter is a stable transformation (adding or removing
one row of the file adds or removes at most one passing row) and the quantile's utility keeps
its sensitivity of 1: no count of failing rows is released, so no gate is needed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from privflow.core.curator import curator_dir, write_json
from privflow.core.errors import DataError
from privflow.data.io import UNREADABLE, read_header, read_table
from privflow.data.schema import SCORE_COLUMNS, Schema
from privflow.data.validation import ROW_COLUMN, ValidationReport, validate
from privflow.privacy.ledger import Ledger
from privflow.privacy.mechanisms.dp_quantile import DPQuantile
from privflow.serving.release import Release, score_rows
from privflow.tasks.mlflow_store import load_version, model_uri, open_registry, resolve_version

LOGLIK, ANOMALY = SCORE_COLUMNS  # appended to the scored table (the schema reserves both names)
REFERENCE_QUARANTINE = "reference_quarantine.csv"  # curator-only: the reference's failing rows
REFERENCE_REPORT = "reference.json"  # curator-only: the reference's exact validation counts
SCORED_QUARANTINE = "scored_quarantine.csv"  # curator-only: the scored table's failing rows


@dataclass(frozen=True)
class DPThreshold:
    """A released DP threshold and what it cost; `curator` is the ledger run's curator-only
    folder (the reference's exact counts and failing rows)."""

    threshold: float
    epsilon: float
    dataset: str
    ledger_run_id: str
    curator: Path | None = None


@dataclass(frozen=True)
class ScoredTable:
    """A scored table: the rows as read with `loglik` and `anomaly` (empty on a failing row),
    and the exact validation report (curator-only: not DP)."""

    table: pl.DataFrame
    report: ValidationReport

    @property
    def unscored(self) -> int:
        return self.report.failing_rows

    @property
    def flagged(self) -> int:
        return int(self.table[ANOMALY].sum())


def load_model(spec: str, store: Path) -> tuple[str, Release]:
    """NAME@ALIAS or NAME/VERSION -> (name, the release, with its version and tags); ModelNotFound
    otherwise."""
    model_uri(spec)  # raises ModelNotFound on a malformed reference, before the store is touched
    open_registry(store)
    name, version, tags = resolve_version(spec)
    return name, load_version(name, version, tags)


def _never_stop(_failing: int, _passing: int) -> bool:
    return False


def _passing_rows(table: pl.DataFrame, schema: Schema, quarantine: Path) -> tuple[pl.DataFrame, ValidationReport]:
    """`validate` as a per-row filter that never stops (failing rows to `quarantine`)."""
    return validate(table, schema, "quarantine", quarantine, gate=_never_stop)


def _failing_positions(quarantine: Path, report: ValidationReport, rows: int) -> np.ndarray:
    """A mask of the rows `validate` set aside, from the quarantine file's row positions."""
    failing = np.zeros(rows, dtype=bool)
    if report.failing_rows:
        positions = pl.read_csv(quarantine, columns=[ROW_COLUMN], infer_schema=False)[ROW_COLUMN]
        failing[positions.cast(pl.Int64).to_numpy()] = True
    if int(failing.sum()) != report.failing_rows:
        raise RuntimeError("internal: the quarantine file does not list the rows validation failed")
    return failing


def scored_rows(model: Release, path: Path, quarantine: Path) -> tuple[pl.DataFrame, np.ndarray, ValidationReport]:
    """The user's table as read (its columns only), each row's log-likelihood in file order (NaN
    on a failing row: one the reader could not read, or that fails the schema's checks), and
    the exact validation report. Total: a row decides only its own score; the failing rows
    go to `quarantine` (curator-only)."""
    # no column can clash with the scores: the schema reserves their names
    raw = read_table(path, max_line_bytes=model.schema.dataset.max_line_bytes)
    typed, report = _passing_rows(raw, model.schema, quarantine)
    failing = _failing_positions(quarantine, report, raw.height)
    loglik = np.full(raw.height, np.nan)
    loglik[~failing] = score_rows(model, typed)
    return raw.drop(UNREADABLE, strict=False), loglik, report


def flag(raw: pl.DataFrame, loglik: np.ndarray, threshold: float) -> pl.DataFrame:
    """`raw` with `loglik` and `anomaly` (loglik < threshold) appended; both empty (null) where
    the log-likelihood is NaN (a row that could not be scored)."""
    scores = pl.Series(LOGLIK, loglik, dtype=pl.Float64).fill_nan(None)
    return raw.with_columns(scores).with_columns((pl.col(LOGLIK) < float(threshold)).alias(ANOMALY))


def score_table(model: Release, path: Path, threshold: float, quarantine: Path) -> ScoredTable:
    """The user's table with `loglik` and `anomaly` (loglik < threshold) appended, in file order,
    every row kept (empty scores on failing rows, which also go to `quarantine`)."""
    raw, loglik, report = scored_rows(model, path, quarantine)
    return ScoredTable(flag(raw, loglik, threshold), report)


def check_reference(reference: Path, schema: Schema) -> None:
    """The reference file exists, is a table privflow reads, and its header names the schema's
    columns, or DataError. Public facts only (no row is read), checked before the ledger
    reserves, so a user's mistake here is charged nothing. The CLI runs the pre-flight's fuller
    `check_table` (with hints) before this; here is the guard for every other caller."""
    try:
        _, header, _ = read_header(reference)
    except DataError as exc:
        raise DataError(str(exc).replace("Data file", "Reference file", 1)) from None
    if sorted(header) != sorted(schema.names):
        raise DataError(
            f"Reference file '{reference}' does not match the schema '{schema.dataset.name}': its header names "
            f"{header[:20]}, the schema declares {schema.names}. Fix the file's header."
        )


def dp_threshold(model: Release, reference: Path, mechanism: DPQuantile, store: Path) -> DPThreshold:
    """The DP q-quantile of the reference's passing rows' log-likelihoods, charged to the
    schema's dataset.

    The reference's format and header are checked against the schema first (a DataError then
    records nothing); reserve before reading any reference row (BudgetExceeded refuses with
    nothing recorded); read with the total reader; rows it marks unreadable or that fail the
    schema's checks are left out (a per-row filter: the quantile's sensitivity holds), their
    exact count and the rows themselves to the run's curator-only folder; release once; settle.
    Any failure after the reservation abandons it (it stays counted: rows may have been read).
    """
    schema: Schema = model.schema
    dataset = schema.dataset.name
    check_reference(Path(reference), schema)  # public structure only, before the ledger
    ledger = Ledger(store / "ledger.db")
    ledger.ensure_dataset(dataset, schema.dataset.budget.epsilon, schema.dataset.budget.delta)
    event = mechanism.event()
    lid = f"score-quantile-{uuid.uuid4()}"
    ledger.reserve(
        dataset,
        lid,
        [event],
        {"score": f"dp_quantile q={mechanism.q:g} epsilon={mechanism.epsilon:g} grid={mechanism.grid_points}"},
    )
    try:
        run_dir = curator_dir(store.resolve(), lid)
        table = read_table(reference, max_line_bytes=schema.dataset.max_line_bytes)
        df, report = _passing_rows(table, schema, run_dir / REFERENCE_QUARANTINE)
        write_json(run_dir, REFERENCE_REPORT, {"reference": str(reference), "validation": report.to_dict()})
        threshold = mechanism.release(score_rows(model, df))
    except BaseException:
        ledger.abandon(lid)
        raise
    ledger.settle(lid, [event])
    return DPThreshold(threshold, float(mechanism.epsilon), dataset, lid, run_dir)


__all__ = [
    "ANOMALY",
    "LOGLIK",
    "REFERENCE_QUARANTINE",
    "REFERENCE_REPORT",
    "SCORED_QUARANTINE",
    "DPThreshold",
    "ScoredTable",
    "check_reference",
    "dp_threshold",
    "flag",
    "load_model",
    "score_rows",
    "score_table",
    "scored_rows",
]
