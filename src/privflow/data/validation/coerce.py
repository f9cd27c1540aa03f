"""Coercion: a table as read (CSV text, or Parquet's own types) to typed columns.

Text loses the spaces around it and the schema's missing-value tokens read as missing; each
numeric/integer column is cast per column (strict=False), counting the values that do not parse
("type") or are not whole numbers ("integer"); a date, datetime or boolean column is first
converted to its modelled values (privflow/data/lowering.py: text that does not parse with its
format is a "type" failure of its row) and an ignored column is not read at all. Only a
column's dtype (public for Parquet) fails at schema level: a verdict on a whole column from its
values would let one row decide the fate of every other (privacy rule 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from privflow.data.io import UNREADABLE
from privflow.data.lowering import CONVERTED, lower, read_values
from privflow.data.schema import Column, Schema
from privflow.data.validation.report import SCHEMA_LEVEL, Failure


def numeric_dtype(dtype: pl.DataType) -> bool:
    """Whether a column's dtype holds numbers (every width of int and float, Decimal, booleans
    as 0/1, an all-null column): pre-flight's `_type_fits` admits a Parquet column by this same
    rule, so a column it accepts is read here."""
    return bool(dtype.is_numeric()) or dtype in (pl.Boolean, pl.Null)


def _null_where(mask: pl.Series, s: pl.Series) -> pl.Series:
    return pl.select(pl.when(mask).then(None).otherwise(s)).to_series().alias(s.name)


@dataclass
class Coerced:
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


def _numbers(s: pl.Series) -> tuple[pl.Series, pl.Series] | None:
    """(a numeric or integer column's values as Float64, the mask of present values that are not
    numbers), or None when its storage holds no numbers. NaN counts as missing."""
    if s.dtype == pl.String:
        parsed = s.str.strip_chars().cast(pl.Float64, strict=False)
        bad = s.is_not_null() & (parsed.is_null() | parsed.is_nan().fill_null(False))
        return _null_where(bad, parsed), bad
    if numeric_dtype(s.dtype):
        parsed = s.cast(pl.Float64)
        none = pl.Series(s.name, [False] * s.len(), dtype=pl.Boolean)
        return _null_where(parsed.is_nan().fill_null(False), parsed), none
    return None


def coerce(raw: pl.DataFrame, schema: Schema) -> Coerced:
    """Cast each declared column to its modelled type (strict=False), counting what does not parse.

    A value that is present but not a number ("abc", "nan") is a row-level "type" failure,
    however many rows hold one: a verdict on the whole column would let one row decide the
    fate of every other (privacy rule 8), so only a column's dtype (public for Parquet) fails
    at schema level. In integer columns a finite number with a fraction is an "integer" failure.
    Date, datetime and boolean columns are converted first (`lowering.read_values`: a date that
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
        numbers = _numbers(s)
        if numbers is None:
            detail = f"holds {s.dtype} values where {col.type} numbers are declared"
            failures.append(Failure(col.name, "type", n, SCHEMA_LEVEL, detail))
            out[col.name] = pl.Series(col.name, [None] * n, dtype=pl.Float64)
            continue
        parsed, bad = numbers
        if bad.any():
            masks[(col.name, "type")] = bad
        if col.type == "integer":
            frac = (parsed.is_finite() & (parsed != parsed.round(0))).fill_null(False)
            if frac.any():
                masks[(col.name, "integer")] = frac
        out[col.name] = parsed.alias(col.name)
    frame = pl.DataFrame(list(out.values())) if out else pl.DataFrame()
    return Coerced(frame, masks, failures)


def prepared(df: pl.DataFrame, schema: Schema) -> tuple[pl.Series | None, pl.DataFrame, Coerced]:
    """(the rows the reader could not read, or None; the normalised raw frame; its coercion):
    what `validate` and `typed_rows` check. An ignored column's values are never read: only its
    name is checked (the quarantine file, for the data owner, keeps the rows as given)."""
    unreadable = df.get_column(UNREADABLE).is_not_null() if UNREADABLE in df.columns else None
    df = df.drop(UNREADABLE, strict=False)
    ignored = [c.name for c in schema.columns if c.type == "ignore" and c.name in df.columns]
    df = df.with_columns(pl.lit(None, dtype=pl.String).alias(c) for c in ignored) if ignored else df
    raw = _normalise(df, schema.dataset.missing_values)
    return unreadable, raw, coerce(raw, schema)


def typed(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """A coerced frame (its values clamped or sent to `other`) in the dtypes of the modelled
    `schema`, in its column order: numeric -> Float64, integer -> Int64, categorical -> Enum of
    the declared list."""
    exprs = []
    for col in schema.columns:
        if col.is_categorical:
            exprs.append(pl.col(col.name).cast(pl.Enum(list(col.categories or ()))))
        elif col.type == "integer":
            exprs.append(pl.col(col.name).round(0).cast(pl.Int64))
        else:
            exprs.append(pl.col(col.name).cast(pl.Float64))
    return frame.select(exprs)
