"""Lowering: the table's surface types lowered to the modelled ones, and values converted both ways.

A schema is written in the types of the table, its surface (privflow/data/schema.py): dates and
datetimes as text in their formats, booleans as their labels, numbers to their `decimals`,
identifiers to ignore. The codec, the copula, the DP marginals and the target head take only
numeric, integer and categorical columns. This module is the one place that maps between the
two, from the public schema alone (privacy rule 2: nothing here is read off the rows as a
statistic):

- `lower`: the modelled schema. date -> integer (days since 1970-01-01), datetime -> integer
  (units of its granularity since 1970-01-01T00:00:00), both on the public bounds and marked as
  calendar columns (`Column.calendar_unit`), which the copula codec and the DP marginals see
  through their calendar parts (privflow/data/calendar.py: the day or the year and day of year,
  the time of day), so that times on a grid and seasons are kept; boolean -> categorical with the categories (true
  label, false label); ignore -> dropped; numeric, integer and categorical as they are. The
  schema's rules between columns are kept (a conditional's date or datetime value in modelled
  units: privflow/data/rules.py, `lower_rules`), so a codec's schema holds them for the sampler.
- `read_values`: one raw column of a lowered type -> its modelled values, before the checks
  (privflow/data/validation/coerce.py calls it while it coerces a table, so every reader of
  rows gets it). Text that does not parse with the column's format is a failing value of its
  row, never a refusal of the file (privacy rule 8).
- `to_surface`: a decoded (modelled) frame -> the table as the input is written: dates and
  datetimes as text in the column's format (for CSV and Parquet alike, so a written table reads
  back under the same schema), booleans as their labels, numeric columns rounded to their
  `decimals`, ignored columns absent.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable

import polars as pl

from privflow.data.schema import TEMPORAL_TYPES, Column, Schema, time_value

CONVERTED = (*TEMPORAL_TYPES, "boolean")  # the types whose values `read_values` converts


@functools.lru_cache(maxsize=64)
def lower(schema: Schema) -> Schema:
    """The modelled schema of `schema` (module docstring); `schema` itself when it has nothing
    to lower, so lowering twice is lowering once."""
    if all(c.modelled for c in schema.columns):
        return schema
    from privflow.data.rules import lower_rules  # the rules, their date values in modelled units

    columns = tuple(lower_column(c) for c in schema.columns if c.type != "ignore")
    return Schema(
        dataset=schema.dataset,
        columns=columns,
        target=schema.target,
        target_positive=schema.target_positive,
        rules=lower_rules(schema),
    )


def lower_column(col: Column) -> Column:
    """One column of a modelled type (an ignore column has none: see `lower`)."""
    if col.type in TEMPORAL_TYPES:
        lo, hi = col.bounds or (0.0, 0.0)
        bounds = (float(int(lo) // col.step), float(int(hi) // col.step))
        atoms = tuple(float(int(a) // col.step) for a in col.atoms)
        lowered = Column(name=col.name, type="integer", bounds=bounds, nullable=col.nullable, atoms=atoms)
        return lowered.as_calendar(86_400 if col.type == "date" else col.step)
    if col.type == "boolean":
        return Column(name=col.name, type="categorical", categories=col.true_false, nullable=col.nullable)
    if col.modelled:
        return col
    raise ValueError(f"column '{col.name}' of type {col.type} is not modelled")


def output_names(schema: Schema) -> list[str]:
    """The columns of a synthetic table, in schema order: all but the ignored ones."""
    return [c.name for c in schema.columns if c.type != "ignore"]


# ----------------------------------------------------------------------------- input


def read_values(s: pl.Series, col: Column) -> tuple[pl.Series, pl.Series]:
    """A raw column of a date, datetime or boolean column (text already stripped and missing
    tokens already null, as validation normalises it) -> (its modelled values, the mask of
    present values that do not parse). Temporal columns give Float64 units (an integer column's
    coerced form), booleans the label text (a value that is neither label stays as it is and
    fails the category check). TypeError when the column's storage cannot hold the type (a
    Parquet column of another type: a fact of the file, not of a row)."""
    none = pl.Series(s.name, [False] * s.len(), dtype=pl.Boolean)
    if col.type == "boolean":
        return _booleans(s, col), none
    if col.type not in TEMPORAL_TYPES:
        raise ValueError(f"column '{col.name}' of type {col.type} has no values to convert")
    if s.dtype == pl.String:
        units = _map_unique(s, col.time_units, pl.Int64)
        return units.cast(pl.Float64), s.is_not_null() & units.is_null()
    if s.dtype == pl.Null:
        return pl.Series(s.name, [None] * s.len(), dtype=pl.Float64), none
    if s.dtype == pl.Date:
        seconds = s.cast(pl.Int64) * 86_400
    elif isinstance(s.dtype, pl.Datetime):
        seconds = s.dt.epoch("s")
    else:
        raise TypeError(f"{s.dtype} values cannot be read as {col.type}s")
    per_unit = 86_400 if col.type == "date" else col.step
    return (seconds // per_unit).cast(pl.Float64).alias(s.name), none


def _booleans(s: pl.Series, col: Column) -> pl.Series:
    true, false = col.true_false
    if s.dtype == pl.Boolean:
        return pl.select(pl.when(s).then(pl.lit(true)).otherwise(pl.lit(false))).to_series().alias(s.name)
    if s.dtype == pl.String:
        folded = s.str.to_lowercase()
        known = pl.when(folded == true.casefold()).then(pl.lit(true)).when(folded == false.casefold())
        return pl.select(known.then(pl.lit(false)).otherwise(s)).to_series().alias(s.name)
    if s.dtype == pl.Null or s.dtype.is_numeric():
        return s  # numbers stored for numeric labels are matched as a categorical column's are
    raise TypeError(f"{s.dtype} values cannot be read as booleans")


def _map_unique(s: pl.Series, fn: Callable[..., object], dtype: pl.DataType | type[pl.DataType]) -> pl.Series:
    """`fn` applied once per distinct present value of `s` (a table holds far fewer distinct
    dates than rows), nulls staying null."""
    distinct = s.drop_nulls().unique()
    if distinct.len() == 0:
        return pl.Series(s.name, [None] * s.len(), dtype=dtype)
    mapped = pl.Series([fn(v) for v in distinct.to_list()], dtype=dtype)
    return s.replace_strict(distinct, mapped, default=None, return_dtype=dtype).alias(s.name)


# ----------------------------------------------------------------------------- output


def to_surface(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """A decoded frame of `lower(schema)` as the table is written (module docstring): the
    columns of `output_names(schema)` that `frame` holds, in schema order."""
    out: list[pl.Series] = []
    for col in schema.columns:
        if col.type == "ignore" or col.name not in frame.columns:
            continue
        s = frame.get_column(col.name)
        if col.type in TEMPORAL_TYPES:
            s = _time_texts(s.cast(pl.Int64), col)
        elif col.type == "boolean":
            s = s.cast(pl.String)
        elif col.type == "numeric" and col.decimals is not None:
            s = rounded(s, col)
        out.append(s)
    return pl.DataFrame(out) if out else pl.DataFrame()


def _writer(col: Column) -> Callable[[object], object]:
    return lambda units: col.time_text(int(units))  # type: ignore[call-overload]


# strftime directives that Python (the C library's strftime) and polars (chrono) write alike for
# years 1000..9999, whatever the locale: numbers only, zero-padded (no names, no %-d flags)
_SAME_DIRECTIVES = frozenset("YmdHMSjy%")
_DIRECTIVE = re.compile(r"%(.?)", re.DOTALL)


@functools.lru_cache(maxsize=256)
def _vector_format(col: Column) -> bool:
    """Whether `_time_texts` may write the column with polars' strftime: a format of
    `_SAME_DIRECTIVES` only, and bounds within years 1000..9999 (four-digit years either way)."""
    if col.bounds is None or any(d not in _SAME_DIRECTIVES for d in _DIRECTIVE.findall(col.time_format)):
        return False
    try:
        years = [time_value(int(b), col.type).year for b in col.bounds]
    except (OverflowError, ValueError):
        return False
    return all(1000 <= y <= 9999 for y in years)


def _time_texts(units: pl.Series, col: Column) -> pl.Series:
    """Modelled units (Int64, nulls kept) -> text in the column's format, as `Column.time_text`
    writes each one: vectorised (polars' strftime) for the formats `_vector_format` admits, one
    Python call per distinct value otherwise."""
    if not _vector_format(col):
        return _map_unique(units, _writer(col), pl.String)
    if col.type == "date":
        moments = (units * col.step).cast(pl.Int32).cast(pl.Date)
    else:
        moments = (units * (col.step * 1_000_000)).cast(pl.Datetime("us"))
    return moments.dt.strftime(col.time_format).alias(units.name)


def rounded(s: pl.Series, col: Column) -> pl.Series:
    """Values rounded to the column's decimals and kept inside its bounds on that grid (a bound
    that is not a multiple of the last decimal rounds inward, so the value still passes its check)."""
    d = int(col.decimals or 0)
    q = 10.0**d
    lo, hi = col.bounds or (-math.inf, math.inf)
    low, high = math.ceil(lo * q) / q, math.floor(hi * q) / q
    return s.cast(pl.Float64).round(d).clip(low, high).alias(s.name)


def csv_text(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """A `to_surface` frame ready for a CSV file: each numeric column that declares `decimals`
    as text with exactly that many decimals (3.10, not 3.1; 4, not 4.0 for 0 decimals), the
    precision the schema declares; the other columns as they are (a float64 without `decimals`
    keeps polars' shortest round-trip text, so the file reads back to the very same numbers).
    The text reads back as the same rounded number. A column whose bounds reach 2^53 at that
    precision keeps the number (the fixed text would need more than an integer's exact range)."""
    texts = [
        _fixed_text(frame.get_column(col.name), col)
        for col in schema.columns
        if col.type == "numeric" and col.decimals is not None and col.name in frame.columns and _fixed_fits(col)
    ]
    return frame.with_columns(texts) if texts else frame


def _fixed_fits(col: Column) -> bool:
    reach = max((abs(float(b)) for b in col.bounds or ()), default=math.inf)
    return reach * 10.0 ** int(col.decimals or 0) < 2.0**53


def _fixed_text(s: pl.Series, col: Column) -> pl.Series:
    """Values already rounded to the column's decimals (`rounded`) -> their fixed-point text."""
    d = int(col.decimals or 0)
    scaled = (s.cast(pl.Float64) * 10.0**d).round(0).cast(pl.Int64)  # exact: |value| x 10^d < 2^53
    if d == 0:
        return scaled.cast(pl.String).alias(s.name)
    whole, frac = scaled.abs() // 10**d, scaled.abs() % 10**d
    sign = pl.when(scaled < 0).then(pl.lit("-")).otherwise(pl.lit(""))
    text = pl.concat_str([sign, whole.cast(pl.String), pl.lit("."), frac.cast(pl.String).str.zfill(d)])
    return pl.select(text).to_series().alias(s.name)


__all__ = ["CONVERTED", "csv_text", "lower", "lower_column", "output_names", "read_values", "rounded", "to_surface"]
