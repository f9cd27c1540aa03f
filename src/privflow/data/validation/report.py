"""The validation report: which checks failed on how many rows, which values were changed
instead, and the sentences and messages that say so.

The report is a diagnostic for the data owner computed on private rows: it is NOT
differentially private and is never released (privacy rule 5). It holds counts only, never a
raw value. `RowCells` is the rows' partition the DP gate releases
(privacy/mechanisms/validation_gate.py), with noise; here it is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from privflow.core.errors import ValidationFailed
from privflow.data.schema import TEMPORAL_TYPES, Column

NOT_DP_LABEL = (
    "NOT differentially private: diagnostic for the data owner computed on the private rows; "
    "never released with the model or the synthetic data."
)

Policy = Literal["strict", "quarantine"]
Check = Literal["missing_column", "extra_column", "unreadable", "type", "integer", "bounds", "category", "not_null"]
SCHEMA_LEVEL: Final = "schema"
ROW_LEVEL: Final = "row"
ROWS = "(row)"  # the `column` of a failure that concerns the whole row (a line the reader could not read)

# the order of a column's checks in a report and in a quarantine file's reasons
CHECK_ORDER = {c: i for i, c in enumerate(
    ("missing_column", "extra_column", "unreadable", "type", "integer", "not_null", "bounds", "category")
)}  # fmt: skip
Change = Literal["clamped", "other"]  # what the value checks do instead of failing a row (bounds, category)
CHANGE_ORDER = {"clamped": CHECK_ORDER["bounds"], "other": CHECK_ORDER["category"]}


@dataclass(frozen=True)
class Adjustment:
    """Values of one column that were changed instead of failing their row: clamped to a bound or
    read as the column's `other` (a count of values, in any row, never a value)."""

    column: str
    change: Change
    values: int
    detail: str

    def sentence(self) -> str:
        return f"column '{self.column}': {self.detail}"


@dataclass(frozen=True)
class RowCells:
    """A partition of the rows: each row is in exactly one cell, so adding or removing one row
    moves one cell by one (the histogram's L1 sensitivity is 1). The DP gate releases it
    (privacy/mechanisms/validation_gate.py); the exact figures stay with the curator.

    `clamp` / `other`: whether the schema clamps some column / declares some `other` (public: when
    False the matching cells are 0 on every table)."""

    failing: int
    unchanged: int = 0  # passing, no value changed
    clamped: int = 0  # passing, a value clamped to a bound and none sent to other
    other: int = 0  # passing, a value sent to other and none clamped
    both: int = 0  # passing, a value clamped and a value sent to other
    clamp: bool = False
    other_in_effect: bool = False

    @property
    def passing(self) -> int:
        return self.unchanged + self.clamped + self.other + self.both

    @classmethod
    def of(cls, failing: int, passing: int) -> RowCells:
        """The two cells of a schema that neither clamps nor declares `other`."""
        return cls(failing, passing)


@dataclass(frozen=True)
class Failure:
    """One failed check on one column: how many rows fail it (a count, never a value)."""

    column: str
    check: Check
    failing_rows: int
    level: Literal["schema", "row"]
    detail: str

    def sentence(self) -> str:
        return f"column '{self.column}': {self.detail}"


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of `validate`: per-column failures and row counts. NOT differentially private.

    `failing_rows` counts rows failing at least one check (every row when a check fails at
    schema level); `quarantined_rows` those set aside under the quarantine policy. `adjustments`:
    per column, how many values (in any row) were clamped or sent to `other` instead of failing;
    `rows_clamped` / `rows_other` / `rows_both`: how many passing rows hold at least one clamped
    value / one sent to other / both (the gate's cells, `cells`).
    """

    dataset: str
    policy: Policy
    total_rows: int
    failing_rows: int
    quarantined_rows: int
    failures: tuple[Failure, ...]
    expectations: int
    quarantine_path: str | None = None
    label: str = field(default=NOT_DP_LABEL)
    adjustments: tuple[Adjustment, ...] = ()
    rows_clamped: int = 0
    rows_other: int = 0
    rows_both: int = 0
    clamp: bool = False  # the schema clamps some column (public)
    other: bool = False  # the schema declares some column's `other` (public)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def schema_level(self) -> bool:
        """True when a failure concerns a whole column (always fatal, even under quarantine)."""
        return any(f.level == SCHEMA_LEVEL for f in self.failures)

    def by_column(self) -> dict[str, list[Failure]]:
        out: dict[str, list[Failure]] = {}
        for f in self.failures:
            out.setdefault(f.column, []).append(f)
        return out

    def adjusted_by_column(self) -> dict[str, list[Adjustment]]:
        out: dict[str, list[Adjustment]] = {}
        for a in self.adjustments:
            out.setdefault(a.column, []).append(a)
        return out

    @property
    def cells(self) -> RowCells:
        """The rows' partition the DP gate releases (exact; curator-only here)."""
        passing = self.total_rows - self.failing_rows
        return RowCells(
            failing=self.failing_rows,
            unchanged=passing - self.rows_clamped - self.rows_other + self.rows_both,
            clamped=self.rows_clamped - self.rows_both,
            other=self.rows_other - self.rows_both,
            both=self.rows_both,
            clamp=self.clamp,
            other_in_effect=self.other,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "dataset": self.dataset,
            "policy": self.policy,
            "passed": self.passed,
            "total_rows": self.total_rows,
            "failing_rows": self.failing_rows,
            "quarantined_rows": self.quarantined_rows,
            "quarantine_path": self.quarantine_path,
            "expectations": self.expectations,
            "columns": {
                col: [
                    {"check": f.check, "level": f.level, "failing_rows": f.failing_rows, "detail": f.detail} for f in fs
                ]
                for col, fs in self.by_column().items()
            },
            "changed_values": {
                col: [{"change": a.change, "values": a.values, "detail": a.detail} for a in adj]
                for col, adj in self.adjusted_by_column().items()
            },
            "passing_rows_clamped": self.rows_clamped,
            "passing_rows_other": self.rows_other,
            "passing_rows_clamped_and_other": self.rows_both,
        }


# ----------------------------------------------------------------------------- sentences


def number_text(x: float) -> str:
    """A bound as a report writes it: 18, not 18.0; 0.5 as it is."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _rows(n: int) -> str:
    return f"{n} row{'s' if n != 1 else ''}"


def failure_detail(col: Column | None, check: str, n: int) -> str:
    """What a `Failure` of `check` on `n` rows says (`col` as the schema writes it; None for `ROWS`)."""
    if check == "unreadable":
        return (
            f"{_rows(n)} that could not be read as a row (a line that is not a row of the header's columns, "
            "holds bytes that are not text or is longer than the line cap; the quarantine file has each one's reason)"
        )
    if check == "type" and col is not None and col.type in TEMPORAL_TYPES:
        return f"{_rows(n)} with a value that is not a {col.type} in the format '{col.time_format}'"
    if check == "type":
        return f"{_rows(n)} with a value that is not a number"
    if check == "bounds" and col is not None and col.type in TEMPORAL_TYPES:
        lo, hi = col.bound_texts
        return f"{_rows(n)} outside the public bounds [{lo}, {hi}]"
    if check == "category" and col is not None and col.type == "boolean":
        true, false = col.true_false
        return f"{_rows(n)} with a value that is neither '{true}' nor '{false}'"
    if check == "integer":
        return f"{_rows(n)} with a number that is not a whole number"
    if check == "bounds":
        if col is None or col.bounds is None:
            raise ValueError(f"a 'bounds' failure needs a column with bounds, not {col!r}")
        low, high = col.bounds
        return f"{_rows(n)} outside the public bounds [{number_text(low)}, {number_text(high)}]"
    if check == "category":
        if col is None:
            raise ValueError("a 'category' failure needs its column")
        return f"{_rows(n)} with a category not in the declared list of {len(col.categories or ())}"
    if check == "not_null":
        return f"{_rows(n)} missing a value, but the column is not nullable"
    raise ValueError(check)


# ----------------------------------------------------------------------------- messages


CHECK_ADVICE = "Run `privflow check --data FILE --schema S` to see which rows and columns fail (curator-only, free)."
QUARANTINE_ADVICE = (
    f"Fix those rows, or use the quarantine policy to set them aside and train on the rest. {CHECK_ADVICE}"
)
NOTHING_PASSES_ADVICE = f"Fix the file or the schema: with every row set aside, there is nothing to use. {CHECK_ADVICE}"
SCORED_ADVICE = "Fix those rows: every row of this table is answered, so none can be set aside."


def _message(report: ValidationReport, reason: str, advice: str = QUARANTINE_ADVICE) -> str:
    parts = "; ".join(f.sentence() for f in report.failures)
    if report.schema_level:  # a fact of the header or the column types: no row count is shown
        advice = "Missing, undeclared or wrongly typed columns cannot be quarantined: fix the file or the schema."
        return f"Validation of dataset '{report.dataset}' against its schema failed ({reason}): {parts}. {advice}"
    return (
        f"Validation of dataset '{report.dataset}' against its schema failed ({reason}): "
        f"{report.failing_rows} of {report.total_rows} rows fail. {parts}. Counts only are shown; this "
        f"diagnostic is not differentially private and stays with the data owner. {advice}"
    )


def failed(report: ValidationReport, reason: str, advice: str = QUARANTINE_ADVICE) -> ValidationFailed:
    """The error that refuses a table: its message words the exact counts (for the curator) and
    ends with `advice`; it carries the report as `.report`."""
    err = ValidationFailed(_message(report, reason, advice))
    err.report = report  # type: ignore[attr-defined]
    return err


def gate_stopped(report: ValidationReport) -> ValidationFailed:
    """The error when the DP gate says stop: no exact count in its message (the caller words it
    from the DP counts); the report, for the curator, as `.report`."""
    err = ValidationFailed(f"Validation of dataset '{report.dataset}' failed ({report.policy} policy).")
    err.report = report  # type: ignore[attr-defined]
    return err
