"""A schema draft's non-private part (`privflow schema draft`): column types, and the YAML text.

Names come from the header, and for Parquet the types from the column dtypes (public metadata).
A CSV column's type, a date's format, a boolean's labels, a numeric column's decimals and the
tokens that mean missing are read off the values: a suggestion for the curator (the data owner),
who reviews it before the schema is used, which is what makes it public; the draft marks each
with SUGGESTED. Nothing else read from the rows goes into a draft here: bounds and category lists
are DRAFT_PLACEHOLDER unless privflow/tasks/draft.py fills them by DP.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

import numpy as np
import polars as pl
import yaml

from privflow.data.schema import DRAFT_PLACEHOLDER

SUGGESTED = "type suggested from the values (curator's review makes it public)"
FROM_DTYPE = "type from the Parquet column type (public)"
# text that often means missing; those seen in a CSV become the draft's dataset.missing_values
MISSING_TOKENS = ("?", "NA", "N/A", "n/a", "NULL", "null", "None", "NaN", "nan")
DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%m/%d/%Y")
# (format, granularity): the finest unit the format writes is the granularity it is modelled at
DATETIME_FORMATS = (
    ("%Y-%m-%dT%H:%M:%S", "second"),
    ("%Y-%m-%d %H:%M:%S", "second"),
    ("%Y-%m-%dT%H:%M", "minute"),
    ("%Y-%m-%d %H:%M", "minute"),
    ("%d/%m/%Y %H:%M", "minute"),
    ("%m/%d/%Y %H:%M", "minute"),
)
BOOLEAN_PAIRS = (("true", "false"), ("yes", "no"), ("y", "n"), ("t", "f"), ("1", "0"))
ID_SHARE = 0.95  # a text column with at least this share of distinct values is identifier-like
ID_MIN_VALUES = 20  # ... when it holds at least this many values
_ID_NAME = re.compile(r"(^|[_\-\s.])(id|uuid|guid|key)$|^(id|uuid|guid|key)$|[a-z]I[dD]$", re.IGNORECASE)
_INTEGER = r"^[+-]?\d+$"
_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


@dataclass
class Suggestion:
    """One column's suggested type and the format facts that go with it."""

    name: str
    type: str
    origin: str  # SUGGESTED or FROM_DTYPE
    format: str | None = None
    granularity: str | None = None
    labels: tuple[str, str] | None = None
    decimals: int | None = None
    note: str | None = None  # a word for the curator (an ambiguous date format, an identifier)


def missing_tokens(frame: pl.DataFrame) -> tuple[str, ...]:
    """The MISSING_TOKENS that some text column of `frame` holds (spaces around removed)."""
    seen: set[str] = set()
    for name, dtype in frame.schema.items():
        if dtype == pl.String:
            values = frame.get_column(name).str.strip_chars()
            seen.update(t for t in MISSING_TOKENS if values.is_in([t]).any())
    return tuple(t for t in MISSING_TOKENS if t in seen)


def normalised(frame: pl.DataFrame, tokens: Sequence[str]) -> pl.DataFrame:
    """Text values without the spaces around them, empty text and `tokens` as missing (as
    privflow/data/validation.py reads a table with those missing_values)."""
    drop = pl.Series(["", *tokens], dtype=pl.String)
    exprs = []
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Enum | pl.Categorical) or dtype == pl.String:
            text = pl.col(name).cast(pl.String).str.strip_chars()
            exprs.append(pl.when(text.is_in(drop)).then(None).otherwise(text).alias(name))
    return frame.with_columns(exprs) if exprs else frame


def _boolean(values: pl.Series) -> tuple[str, str] | None:
    distinct = values.unique().to_list()
    if len(distinct) != 2:
        return None
    folded = {str(v).casefold(): str(v) for v in distinct}
    for true, false in BOOLEAN_PAIRS:
        if set(folded) == {true, false}:
            return folded[true], folded[false]
    return None


def _decimals(values: pl.Series) -> int | None:
    """The most decimals any value is written with (values in exponent notation aside)."""
    plain = values.filter(~values.str.contains("[eE]"))
    digits = plain.str.extract(r"\.(\d*)$", 1).str.len_chars().drop_nulls()
    return int(digits.max()) if digits.len() else None  # type: ignore[arg-type]


def _temporal(values: pl.Series) -> Suggestion | None:
    for fmt, unit in DATETIME_FORMATS:
        if values.str.to_datetime(fmt, strict=False).null_count() == 0:
            return Suggestion("", "datetime", SUGGESTED, format=fmt, granularity=unit)
    fits = [fmt for fmt in DATE_FORMATS if values.str.to_date(fmt, strict=False).null_count() == 0]
    if not fits:
        return None
    note = f"the values also read as {fits[1]}: check which one the data uses" if len(fits) > 1 else None
    return Suggestion("", "date", SUGGESTED, format=fits[0], note=note)


def suggest_text(name: str, values: pl.Series) -> Suggestion:
    """A text column's type from its present values (spaces removed, missing dropped)."""
    values = values.drop_nulls()
    n = values.len()
    if n == 0:
        return Suggestion(name, "ignore", SUGGESTED, note="no value in the file: nothing to model")
    labels = _boolean(values)
    if labels is not None:
        return Suggestion(name, "boolean", SUGGESTED, labels=labels)
    distinct = values.n_unique()
    if values.str.contains(_INTEGER).all():
        if distinct == n and n >= ID_MIN_VALUES and _ID_NAME.search(name):
            return Suggestion(name, "ignore", SUGGESTED, note="every value distinct and an identifier's name")
        return Suggestion(name, "integer", SUGGESTED)
    if values.str.contains(_NUMBER).all():
        return Suggestion(name, "numeric", SUGGESTED, decimals=_decimals(values))
    temporal = _temporal(values)
    if temporal is not None:
        temporal.name = name
        return temporal
    if n >= ID_MIN_VALUES and distinct >= ID_SHARE * n:
        return Suggestion(name, "ignore", SUGGESTED, note="nearly every value distinct: an identifier?")
    return Suggestion(name, "categorical", SUGGESTED)


def suggest(frame: pl.DataFrame, parquet: bool) -> list[Suggestion]:
    """Every column's suggestion: a Parquet column's type from its dtype where the dtype says it
    (text columns from their values), a CSV column's from its values. `frame` is `normalised`."""
    out: list[Suggestion] = []
    for name, dtype in frame.schema.items():
        s = frame.get_column(name)
        if not parquet or dtype == pl.String:
            out.append(suggest_text(name, s))
        elif dtype == pl.Boolean:
            out.append(Suggestion(name, "boolean", FROM_DTYPE, labels=("true", "false")))
        elif dtype.is_integer():
            n = s.drop_nulls().len()
            if n >= ID_MIN_VALUES and s.drop_nulls().n_unique() == n and _ID_NAME.search(name):
                out.append(Suggestion(name, "ignore", SUGGESTED, note="every value distinct and an identifier's name"))
            else:
                out.append(Suggestion(name, "integer", FROM_DTYPE))
        elif dtype.is_float():
            out.append(Suggestion(name, "numeric", FROM_DTYPE))
        elif dtype == pl.Date:
            out.append(Suggestion(name, "date", FROM_DTYPE, format="%Y-%m-%d"))
        elif isinstance(dtype, pl.Datetime):
            out.append(Suggestion(name, "datetime", FROM_DTYPE, format="%Y-%m-%dT%H:%M:%S", granularity="second"))
        else:
            out.append(Suggestion(name, "ignore", FROM_DTYPE, note=f"stored as {dtype}, which privflow does not model"))
    return out


# -- the values a DP statistic reads (privflow/tasks/draft.py) --------------------------------------


def numbers(s: pl.Series) -> np.ndarray:
    """A numeric or integer column's present values as floats (NaN where missing or not a number)."""
    if s.dtype == pl.String:
        s = s.cast(pl.Float64, strict=False)
    return s.cast(pl.Float64, strict=False).fill_nan(None).to_numpy(allow_copy=True).astype(np.float64)


def days(s: pl.Series, sug: Suggestion) -> np.ndarray:
    """A date or datetime column's values as (fractional) days since 1970-01-01, NaN where missing."""
    if s.dtype == pl.String:
        fmt = sug.format or ("%Y-%m-%d" if sug.type == "date" else "%Y-%m-%dT%H:%M:%S")
        s = s.str.to_datetime(fmt, strict=False) if sug.type == "datetime" else s.str.to_date(fmt, strict=False)
    if s.dtype == pl.Date:
        out = s.cast(pl.Int64).cast(pl.Float64)
    else:
        out = s.cast(pl.Datetime("ms")).cast(pl.Int64).cast(pl.Float64) / 86_400_000.0
    return out.to_numpy(allow_copy=True).astype(np.float64)


def texts(s: pl.Series) -> list[str | None]:
    """A categorical column's values as text (None where missing)."""
    return [None if v is None else str(v) for v in s.cast(pl.String).to_list()]


def iso_day(d: date, kind: str, end: bool = False) -> str:
    """A date bound as ISO text; a datetime bound at the day's first (or last) second."""
    if kind == "date":
        return d.isoformat()
    return (
        datetime(d.year, d.month, d.day, 23, 59, 59).isoformat()
        if end
        else datetime(d.year, d.month, d.day).isoformat()
    )


# -- the YAML text --------------------------------------------------------------------------------


def flow(value: object) -> str:
    """One YAML value in flow style, quoted where YAML would read it as something else."""
    text = yaml.safe_dump([value], default_flow_style=True, width=10**9, sort_keys=False).strip()
    return text[1:-1]


@dataclass
class Entry:
    """One `key: value  # comment` line of a column (a comment-only line where key is '#')."""

    key: str
    value: object
    comment: str | None = None

    def line(self, indent: str) -> str:
        if self.key == "#":
            return f"{indent}# {self.value}"
        text = f"{indent}{self.key}: {flow(self.value)}"
        return f"{text}  # {self.comment}" if self.comment else text


@dataclass
class Draft:
    """The draft's content: the dataset section's entries and each column's."""

    header: list[str]
    dataset: list[Entry]
    columns: list[list[Entry]] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"# {h}" if h else "#" for h in self.header]
        lines.append("dataset:")
        lines += [e.line("  ") for e in self.dataset]
        lines.append("columns:")
        for entries in self.columns:
            first, *rest = entries
            lines.append(first.line("- "))
            lines += [e.line("  ") for e in rest]
        return "\n".join(lines) + "\n"


def column_entries(sug: Suggestion, values: Sequence[Entry]) -> list[Entry]:
    """A column's lines in the schema's order: name, type, bounds or categories (from `values`), the
    format lines, then the rest of `values` (nullable, atoms)."""
    first = [e for e in values if e.key in ("bounds", "categories")]
    rest = [e for e in values if e.key not in ("bounds", "categories")]
    head = [Entry("name", sug.name), Entry("type", sug.type, sug.origin + (f"; {sug.note}" if sug.note else ""))]
    return head + first + format_entries(sug) + rest


def format_entries(sug: Suggestion) -> list[Entry]:
    """The format lines of a column: format, granularity, labels, decimals."""
    out: list[Entry] = []
    if sug.format is not None:
        out.append(Entry("format", sug.format, "format suggested from the values" if sug.origin == SUGGESTED else None))
    if sug.granularity is not None:
        out.append(Entry("granularity", sug.granularity))
    if sug.labels is not None:
        out.append(Entry("labels", list(sug.labels), "[true text, false text] as written in the data"))
    if sug.decimals is not None:
        out.append(Entry("decimals", sug.decimals, "the most decimals the values are written with"))
    return out


def placeholder_entries(sug: Suggestion) -> list[Entry]:
    """The lines a data owner fills (no --epsilon): placeholders, and a nullable that reads nothing."""
    out: list[Entry] = []
    fill = "draft placeholder: fill with public"
    if sug.type in ("numeric", "integer"):
        out.append(Entry("bounds", [DRAFT_PLACEHOLDER, DRAFT_PLACEHOLDER], f"{fill} [low, high], rounded outward"))
    elif sug.type in ("date", "datetime"):
        example = "['2015-01-01', '2024-12-31']" if sug.type == "date" else "['2015-01-01T00:00:00', ...]"
        out.append(Entry("bounds", [DRAFT_PLACEHOLDER, DRAFT_PLACEHOLDER], f"{fill} ISO [low, high], e.g. {example}"))
    elif sug.type == "categorical":
        out.append(Entry("categories", [DRAFT_PLACEHOLDER], f"{fill} list of every category"))
    if sug.type != "ignore":
        out.append(Entry("nullable", True, "not read from the data: set false if the column is never missing"))
    return out


__all__ = [
    "BOOLEAN_PAIRS",
    "DATETIME_FORMATS",
    "DATE_FORMATS",
    "FROM_DTYPE",
    "MISSING_TOKENS",
    "SUGGESTED",
    "Draft",
    "Entry",
    "Suggestion",
    "days",
    "flow",
    "iso_day",
    "missing_tokens",
    "normalised",
    "numbers",
    "placeholder_entries",
    "suggest",
    "suggest_text",
    "column_entries",
    "format_entries",
    "texts",
]
