"""Validate a table against its public schema with a Great Expectations suite built from it.

Two steps. (1) polars coerces each column to its modelled type and counts the values that do
not parse ("type") or are not whole numbers ("integer"): coerce.py. (2) A GX 1.x suite, built in
code from the schema, checks the structure on the frame as given and the values (public bounds,
declared categories) on the coerced frame: expectations.py. GX's `unexpected_count` is the count
of record; polars computes the same row masks to know which rows to quarantine (changes.py), and
the two must agree exactly. A value past the bounds of a column that clamps is clamped, and a
categorical's value not in its list becomes its `other`, instead of failing its row (changes.py).
table.py runs the steps (`validate`, `validate_chunks`, `typed_rows`), quarantine.py writes the
rows set aside, report.py holds the report and its messages.

The report is a diagnostic for the data owner computed on private rows: it is NOT
differentially private and is never released (privacy rule 5). It holds counts only, never a
raw value; the quarantine file does hold raw rows and stays with the data owner.

This package's public API is the names below; the modules' other public names are for the
package's own use and for the few callers that need one step (`coerce.numeric_dtype`,
`expectations.import_gx`).
"""

from privflow.data.validation.quarantine import REASON_COLUMN, ROW_COLUMN
from privflow.data.validation.report import (
    CHECK_ADVICE,
    NOT_DP_LABEL,
    QUARANTINE_ADVICE,
    ROWS,
    SCORED_ADVICE,
    Adjustment,
    Failure,
    Policy,
    RowCells,
    ValidationReport,
)
from privflow.data.validation.table import Gate, ask_gate, merged_report, typed_rows, validate, validate_chunks

__all__ = [
    "CHECK_ADVICE",
    "NOT_DP_LABEL",
    "QUARANTINE_ADVICE",
    "REASON_COLUMN",
    "ROWS",
    "ROW_COLUMN",
    "SCORED_ADVICE",
    "Adjustment",
    "Failure",
    "Gate",
    "Policy",
    "RowCells",
    "ValidationReport",
    "ask_gate",
    "merged_report",
    "typed_rows",
    "validate",
    "validate_chunks",
]
