"""The value checks in polars, and the values changed instead of failing their row.

`value_masks` is the polars twin of each Great Expectations row-level expectation
(privflow/data/validation/expectations.py): which rows fail a value check, and which rows hold a
value to change. A value past the public bounds of a column that clamps (`Schema.clamps`: the
column's or the dataset's `on_out_of_bounds: clamp`) does not fail its row: it is set to the
nearest bound (in the modelled units a date or datetime's bounds are checked in: days, units of
its granularity; an integer column's nearest whole number within them), and a categorical
column's value not in its list becomes its declared `other`. Both are per-row maps, so a stable
transformation (as OpenDP's clamp). The report says per column how many values were changed
(`Adjustment`), and how many passing rows hold a changed value (`row_changes`), which are the
cells of the DP gate's histogram (`RowCells`).
"""

from __future__ import annotations

import math
from collections.abc import Collection

import polars as pl

from privflow.data.schema import TEMPORAL_TYPES, Column, Schema
from privflow.data.validation.report import Adjustment, number_text


def clamping(schema: Schema) -> frozenset[str]:
    """The columns whose values past the bounds are clamped (read off the schema as written: lowering
    a date or datetime column keeps its name, not its `on_out_of_bounds`)."""
    return frozenset(c.name for c in schema.columns if schema.clamps(c))


def _raw_missing(s: pl.Series) -> pl.Series:
    """Missing as GX (pandas) sees it: null, or NaN in a float column."""
    m = s.is_null()
    if s.dtype in (pl.Float32, pl.Float64):
        m = m | s.is_nan().fill_null(False)
    return m


def value_masks(
    coerced: pl.DataFrame, raw: pl.DataFrame, schema: Schema, clamp: Collection[str] = ()
) -> dict[tuple[str, str], pl.Series]:
    """The polars twin of each GX row-level expectation: which rows fail (for the quarantine), or,
    keyed "clamped" / "other", which rows hold a value to clamp (a column in `clamp`) or to send to
    the column's `other`. `schema` is the modelled one (`lowering.lower`)."""
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


def apply_changes(frame: pl.DataFrame, model: Schema, changes: dict[tuple[str, str], pl.Series]) -> pl.DataFrame:
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


def row_changes(changes: dict[tuple[str, str], pl.Series], row_fail: pl.Series) -> tuple[int, int, int]:
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


def _values(n: int) -> str:
    return f"{n} value{'s' if n != 1 else ''}"


def _change_detail(col: Column, change: str, n: int) -> str:
    """What an `Adjustment` says (`col` as the schema writes it)."""
    if change == "other":
        return f"{_values(n)} not in the declared list of {len(col.categories or ())}, read as '{col.other}'"
    if col.type in TEMPORAL_TYPES:
        lo, hi = col.bound_texts
    else:
        lo, hi = (number_text(b) for b in col.bounds or ())
    return f"{_values(n)} outside the public bounds [{lo}, {hi}], clamped to the nearest bound"


def adjustment(col: Column, change: str, n: int) -> Adjustment:
    """The report's line for `n` values of `col` clamped ("clamped") or sent to `other`."""
    return Adjustment(col.name, "clamped" if change == "clamped" else "other", n, _change_detail(col, change, n))
