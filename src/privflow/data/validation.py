"""Validate a table against its public schema with a Great Expectations suite built from it.

Two steps. (1) polars coerces each numeric/integer column (per-column cast, strict=False) and
counts the values that do not parse ("type") or are not whole numbers ("integer"); a date,
datetime or boolean column is first converted to its modelled values (privflow/data/surface.py:
text that does not parse with its format is a "type" failure of its row) and an ignored column
is not read at all. (2) A GX 1.x
suite, built in code from the schema on an ephemeral context, checks the structure (every
declared column present, no undeclared column, values present where not nullable) on the
frame as given and the values (public bounds, declared categories) on the coerced frame.
GX's `unexpected_count` is the count of record; polars computes the same row masks to know
which rows to quarantine, and the two must agree exactly.

A value past the public bounds of a column that clamps (`Schema.clamps`: the column's or the
dataset's `on_out_of_bounds: clamp`) does not fail its row: it is set to the nearest bound (in
the modelled units a date or datetime's bounds are checked in: days, units of its granularity;
an integer column's nearest whole number within them), and a categorical column's value not in
its list becomes its declared `other`. Both are per-row maps, so a stable transformation (as
OpenDP's clamp). The same GX expectations count them ("clamped", "other" instead of "bounds",
"category"); the report says per column how many values were changed, and how many passing rows
hold a changed value, which are the cells of the DP gate's histogram (`RowCells`).

The report is a diagnostic for the data owner computed on private rows: it is NOT
differentially private and is never released (privacy rule 5). It holds counts only, never a
raw value; the quarantine file does hold raw rows and stays with the data owner.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from privflow.core.errors import ConfigError, ValidationFailed
from privflow.data.io import UNREADABLE
from privflow.data.schema import TEMPORAL_TYPES, Column, Schema
from privflow.data.surface import CONVERTED, lower, read_values

NOT_DP_LABEL = (
    "NOT differentially private: diagnostic for the data owner computed on the private rows; "
    "never released with the model or the synthetic data."
)

Policy = Literal["strict", "quarantine"]
Check = Literal["missing_column", "extra_column", "unreadable", "type", "integer", "bounds", "category", "not_null"]
SCHEMA_LEVEL = "schema"
ROW_LEVEL = "row"

ROW_COLUMN = "_privflow_row"  # quarantine file: the row's 0-based position in the input
REASON_COLUMN = "_privflow_failed_checks"  # quarantine file: "column:check;..." for the row
ROWS = "(row)"  # the `column` of a failure that concerns the whole row (a line the reader could not read)


def numeric_dtype(dtype: pl.DataType) -> bool:
    """Whether a column's dtype holds numbers (every width of int and float, Decimal, booleans
    as 0/1, an all-null column): pre-flight's `_type_fits` admits a Parquet column by this same
    rule, so a column it accepts is read here."""
    return bool(dtype.is_numeric()) or dtype in (pl.Boolean, pl.Null)


_CHECK_ORDER = {c: i for i, c in enumerate(
    ("missing_column", "extra_column", "unreadable", "type", "integer", "not_null", "bounds", "category")
)}  # fmt: skip
Change = Literal["clamped", "other"]  # what the value checks do instead of failing a row (bounds, category)
_CHANGE_ORDER = {"clamped": _CHECK_ORDER["bounds"], "other": _CHECK_ORDER["category"]}


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


Gate = Callable[..., bool]  # gate(failing, passing) -> stop; given `cells=RowCells` where it takes that keyword


def _takes_cells(gate: Gate) -> bool:
    try:
        params = inspect.signature(gate).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "cells" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def ask_gate(gate: Gate, cells: RowCells) -> bool:
    """The gate's decision on `cells`: `gate(failing, passing, cells=cells)` where the callback
    takes a `cells` keyword (or **kwargs), else `gate(failing, passing)` as before."""
    if _takes_cells(gate):
        return bool(gate(cells.failing, cells.passing, cells=cells))
    return bool(gate(cells.failing, cells.passing))


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


# ----------------------------------------------------------------------------- coercion


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _rows(n: int) -> str:
    return f"{n} row{'s' if n != 1 else ''}"


def _null_where(mask: pl.Series, s: pl.Series) -> pl.Series:
    return pl.select(pl.when(mask).then(None).otherwise(s)).to_series().alias(s.name)


@dataclass
class _Coerced:
    frame: pl.DataFrame  # declared columns present in the input; numeric ones Float64, categoricals String
    masks: dict[tuple[str, str], pl.Series]  # (column, "type"|"integer") -> boolean row mask
    schema_failures: list[Failure]


def _normalise(df: pl.DataFrame, missing: tuple[str, ...] = ()) -> pl.DataFrame:
    """Text values lose the spaces around them (as numbers do when parsed: UCI's original files
    separate fields by ", ", so every category would otherwise fail), then empty strings and the
    schema's `missing_values` are missing values; Enum/Categorical columns are compared as
    strings. The schema refuses categories and tokens with surrounding spaces, which would
    never match."""
    tokens = pl.Series(["", *missing], dtype=pl.String)
    exprs = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, (pl.Enum, pl.Categorical)):
            text = pl.col(name).cast(pl.String)
        elif dtype == pl.String:
            text = pl.col(name)
        else:
            continue
        text = text.str.strip_chars()
        exprs.append(pl.when(text.is_in(tokens)).then(None).otherwise(text).alias(name))
    return df.with_columns(exprs) if exprs else df


def _raw_missing(s: pl.Series) -> pl.Series:
    """Missing as GX (pandas) sees it: null, or NaN in a float column."""
    m = s.is_null()
    if s.dtype in (pl.Float32, pl.Float64):
        m = m | s.is_nan().fill_null(False)
    return m


def _coerce(raw: pl.DataFrame, schema: Schema) -> _Coerced:
    """Cast each declared column to its modelled type (strict=False), counting what does not parse.

    A value that is present but not a number ("abc", "nan") is a row-level "type" failure,
    however many rows hold one: a verdict on the whole column would let one row decide the
    fate of every other (privacy rule 8), so only a column's dtype (public for Parquet) fails
    at schema level. In integer columns a finite number with a fraction is an "integer" failure.
    Date, datetime and boolean columns are converted first (`surface.read_values`: a date that
    does not parse with the column's format is a "type" failure); ignored columns are left out.
    """
    n = raw.height
    out: dict[str, pl.Series] = {}
    masks: dict[tuple[str, str], pl.Series] = {}
    failures: list[Failure] = []
    model = lower(schema)
    for col in schema.columns:
        if col.type == "ignore" or col.name not in raw.columns:
            continue
        s = raw.get_column(col.name)
        if col.type in CONVERTED:
            try:
                s, unparsed = read_values(s, col)
            except TypeError:
                detail = f"holds {s.dtype} values, which cannot be read as {col.type} values"
                failures.append(Failure(col.name, "type", n, SCHEMA_LEVEL, detail))
                dtype = pl.String if col.type == "boolean" else pl.Float64
                out[col.name] = pl.Series(col.name, [None] * n, dtype=dtype)
                continue
            if unparsed.any():
                masks[(col.name, "type")] = unparsed
            col = model.column(col.name)
        if col.is_categorical:
            try:
                out[col.name] = _labels(s, col)
            except Exception:
                detail = f"holds {s.dtype} values, which cannot be read as category labels"
                failures.append(Failure(col.name, "type", n, SCHEMA_LEVEL, detail))
                out[col.name] = pl.Series(col.name, [None] * n, dtype=pl.String)
            continue
        if s.dtype == pl.String:
            parsed = s.str.strip_chars().cast(pl.Float64, strict=False)
            bad = s.is_not_null() & (parsed.is_null() | parsed.is_nan().fill_null(False))
            parsed = _null_where(bad, parsed)
        elif numeric_dtype(s.dtype):
            parsed = s.cast(pl.Float64)
            parsed = _null_where(parsed.is_nan().fill_null(False), parsed)  # NaN counts as missing
            bad = pl.Series(col.name, [False] * n, dtype=pl.Boolean)
        else:
            detail = f"holds {s.dtype} values where {col.type} numbers are declared"
            failures.append(Failure(col.name, "type", n, SCHEMA_LEVEL, detail))
            out[col.name] = pl.Series(col.name, [None] * n, dtype=pl.Float64)
            continue
        if bad.any():
            masks[(col.name, "type")] = bad
        if col.type == "integer":
            frac = (parsed.is_finite() & (parsed != parsed.round(0))).fill_null(False)
            if frac.any():
                masks[(col.name, "integer")] = frac
        out[col.name] = parsed.alias(col.name)
    frame = pl.DataFrame(list(out.values())) if out else pl.DataFrame()
    return _Coerced(frame, masks, failures)


# ----------------------------------------------------------------------------- GX suite


def _gx_quiet() -> None:
    """No usage statistics (read when GX is imported); progress bars are switched off per context."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("GE_USAGE_STATS", "FALSE")


def import_gx() -> None:
    """Import Great Expectations (about a second here) with its usage statistics off, without
    building a context: the CLI does it while Prefect's temporary server starts."""
    _gx_quiet()
    import great_expectations  # noqa: F401
    import great_expectations.expectations  # noqa: F401


def _gx_exception(info: Any) -> str | None:
    """GX reports an evaluation error either flat or keyed by metric; find any raised one."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for v in info.values():
        if isinstance(v, dict) and v.get("raised_exception"):
            return str(v.get("exception_message"))
    return None


@dataclass
class _GxOutcome:
    counts: list[tuple[str, str, int]]  # (column, check, unexpected_count) per row-level expectation
    missing: list[str]
    extra: list[str]
    expectations: int


GX_CHUNK_ROWS = 250_000  # rows per Great Expectations batch (its pandas copy), whatever the table's size


_GX_SETUPS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[Any, Any, Any]] = {}


def _gx_setup(schema: Schema, raw_columns: list[str], coerced_columns: list[str]) -> tuple[Any, Any, Any]:
    """(batch definition, structure suite, value suite) for a schema and the frames' columns,
    built once per process: a table read in chunks validates every chunk with them, and a new
    GX context per call keeps its memory for good, so the process grows with every chunk."""
    key = (schema.model_dump_json(), tuple(raw_columns), tuple(coerced_columns))
    if key not in _GX_SETUPS:
        _GX_SETUPS[key] = _build_gx(schema, raw_columns, coerced_columns, f"privflow-{len(_GX_SETUPS)}")
    return _GX_SETUPS[key]


def _build_gx(schema: Schema, raw_columns: list[str], coerced_columns: list[str], name: str) -> tuple[Any, Any, Any]:
    """Structure suite on the frame as given (columns match the declared set exactly, each
    declared column exists, not-null where not nullable); value suite on the coerced frame
    (public bounds, declared categories)."""
    _gx_quiet()
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas(name).add_dataframe_asset("table")
    batch_def = asset.add_batch_definition_whole_dataframe("whole")

    def tagged(exp_cls: Any, name: str, check: str, **kwargs: Any) -> Any:
        return exp_cls(meta={"privflow": {"column": name, "check": check}}, **kwargs)

    structure = gx.ExpectationSuite(name=f"{schema.dataset.name}-structure")
    structure.add_expectation(
        tagged(gxe.ExpectTableColumnsToMatchSet, "*", "columns", column_set=schema.names, exact_match=True)
    )
    for col in schema.columns:
        structure.add_expectation(tagged(gxe.ExpectColumnToExist, col.name, "missing_column", column=col.name))
        if not col.nullable and col.type != "ignore" and col.name in raw_columns:
            structure.add_expectation(tagged(gxe.ExpectColumnValuesToNotBeNull, col.name, "not_null", column=col.name))

    values = gx.ExpectationSuite(name=f"{schema.dataset.name}-values")
    clamp = _clamping(schema)
    for col in lower(schema).columns:  # on the coerced frame: date bounds as days, booleans as labels
        if col.name not in coerced_columns:
            continue
        if col.is_categorical:  # the values not in the list: failing, or counted and sent to `other`
            exp = tagged(gxe.ExpectColumnValuesToBeInSet, col.name, "other" if col.other is not None else "category",
                         column=col.name, value_set=list(col.categories or ()))  # fmt: skip
        else:  # the values past the bounds: failing, or counted and clamped
            lo, hi = col.bounds  # type: ignore[misc]
            exp = tagged(gxe.ExpectColumnValuesToBeBetween, col.name, "clamped" if col.name in clamp else "bounds",
                         column=col.name, min_value=lo, max_value=hi)  # fmt: skip
        values.add_expectation(exp)
    return batch_def, structure, values


def _labels(s: pl.Series, col: Column) -> pl.Series:
    """A categorical column's values as label text. Numbers stored for numeric labels (a
    Parquet column of 0.0 / 1.0 for categories '0' / '1', as pre-flight's `_type_fits` admits)
    take the declared label of the same value; anything else is cast to text (and, if not a
    label, fails the category check)."""
    text = s.cast(pl.String)
    if s.dtype == pl.Boolean or not s.dtype.is_numeric():
        return text
    labels: dict[float, str] = {}
    for label in col.categories or ():
        try:
            labels.setdefault(float(label), label)
        except ValueError:
            continue
    if not labels:
        return text
    return s.cast(pl.Float64).replace_strict(labels, default=text, return_dtype=pl.String)


_WIDE_INTEGERS = (pl.Int128, pl.UInt128)  # no pandas / Arrow conversion


def _pandas_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with the numeric storages pandas cannot take (128-bit integers) as floats: the
    structure suite looks at columns and nulls only, and the value suite gets coerced floats."""
    wide = [c for c, t in frame.schema.items() if t in _WIDE_INTEGERS]
    return frame.with_columns(pl.col(wide).cast(pl.Float64)) if wide else frame


def _run_gx(raw: pl.DataFrame, coerced: pl.DataFrame, schema: Schema) -> _GxOutcome:
    """Run the schema's two suites (`_gx_setup`) on whole-dataframe batches of `raw` and
    `coerced`. Results are kept at counts (no unexpected values)."""
    batch_def, structure, values = _gx_setup(schema, raw.columns, coerced.columns)
    fmt = {"result_format": "BASIC", "partial_unexpected_count": 0}
    outcome = _GxOutcome([], [], [], 0)
    counts: dict[tuple[str, str], int] = {}
    for suite, frame in ((structure, raw), (values, coerced)):
        if not suite.expectations:
            continue
        # GX validates a pandas copy: chunks of rows keep that copy bounded on large tables (the
        # row-level counts add up; the table-level checks see the same columns in every chunk)
        for k, start in enumerate(range(0, max(frame.height, 1), GX_CHUNK_ROWS)):
            chunk = _pandas_ready(frame.slice(start, GX_CHUNK_ROWS)).to_pandas()
            for r in (
                batch_def.get_batch(batch_parameters={"dataframe": chunk}).validate(suite, result_format=fmt).results
            ):
                tag = r.expectation_config.meta["privflow"]
                column, check = tag["column"], tag["check"]
                problem = _gx_exception(r.exception_info)
                if problem:
                    raise RuntimeError(f"internal: GX could not evaluate {check} on '{column}': {problem}")
                if k == 0:
                    outcome.expectations += 1
                if check == "columns":
                    mismatched = (r.result.get("details") or {}).get("mismatched") or {}
                    outcome.extra = sorted(str(c) for c in mismatched.get("unexpected") or [])
                elif check == "missing_column":
                    if not r.success and k == 0:
                        outcome.missing.append(column)
                else:
                    counts[(column, check)] = counts.get((column, check), 0) + int(
                        r.result.get("unexpected_count") or 0
                    )
    outcome.counts = [(column, check, n) for (column, check), n in counts.items()]
    return outcome


# ----------------------------------------------------------------------------- validate


def _clamping(schema: Schema) -> frozenset[str]:
    """The columns whose values past the bounds are clamped (read off the schema as written: lowering
    a date or datetime column keeps its name, not its `on_out_of_bounds`)."""
    return frozenset(c.name for c in schema.columns if schema.clamps(c))


def _tails(schema: Schema) -> dict[str, bool]:
    """A report's public flags: whether the schema clamps some column, declares some `other`."""
    return {"clamp": bool(_clamping(schema)), "other": any(c.other is not None for c in schema.columns)}


def _value_masks(
    coerced: pl.DataFrame, raw: pl.DataFrame, schema: Schema, clamp: Collection[str] = ()
) -> dict[tuple[str, str], pl.Series]:
    """The polars twin of each GX row-level expectation: which rows fail (for the quarantine), or,
    keyed "clamped" / "other", which rows hold a value to clamp (a column in `clamp`) or to send to
    the column's `other`. `schema` is the modelled one (`surface.lower`)."""
    masks: dict[tuple[str, str], pl.Series] = {}
    for col in schema.columns:
        if col.name not in coerced.columns:
            continue
        s = coerced.get_column(col.name)
        if not col.nullable:
            masks[(col.name, "not_null")] = _raw_missing(raw.get_column(col.name))
        if col.is_categorical:
            unknown = ~s.is_in(list(col.categories or ()))
            check = "other" if col.other is not None else "category"
        else:
            lo, hi = col.bounds  # type: ignore[misc]
            unknown = (s < lo) | (s > hi)
            check = "clamped" if col.name in clamp else "bounds"
        masks[(col.name, check)] = s.is_not_null() & unknown.fill_null(False)
    return masks


def _clamp_limits(col: Column) -> tuple[float, float]:
    """The nearest values within a modelled column's bounds: the bounds, for an integer column the
    whole numbers just inside them."""
    lo, hi = col.bounds  # type: ignore[misc]
    if col.type == "integer":
        return float(math.ceil(lo)), float(math.floor(hi))
    return float(lo), float(hi)


def _apply_changes(frame: pl.DataFrame, model: Schema, changes: dict[tuple[str, str], pl.Series]) -> pl.DataFrame:
    """Each counted value past a clamping column's bounds set to the nearest bound, each counted value
    not in a categorical's list set to its `other` (per row; every other value as it is)."""
    exprs = []
    for (column, change), mask in changes.items():
        col = model.column(column)
        s = frame.get_column(column)
        if change == "clamped":
            lo, hi = _clamp_limits(col)
            new = pl.select(pl.when(mask).then(s.clip(lo, hi)).otherwise(s)).to_series()
        else:
            new = pl.select(pl.when(mask).then(pl.lit(col.other, dtype=pl.String)).otherwise(s)).to_series()
        exprs.append(new.alias(column))
    return frame.with_columns(exprs) if exprs else frame


def _values(n: int) -> str:
    return f"{n} value{'s' if n != 1 else ''}"


def _change_detail(col: Column, change: str, n: int) -> str:
    """What an `Adjustment` says (`col` as the schema writes it)."""
    if change == "other":
        return f"{_values(n)} not in the declared list of {len(col.categories or ())}, read as '{col.other}'"
    if col.type in TEMPORAL_TYPES:
        lo, hi = col.bound_texts
    else:
        lo, hi = (_fmt(b) for b in col.bounds or ())
    return f"{_values(n)} outside the public bounds [{lo}, {hi}], clamped to the nearest bound"


def _adjustment(col: Column, change: str, n: int) -> Adjustment:
    return Adjustment(col.name, "clamped" if change == "clamped" else "other", n, _change_detail(col, change, n))


def _row_changes(changes: dict[tuple[str, str], pl.Series], row_fail: pl.Series) -> tuple[int, int, int]:
    """(passing rows with a clamped value, with a value sent to other, with both)."""
    n = row_fail.len()
    none = pl.Series([False] * n, dtype=pl.Boolean)
    clamped, other = none, none
    for (_, change), mask in changes.items():
        if change == "clamped":
            clamped = clamped | mask
        else:
            other = other | mask
    clamped, other = clamped & ~row_fail, other & ~row_fail
    return int(clamped.sum()), int(other.sum()), int((clamped & other).sum())


def _detail(col: Column | None, check: str, n: int) -> str:
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
        lo, hi = col.bounds  # type: ignore[misc]
        return f"{_rows(n)} outside the public bounds [{_fmt(lo)}, {_fmt(hi)}]"
    if check == "category":
        return f"{_rows(n)} with a category not in the declared list of {len(col.categories or ())}"
    if check == "not_null":
        return f"{_rows(n)} missing a value, but the column is not nullable"
    raise ValueError(check)


CHECK_ADVICE = "Run `privflow check --data FILE --schema S` to see which rows and columns fail (curator-only, free)."
QUARANTINE_ADVICE = (
    f"Fix those rows, or use the quarantine policy to set them aside and train on the rest. {CHECK_ADVICE}"
)
_NOTHING_PASSES = f"Fix the file or the schema: with every row set aside, there is nothing to use. {CHECK_ADVICE}"
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


def _fail(report: ValidationReport, reason: str, advice: str = QUARANTINE_ADVICE) -> ValidationFailed:
    err = ValidationFailed(_message(report, reason, advice))
    err.report = report  # type: ignore[attr-defined]
    return err


def _typed(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    exprs = []
    for col in schema.columns:
        if col.is_categorical:
            exprs.append(pl.col(col.name).cast(pl.Enum(list(col.categories or ()))))
        elif col.type == "integer":
            exprs.append(pl.col(col.name).round(0).cast(pl.Int64))
        else:
            exprs.append(pl.col(col.name).cast(pl.Float64))
    return frame.select(exprs)


def _write_quarantine(
    df: pl.DataFrame,
    masks: dict[tuple[str, str], pl.Series],
    row_fail: pl.Series,
    order: dict[str, int],
    path: Path,
    row_offset: int = 0,
    append: bool = False,
) -> None:
    """Failing rows as given (raw values), with their input position (`row_offset` + their place
    in `df`) and the checks they fail; `append` adds them to the file without a header."""
    n = df.height
    reasons = pl.Series(REASON_COLUMN, [""] * n)
    ordered = sorted(masks.items(), key=lambda kv: (order.get(kv[0][0], -1), _CHECK_ORDER[kv[0][1]]))
    for (column, check), mask in ordered:
        tag = f"{column}:{check}"
        joined = pl.when(reasons == "").then(pl.lit(tag)).otherwise(reasons + ";" + tag)
        reasons = pl.select(pl.when(mask).then(joined).otherwise(reasons)).to_series().alias(REASON_COLUMN)
    as_text = [pl.col(c).cast(pl.String) for c, t in df.schema.items() if isinstance(t, (pl.Enum, pl.Categorical))]
    rows = (
        df.with_columns(as_text)
        .with_columns(pl.Series(ROW_COLUMN, range(row_offset, row_offset + n), dtype=pl.Int64), reasons)
        .filter(row_fail)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        with open(path, "ab") as f:
            rows.write_csv(f, include_header=False)
    else:
        rows.write_csv(path)


def _prepared(df: pl.DataFrame, schema: Schema) -> tuple[pl.Series | None, pl.DataFrame, _Coerced]:
    """(the rows the reader could not read, or None; the normalised raw frame; its coercion):
    what `validate` and `typed_rows` check. An ignored column's values are never read: only its
    name is checked (the quarantine file, for the data owner, keeps the rows as given)."""
    unreadable = df.get_column(UNREADABLE).is_not_null() if UNREADABLE in df.columns else None
    df = df.drop(UNREADABLE, strict=False)
    ignored = [c.name for c in schema.columns if c.type == "ignore" and c.name in df.columns]
    df = df.with_columns(pl.lit(None, dtype=pl.String).alias(c) for c in ignored) if ignored else df
    raw = _normalise(df, schema.dataset.missing_values)
    return unreadable, raw, _coerce(raw, schema)


def typed_rows(df: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """The rows of `df` that pass every row-level check, typed and with values clamped or sent to
    `other`, as `validate` returns them, computed with polars alone: `validate` checks this polars
    twin against Great Expectations on every call, and reading a table back (its rows' keyed
    digests, privacy/fingerprint.py) need not import GX and pandas for it. A table missing a
    declared column or holding an undeclared one has no passing row here."""
    unreadable, raw, co = _prepared(df, schema)
    model = lower(schema)
    if set(schema.names) != set(raw.columns) or co.schema_failures:
        return pl.DataFrame()
    masks = dict(co.masks)
    changes: dict[tuple[str, str], pl.Series] = {}
    for key, mask in _value_masks(co.frame, raw, model, _clamping(schema)).items():
        if mask.any():
            (changes if key[1] in _CHANGE_ORDER else masks)[key] = mask
    row_fail = pl.Series([False] * raw.height, dtype=pl.Boolean)
    for mask in masks.values():
        row_fail = row_fail | mask
    if unreadable is not None:
        row_fail = row_fail | unreadable
    return _typed(_apply_changes(co.frame, model, changes).filter(~row_fail), model)


def validate(
    df: pl.DataFrame,
    schema: Schema,
    policy: Policy = "strict",
    quarantine_path: Path | None = None,
    gate: Gate | None = None,
    *,
    row_offset: int = 0,
    append: bool = False,
    advice: str = QUARANTINE_ADVICE,
) -> tuple[pl.DataFrame, ValidationReport]:
    """Check `df` against `schema`; return the clean typed frame (schema order) and the report.

    With `gate` (the pipeline's DP validation gate, privacy/mechanisms/validation_gate.py),
    the decision to stop is not taken on exact counts: `gate(failing_rows, passing_rows)`
    (with `cells=RowCells(...)`, the rows' partition, where the callback takes that keyword:
    `ask_gate`) releases DP counts and returns whether to stop; a table with no row at all goes
    to the gate too. Values past a clamping column's bounds are clamped and values not in a
    categorical's list sent to its `other` (module docstring): they do not fail their row.
    Each row fails or passes on its own values (the header's structure is checked before, in
    the pre-flight); a line the reader could not read (`privflow.data.io.UNREADABLE`)
    is a failing row. If the gate says go, failing rows are dropped (strict) or set aside
    (quarantine) and the rest is returned, possibly empty: later mechanisms are DP on any
    number of rows. If it says stop, ValidationFailed carries only the report, whose exact
    counts are for the curator; the caller words the message from the DP counts.

    Typed: numeric -> Float64, integer -> Int64, categorical -> Enum of the declared list, in the
    columns of the modelled schema (`surface.lower`): a date or datetime as Int64 units, a boolean
    as the Enum of its labels, and no ignored column.
    strict: any failure raises ValidationFailed. quarantine: rows failing a row-level check are
    written to `quarantine_path` (CSV of the raw rows plus `_privflow_row`, their 0-based
    position, and `_privflow_failed_checks`; rewritten on every call, header only when no row
    fails; `row_offset` is added to the position and `append` adds to the file: how
    `validate_chunks` writes one file for a table read in chunks) and left out of the returned
    frame. Schema-level failures (missing or undeclared column, a whole column of the wrong
    type) and a quarantine that leaves no row always raise.
    A raised ValidationFailed carries the report as `.report`; its message ends with `advice`
    for failing rows (`SCORED_ADVICE` where every row must be answered: score, the API).
    """
    if policy not in ("strict", "quarantine"):
        raise ConfigError(f"Validation policy must be 'strict' or 'quarantine', got '{policy}'.")
    if policy == "quarantine" and quarantine_path is None:
        raise ConfigError("The quarantine policy needs a quarantine_path for the rows it sets aside.")
    if df.height == 0 and gate is None:
        raise ValidationFailed(
            f"Dataset '{schema.dataset.name}': the table has no rows, so there is nothing to validate or train on."
        )

    given = df  # as read: the quarantine file keeps the reader's reason for a line it could not read
    unreadable, raw, co = _prepared(df, schema)
    n = raw.height
    model = lower(schema)
    gx_out = _run_gx(raw, co.frame, schema)

    declared, present = set(schema.names), set(raw.columns)
    if sorted(gx_out.missing) != sorted(declared - present) or gx_out.extra != sorted(present - declared):
        raise RuntimeError("internal: Great Expectations and polars disagree about the table's columns")

    masks = dict(co.masks)
    changes: dict[tuple[str, str], pl.Series] = {}  # (column, "clamped" | "other") -> rows whose value changes
    twins = _value_masks(co.frame, raw, model, _clamping(schema))
    for column, check, gx_count in gx_out.counts:
        mask = twins[(column, check)]
        if int(mask.sum()) != gx_count:
            raise RuntimeError(
                f"internal: GX counts {gx_count} rows failing {check} on '{column}', polars {int(mask.sum())}"
            )
        if gx_count:
            (changes if check in _CHANGE_ORDER else masks)[(column, check)] = mask
    if unreadable is not None and unreadable.any():
        # a line the reader could not read fails as a row, once, and no column's count includes it
        masks = {key: mask & ~unreadable for key, mask in masks.items()}
        masks = {key: mask for key, mask in masks.items() if mask.any()}
        masks[(ROWS, "unreadable")] = unreadable
        changes = {key: mask & ~unreadable for key, mask in changes.items()}
        changes = {key: mask for key, mask in changes.items() if mask.any()}

    failures = [
        Failure(c, "missing_column", n, SCHEMA_LEVEL, "is declared in the schema but missing from the table")
        for c in gx_out.missing
    ]
    failures += [
        Failure(c, "extra_column", n, SCHEMA_LEVEL, "is in the table but not declared in the schema")
        for c in gx_out.extra
    ]
    failures += co.schema_failures
    for (column, check), mask in masks.items():
        k = int(mask.sum())
        detail = _detail(None if column == ROWS else schema.column(column), check, k)
        failures.append(Failure(column, check, k, ROW_LEVEL, detail))  # type: ignore[arg-type]
    order = {ROWS: -1, **{c: i for i, c in enumerate(schema.names)}}
    failures.sort(key=lambda f: (order.get(f.column, len(order)), _CHECK_ORDER[f.check]))
    adjustments = sorted(
        (_adjustment(schema.column(c), k, int(m.sum())) for (c, k), m in changes.items()),
        key=lambda a: (order.get(a.column, len(order)), _CHANGE_ORDER[a.change]),
    )

    row_fail = pl.Series([False] * n, dtype=pl.Boolean)
    for mask in masks.values():
        row_fail = row_fail | mask
    schema_level = any(f.level == SCHEMA_LEVEL for f in failures)
    failing = n if schema_level else int(row_fail.sum())
    rows_clamped, rows_other, rows_both = (0, 0, 0) if schema_level else _row_changes(changes, row_fail)

    def report(quarantined: int, qpath: str | None) -> ValidationReport:
        return ValidationReport(
            dataset=schema.dataset.name,
            policy=policy,
            total_rows=n,
            failing_rows=failing,
            quarantined_rows=quarantined,
            failures=tuple(failures),
            expectations=gx_out.expectations,
            quarantine_path=qpath,
            adjustments=tuple(adjustments),
            rows_clamped=rows_clamped,
            rows_other=rows_other,
            rows_both=rows_both,
            **_tails(schema),
        )

    if schema_level:
        raise _fail(report(0, None), "schema-level problem")
    if gate is not None:
        if ask_gate(gate, report(0, None).cells):
            err = ValidationFailed(f"Validation of dataset '{schema.dataset.name}' failed ({policy} policy).")
            err.report = report(0, None)  # type: ignore[attr-defined]
            raise err
    elif failures and policy == "strict":
        raise _fail(report(0, None), "strict policy", advice)

    if policy == "quarantine":
        assert quarantine_path is not None
        _write_quarantine(given, masks, row_fail, order, Path(quarantine_path), row_offset, append)
        rep = report(failing, str(quarantine_path))
    else:
        rep = report(0, None)
    clean = _apply_changes(co.frame, model, changes).filter(~row_fail)
    if clean.height == 0 and gate is None:
        raise _fail(
            rep, "no row passes, nothing is left to train on", _NOTHING_PASSES if policy == "quarantine" else advice
        )
    return _typed(clean, model), rep


def validate_chunks(
    chunks: Iterable[pl.DataFrame],
    schema: Schema,
    policy: Policy,
    quarantine_path: Path | None,
    gate: Gate,
    consume: Callable[[pl.DataFrame], None],
) -> ValidationReport:
    """`validate` for a table read in chunks (a streamed run, privflow/data/chunked.py): each chunk is
    checked as `validate` checks a table and its clean typed rows go to `consume` as they come;
    failing rows are dropped or written to the one quarantine file with their position in the
    whole table. The gate then decides once, on the total number of failing rows (and the
    summed cells of `RowCells`, `ask_gate`), as it does for a table read whole; if it says
    stop, ValidationFailed carries the merged report (and whatever `consume` built must be
    discarded: nothing was released).
    """
    if policy == "quarantine" and quarantine_path is None:
        raise ConfigError("The quarantine policy needs a quarantine_path for the rows it sets aside.")
    reports: list[ValidationReport] = []
    for chunk in chunks:
        if chunk.height == 0:
            continue
        offset = sum(r.total_rows for r in reports)
        clean, rep = validate(
            chunk, schema, policy, quarantine_path, lambda _f, _p: False, row_offset=offset, append=bool(reports)
        )
        reports.append(rep)
        consume(clean)
    if not reports:  # no row at all: the gate decides, as for any other count
        where = str(quarantine_path) if quarantine_path else None
        reports.append(ValidationReport(schema.dataset.name, policy, 0, 0, 0, (), 0, where, **_tails(schema)))
    report = merged_report(reports, schema)
    if ask_gate(gate, report.cells):
        err = ValidationFailed(f"Validation of dataset '{schema.dataset.name}' failed ({policy} policy).")
        err.report = report  # type: ignore[attr-defined]
        raise err
    return report


def merged_report(reports: Sequence[ValidationReport], schema: Schema) -> ValidationReport:
    """One report for a table checked in chunks: rows and failing rows summed, each column's
    check (and each column's changed values) once with its rows summed, the passing rows with a
    changed value summed (so the same report as for the table read whole)."""
    counts: dict[tuple[str, str, str], int] = {}
    changed: dict[tuple[str, str], int] = {}
    for rep in reports:
        for f in rep.failures:
            key = (f.column, f.check, f.level)
            counts[key] = counts.get(key, 0) + f.failing_rows
        for a in rep.adjustments:
            changed[(a.column, a.change)] = changed.get((a.column, a.change), 0) + a.values
    order = {c: i for i, c in enumerate(schema.names)}
    adjustments = sorted(
        (_adjustment(schema.column(c), k, n) for (c, k), n in changed.items()),
        key=lambda a: (order.get(a.column, -1), _CHANGE_ORDER[a.change]),
    )
    failures = sorted(
        (
            Failure(c, k, n, lv, _detail(None if c == ROWS else schema.column(c), k, n))  # type: ignore[arg-type]
            for (c, k, lv), n in counts.items()
        ),
        key=lambda f: (order.get(f.column, -1), _CHECK_ORDER[f.check]),
    )
    first = reports[0]
    return ValidationReport(
        dataset=first.dataset,
        policy=first.policy,
        total_rows=sum(r.total_rows for r in reports),
        failing_rows=sum(r.failing_rows for r in reports),
        quarantined_rows=sum(r.quarantined_rows for r in reports),
        failures=tuple(failures),
        expectations=first.expectations,
        quarantine_path=first.quarantine_path,
        adjustments=tuple(adjustments),
        rows_clamped=sum(r.rows_clamped for r in reports),
        rows_other=sum(r.rows_other for r in reports),
        rows_both=sum(r.rows_both for r in reports),
        clamp=first.clamp,
        other=first.other,
    )
