"""score: per-row log-likelihood of a user's table under a released model, and an anomaly flag.

Scoring rows under the released model is post-processing of that release: it spends
nothing, whoever's rows they are (the rows the user brings are theirs to look at; if they
are themselves private, the counts printed are for the operator only).

The threshold is either a public number, or the DP q-quantile of a REFERENCE table's
log-likelihoods (privacy/mechanisms/dp_quantile.py, pure epsilon-DP). The reference rows are
charged to the schema's dataset in the ledger exactly as tasks/promote.py does it: the
reference file's structure (it exists, its format, its header against the schema: all public)
is checked first, so a user's mistake there is refused with nothing recorded; then the
mechanism's event is reserved under its own id before any reference row is read (refused,
BudgetExceeded, when the budget cannot hold it), settled after the one release, abandoned
(still counted) if anything fails after rows were read. What a reference row holds never
refuses the release (privacy rule 8): a row the reader cannot parse or that fails the schema's
checks is a failing row, dropped by a per-row filter.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from privflow.core.curator import curator_dir
from privflow.core.errors import DataError
from privflow.data.io import read_header, read_table
from privflow.data.schema import SCORE_COLUMNS, Schema
from privflow.data.surface import lower
from privflow.data.target_head import conditional_loglik
from privflow.data.validation import SCORED_ADVICE, validate
from privflow.privacy.ledger import Ledger
from privflow.privacy.mechanisms.dp_quantile import DPQuantile
from privflow.tasks.mlflow_store import LoadedVersion, load_version, model_uri, open_registry, resolve_version
from privflow.tasks.promote import version_loglik

LOGLIK, ANOMALY = SCORE_COLUMNS  # appended to the scored table (the schema reserves both names)


@dataclass(frozen=True)
class DPThreshold:
    """A released DP threshold and what it cost."""

    threshold: float
    epsilon: float
    dataset: str
    ledger_run_id: str


def load_model(spec: str, store: Path) -> tuple[str, LoadedVersion]:
    """NAME@ALIAS or NAME/VERSION -> (name, the loaded version); ModelNotFound otherwise."""
    model_uri(spec)  # raises ModelNotFound on a malformed reference, before the store is touched
    open_registry(store)
    name, version, _ = resolve_version(spec)
    return name, load_version(name, version)


def score_rows(model: LoadedVersion, df: pl.DataFrame) -> np.ndarray:
    """Per-row log-likelihood (nats, encoded space) of validated rows under the released model:
    the equal-weight mixture of its checkpoints, plus its target head's term when it has one,
    as `Synthesizer.score` computes it."""
    if df.height == 0:
        return np.empty(0)
    codec = model.codec
    x = codec.encode(df.select(lower(model.schema).names), np.random.default_rng())
    return version_loglik(model.flows, x) + conditional_loglik(codec, df)


def scored_rows(model: LoadedVersion, path: Path) -> tuple[pl.DataFrame, np.ndarray]:
    """The user's table as read and each row's log-likelihood, in file order. Rows must pass the
    schema's checks (strict): a row the model cannot encode has no score. Costs nothing, so the
    CLI runs it before a DP threshold is charged: a table it refuses spends no budget."""
    raw = read_table(path)  # no column can clash with the scores: the schema reserves their names
    typed, _ = validate(raw, model.schema, "strict", advice=SCORED_ADVICE)
    return raw, score_rows(model, typed)


def flag(raw: pl.DataFrame, loglik: np.ndarray, threshold: float) -> pl.DataFrame:
    """`raw` with `loglik` and `anomaly` (loglik < threshold) appended."""
    return raw.with_columns(pl.Series(LOGLIK, loglik, dtype=pl.Float64), pl.Series(ANOMALY, loglik < threshold))


def score_table(model: LoadedVersion, path: Path, threshold: float) -> pl.DataFrame:
    """The user's table with `loglik` and `anomaly` (loglik < threshold) appended, in file order."""
    return flag(*scored_rows(model, path), threshold)


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


def dp_threshold(model: LoadedVersion, reference: Path, mechanism: DPQuantile, store: Path) -> DPThreshold:
    """The DP q-quantile of the reference rows' log-likelihoods, charged to the schema's dataset.

    The reference's format and header are checked against the schema first (a DataError then
    records nothing); reserve before reading any reference row (BudgetExceeded refuses with
    nothing recorded); rows the total reader marks unreadable or that fail the schema's checks
    are dropped (a per-row filter: the count-based sensitivity holds); release once; settle.
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
        df, _ = validate(
            read_table(reference),
            schema,
            "quarantine",
            run_dir / "reference_quarantine.csv",
            gate=lambda _failing, _passing: False,  # never stops: failing rows are dropped
        )
        threshold = mechanism.release(score_rows(model, df))
    except BaseException:
        ledger.abandon(lid)
        raise
    ledger.settle(lid, [event])
    return DPThreshold(threshold, float(mechanism.epsilon), dataset, lid)


__all__ = [
    "ANOMALY",
    "LOGLIK",
    "DPThreshold",
    "check_reference",
    "dp_threshold",
    "flag",
    "load_model",
    "score_rows",
    "score_table",
    "scored_rows",
]
