"""A schema draft's non-private part (`privflow schema draft`): column types, and the YAML text.

Names come from the header, and for Parquet the types from the column dtypes (public metadata).
A CSV column's type, a date's format, a boolean's labels, a numeric column's decimals and the
tokens that mean missing are read off the values: a suggestion for the curator (the data owner),
who reviews it before the schema is used, which is what makes it public; the draft marks each
with SUGGESTED. Nothing else read from the rows goes into a draft here: bounds and category lists
are DRAFT_PLACEHOLDER unless privflow/tasks/draft.py fills them by DP.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
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
    ("%Y-%m-%dT%H:%M:%SZ", "second"),
    ("%Y-%m-%d %H:%M:%S", "second"),
    ("%Y-%m-%dT%H:%M", "minute"),
    ("%Y-%m-%d %H:%M", "minute"),
    ("%d/%m/%Y %H:%M", "minute"),
    ("%m/%d/%Y %H:%M", "minute"),
)
BOOLEAN_PAIRS = (("true", "false"), ("yes", "no"), ("y", "n"), ("t", "f"), ("1", "0"))
ID_SHARE = 0.95  # a text column with at least this share of distinct values is identifier-like
ID_MIN_VALUES = 20  # ... when it holds at least this many values
ID_NAME = re.compile(r"(^|[_\-\s.])(id|uuid|guid|key)$|^(id|uuid|guid|key)$|[a-z]I[dD]$", re.IGNORECASE)
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
    privflow/data/validation/ reads a table with those missing_values)."""
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
        if distinct == n and n >= ID_MIN_VALUES and ID_NAME.search(name):
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
            if n >= ID_MIN_VALUES and s.drop_nulls().n_unique() == n and ID_NAME.search(name):
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


# -- the kinds of a value: the public cells of a column's DP kind histogram (privflow/tasks/draft.py) --

BY_DP = "type by DP counts of the values' kinds"
NUMBER_DECIMALS = 6  # decimals cells 1..6; a value with more (or in exponent notation) is in the cell 'dec7'
BOOLEAN_LABELS = tuple(label for pair in BOOLEAN_PAIRS for label in pair)
# a datetime family: (format, regex of its text, whether it writes seconds)
DATETIME_FAMILIES = (
    ("%Y-%m-%dT%H:%M:%S", r"^\d{4}-\d{1,2}-\d{1,2}T\d{1,2}:\d{2}:\d{2}$", True),
    ("%Y-%m-%dT%H:%M:%SZ", r"^\d{4}-\d{1,2}-\d{1,2}T\d{1,2}:\d{2}:\d{2}Z$", True),  # ISO 8601 in UTC (exports)
    ("%Y-%m-%d %H:%M:%S", r"^\d{4}-\d{1,2}-\d{1,2} \d{1,2}:\d{2}:\d{2}$", True),
    ("%Y-%m-%dT%H:%M", r"^\d{4}-\d{1,2}-\d{1,2}T\d{1,2}:\d{2}$", False),
    ("%Y-%m-%d %H:%M", r"^\d{4}-\d{1,2}-\d{1,2} \d{1,2}:\d{2}$", False),
    ("%d/%m/%Y %H:%M", r"^\d{1,2}/\d{1,2}/\d{4} \d{1,2}:\d{2}$", False),
)
UNITS = ("second", "minute", "hour", "day")
ORDERS = ("dm", "md", "amb")  # a d/m or m/d text: first field > 12, second field > 12, neither


def kind_cells() -> tuple[str, ...]:
    """The PUBLIC cells of a column's kind histogram, in the order a value is matched: each value
    (spaces around it removed) counts in the first cell it matches, so one row moves one cell by 1."""
    cells = ["missing"]
    cells += [f"bool:{label}" for label in BOOLEAN_LABELS if label not in ("1", "0")] + ["bool:1", "bool:0"]
    cells += ["zero", "int+", "int-"]
    cells += [f"dec{d}{sign}" for d in range(1, NUMBER_DECIMALS + 2) for sign in "+-"]
    cells += ["date:iso"] + [f"date:{o}" for o in ORDERS]
    for i, (_, _, seconds) in enumerate(DATETIME_FAMILIES):
        units = UNITS if seconds else UNITS[1:]
        orders = ORDERS if "/" in DATETIME_FAMILIES[i][0] else ("",)
        cells += [f"dt{i}{o}:{u}" for o in orders for u in units]
    cells.append("text")
    return tuple(cells) + tuple(f"group:{g}" for g in GROUPS) + tuple(f"mag:{k}" for k in MAGNITUDES)


# the second level: each value also counts in one group cell (so a row moves two cells by 1 each:
# L1 sensitivity 2), so that a group's count carries one cell's noise, not the sum of its cells';
# every number (0/1, integer, decimal) is one group: the type's choice among groups compares one
# noisy cell per group (a number column's count is never the sum of three cells' noise)
GROUPS = (
    ("missing", "true/false", "yes/no", "y/n", "t/f", "number", "date")
    + tuple(f"dt{i}" for i in range(len(DATETIME_FAMILIES)))
    + ("text",)
)
# the third level: a number's decade, floor(log10 |x|) clipped to MAGNITUDES (0 and non-numbers in none):
# the scale the DP bounds' windows are centred on
MAGNITUDES = tuple(range(-3, 13))
KIND_SENSITIVITY = 3.0
KIND_CELLS = kind_cells()
DETAIL_CELLS = KIND_CELLS[: -len(GROUPS) - len(MAGNITUDES)]


def _group(cell: str) -> str:
    if cell.startswith("bool:") and cell not in ("bool:1", "bool:0"):
        label = cell[5:]
        return next(f"{t}/{f}" for t, f in BOOLEAN_PAIRS if label in (t, f))
    if cell in ("zero", "int+", "int-", "bool:1", "bool:0") or cell.startswith("dec"):
        return "number"
    if cell.startswith("date:"):
        return "date"
    if cell.startswith("dt"):
        return re.sub(r"(dm|md|amb)$", "", cell.split(":")[0])
    return cell


def _parses(values: pl.Series, fmt: str, kind: str) -> np.ndarray:
    out = values.str.to_datetime(fmt, strict=False) if kind == "datetime" else values.str.to_date(fmt, strict=False)
    return out.is_not_null().to_numpy()


def _unit_of(parsed: pl.Series) -> np.ndarray:
    """Per value, the coarsest unit that holds it exactly: 0 second, 1 minute, 2 hour, 3 day."""
    sec = parsed.dt.second().fill_null(0).to_numpy()
    minute = parsed.dt.minute().fill_null(0).to_numpy()
    hour = parsed.dt.hour().fill_null(0).to_numpy()
    return np.where(sec != 0, 0, np.where(minute != 0, 1, np.where(hour != 0, 2, 3)))


def kind_counts(values: pl.Series) -> np.ndarray:
    """The exact count of each KIND_CELLS cell over one column's values (text, spaces removed,
    missing values and missing tokens as null, as `normalised` gives them): a per-value map, each
    value in exactly one detail cell, in exactly one group cell and (a non-zero number) in one
    magnitude cell, so the vector has L1 sensitivity KIND_SENSITIVITY = 3 under add/remove of a row."""
    s = values.cast(pl.String)
    n = s.len()
    cell = np.full(n, -1, dtype=np.int64)
    index = {c: i for i, c in enumerate(KIND_CELLS)}

    def put(name: str, mask: np.ndarray) -> None:
        free = (cell == -1) & mask
        cell[free] = index[name]

    put("missing", s.is_null().to_numpy())
    t = s.fill_null("")
    low = t.str.to_lowercase()
    for label in BOOLEAN_LABELS:
        put(f"bool:{label}", (low == label).to_numpy())
    number = t.str.contains(_NUMBER).to_numpy()
    as_float = t.cast(pl.Float64, strict=False).to_numpy()
    negative = t.str.starts_with("-").to_numpy()
    put("zero", number & (as_float == 0))
    integer = t.str.contains(_INTEGER).to_numpy()
    put("int-", integer & negative)
    put("int+", integer)
    digits = t.str.extract(r"^[+-]?\d*\.(\d*)$", 1).str.len_chars().fill_null(NUMBER_DECIMALS + 1).to_numpy()
    digits = np.clip(digits, 1, NUMBER_DECIMALS + 1)
    for d in range(1, NUMBER_DECIMALS + 2):
        at = number & (digits == d)
        put(f"dec{d}-", at & negative)
        put(f"dec{d}+", at)
    put("date:iso", _parses(t, "%Y-%m-%d", "date") & t.str.contains(r"^\d{4}-\d{1,2}-\d{1,2}$").to_numpy())
    slash = t.str.contains(r"^\d{1,2}/\d{1,2}/\d{4}$").to_numpy()
    dm, md = _parses(t, "%d/%m/%Y", "date") & slash, _parses(t, "%m/%d/%Y", "date") & slash
    put("date:dm", dm & ~md)
    put("date:md", md & ~dm)
    put("date:amb", dm & md)
    for i, (fmt, pattern, seconds) in enumerate(DATETIME_FAMILIES):
        shape = t.str.contains(pattern).to_numpy()
        if "/" in fmt:
            a = t.str.to_datetime(fmt, strict=False)
            b = t.str.to_datetime(fmt.replace("%d/%m", "%m/%d"), strict=False)
            ok_a, ok_b = a.is_not_null().to_numpy() & shape, b.is_not_null().to_numpy() & shape
            unit = np.where(ok_a, _unit_of(a), _unit_of(b))
            orders: list[tuple[str, np.ndarray]] = [("dm", ok_a & ~ok_b), ("md", ok_b & ~ok_a), ("amb", ok_a & ok_b)]
        else:
            a = t.str.to_datetime(fmt, strict=False)
            unit = _unit_of(a)
            orders = [("", a.is_not_null().to_numpy() & shape)]
        for order, ok in orders:
            for u, name in enumerate(UNITS):
                if not seconds and name == "second":
                    continue
                put(f"dt{i}{order}:{name}", ok & (unit == u))
    put("text", np.ones(n, dtype=bool))
    detail = np.bincount(cell, minlength=len(DETAIL_CELLS)).astype(np.float64)
    groups = np.zeros(len(GROUPS), dtype=np.float64)
    for name, count in zip(DETAIL_CELLS, detail, strict=True):
        groups[GROUPS.index(_group(name))] += count
    numeric = np.isin(cell, [i for i, c in enumerate(DETAIL_CELLS) if _group(c) == "number"])
    size = np.abs(as_float[numeric & np.isfinite(as_float) & (as_float != 0)])
    k = np.clip(np.floor(np.log10(size)), MAGNITUDES[0], MAGNITUDES[-1]).astype(np.int64) - MAGNITUDES[0]
    mags = np.bincount(k, minlength=len(MAGNITUDES)).astype(np.float64)
    return np.concatenate([detail, groups, mags])


@dataclass(frozen=True)
class KindDecision:
    """A column's type and format facts decided from its noisy kind counts (post-processing only)."""

    suggestion: Suggestion
    present: float  # noisy count of present values (the DP row count less the DP missing count)
    missing: float  # noisy count of missing values
    zeros: float  # noisy count of values that are 0
    negatives: float  # noisy count of negative numbers
    sd: float  # the noise sd of one cell
    decade: int | None = None  # the upper of the two adjacent decades floor(log10 |x|) holding the most
    # non-zero numbers (noisy counts); None where their noisy count is under DECADE_Z noise sd (scale unknown)


TYPE_SLACK = 0.01  # a kind is chosen when at most this share of the present values (noisy) is of another kind
TYPE_Z = 6.0  # ... or at most this many noise sd of the difference, where that is larger (a small epsilon)
SAFE_Z = 3.0  # boolean 1/0 over integer: the other numbers this many noise sd under the slack
DECIMALS_Z = 2.0  # numeric decimals: the longer values under the slack by this many noise sd
DECADE_Z = 4.0  # the scale is known when two adjacent decades' noisy count passes this many noise sd
SIGN_SHARE = 0.005  # a number column is non-negative when at most this share (or 2 sd) of its values is negative


def decide_kind(name: str, noisy: Iterable[float], rows: float, cell_sd: float, rows_sd: float) -> KindDecision:
    """The column's type from its noisy kind counts `noisy` (over KIND_CELLS), the noisy row count `rows` and the noise
    sds: a function of noisy counts and public settings only. The group (a boolean label pair, number, date, each
    datetime family, text) with the largest noisy count wins when it holds all but TYPE_SLACK of the present values
    (or TYPE_Z noise sd of the difference), else the column is text (categorical, or ignore after its category
    histogram). A number column is boolean 1/0 when its numbers other than 0 and 1 are at most TYPE_SLACK by SAFE_Z
    noise sd, integer when the non-integers are at most TYPE_SLACK by SAFE_Z noise sd, else numeric with `decimals`
    the smallest d (0 included) with at most TYPE_SLACK (by DECIMALS_Z noise sd) written with more; a date is ISO or
    d/m/Y against m/d/Y by the counts with a first vs a second field above 12; a datetime's granularity is the
    coarsest unit with at most TYPE_SLACK needing a finer one. Where noise decides, the choice that fails no row
    wins (integer over boolean, numeric over integer, a finer unit); decimals round, so fewer decimals win there
    (a rounded value is kept)."""
    c = dict(zip(KIND_CELLS, (float(v) for v in noisy), strict=True))

    def total(prefix: str | tuple[str, ...]) -> tuple[float, int]:
        keys = [k for k in KIND_CELLS if k.startswith(prefix)]
        return sum(c[k] for k in keys), len(keys)

    missing = c["group:missing"]
    present = max(rows - missing, 1.0)

    def fits(compatible: float, cells: int) -> bool:
        sd = math.sqrt(rows_sd**2 + (cells + 1) * cell_sd**2)
        return present - compatible <= max(TYPE_SLACK * present, TYPE_Z * sd)

    negatives = c["int-"] + sum(c[f"dec{d}-"] for d in range(1, NUMBER_DECIMALS + 2))
    zeros = c["zero"] + c["bool:0"]

    # the scale: the two adjacent decades holding the most numbers (noisy); a column spread over two
    # decades, each under the noise at a small epsilon, is still placed by their sum
    pair, upper = max((c[f"mag:{a}"] + c[f"mag:{b}"], b) for a, b in itertools.pairwise(MAGNITUDES))
    decade = upper if pair > DECADE_Z * math.sqrt(2.0) * cell_sd else None

    def done(sug: Suggestion) -> KindDecision:
        return KindDecision(sug, present, missing, zeros, negatives, cell_sd, decade)

    if present <= 2.0 * math.sqrt(rows_sd**2 + cell_sd**2):
        return done(Suggestion(name, "ignore", BY_DP, note="no value found above the noise: nothing to model"))
    # the group of kinds with the largest noisy count (each value is in one group), then whether it
    # holds nearly all present values; 0/1 numbers are a boolean only when the other numbers are few
    groups: dict[str, tuple[float, int]] = {
        "number": (c["group:number"], 1),
        "date": (c["group:date"], 1),
        "text": (c["group:text"], 1),
    }
    for true, false in BOOLEAN_PAIRS[:-1]:
        groups[f"{true}/{false}"] = (c[f"group:{true}/{false}"], 1)
    for i in range(len(DATETIME_FAMILIES)):
        groups[f"dt{i}"] = (c[f"group:dt{i}"], 1)
    best_group = max(groups, key=lambda g: groups[g][0])
    compatible, cells = groups[best_group]
    if best_group == "text" or not fits(compatible, cells):
        return done(Suggestion(name, "categorical", BY_DP))
    if "/" in best_group:
        true, false = best_group.split("/")
        return done(Suggestion(name, "boolean", BY_DP, labels=(true, false)))
    if best_group == "number":
        above = [_more_decimals(c, d, cell_sd) for d in range(NUMBER_DECIMALS + 1)]
        dec_cells, int_cells = 2 * (NUMBER_DECIMALS + 1), ("zero", "int+", "int-")
        # boolean 1/0 fails every row holding another number, integer every row written with
        # decimals: each is chosen only when those are few by SAFE_Z noise sd (noise alone never
        # drafts it over a column with a few percent of them; at a small epsilon, no row is lost)
        decimal = sum(c[f"dec{e}{s}"] for e in range(1, NUMBER_DECIMALS + 2) for s in "+-")
        others = decimal + sum(c[k] for k in int_cells)
        if others + SAFE_Z * math.sqrt(dec_cells + len(int_cells)) * cell_sd <= TYPE_SLACK * present:
            return done(Suggestion(name, "boolean", BY_DP, labels=("1", "0")))
        if above[0][0] + SAFE_Z * above[0][1] <= TYPE_SLACK * present:
            return done(Suggestion(name, "integer", BY_DP))
        # numeric with 0 decimals where decimals are few but not surely so: written as whole numbers,
        # and a row written with decimals is read, not failed. Decimals: the fewest d whose longer
        # values are under TYPE_SLACK by DECIMALS_Z noise sd: a value rounded to d decimals is kept
        # (a per-row map, like a clamp), while decimals the values do not have turn a column of whole
        # numbers or round amounts into a continuous one, losing its spikes (at epsilon 0.3, 1 to 5
        # decimals were drafted over whole numbers: results/draft_run_credit.md)
        decimals = next(
            (d for d, (more, sd) in enumerate(above) if more <= TYPE_SLACK * present + DECIMALS_Z * sd), None
        )
        return done(Suggestion(name, "numeric", BY_DP, decimals=decimals))
    if best_group == "date":
        iso, slash = c["date:iso"], c["date:dm"] + c["date:md"] + c["date:amb"]
        if iso >= slash:
            return done(Suggestion(name, "date", BY_DP, format="%Y-%m-%d"))
        # _day_month's dict holds only str fields (format, note), as for the datetime below
        return done(Suggestion(name, "date", BY_DP, **_day_month(c["date:dm"], c["date:md"], "%d/%m/%Y", cell_sd)))  # type: ignore[arg-type]
    best = int(best_group[2:])
    fmt = DATETIME_FAMILIES[best][0]
    extra: dict[str, object] = {"format": fmt}
    if "/" in fmt:
        dm, _ = total(tuple(f"dt{best}dm:{u}" for u in UNITS))
        md, _ = total(tuple(f"dt{best}md:{u}" for u in UNITS))
        extra = _day_month(dm, md, fmt, cell_sd)
    unit = "second"
    for k in (3, 2, 1):  # day, hour, minute: the coarsest whose finer values are at most TYPE_SLACK
        finer = sum(v for key, v in c.items() if key.startswith(f"dt{best}") and key.split(":")[1] in UNITS[:k])
        if finer <= TYPE_SLACK * present:
            unit = UNITS[k]
            break
    return done(Suggestion(name, "datetime", BY_DP, granularity=unit, **extra))  # type: ignore[arg-type]


def _more_decimals(c: dict[str, float], d: int, cell_sd: float) -> tuple[float, float]:
    """(noisy count, its noise sd) of the numbers written with more than d decimals: the inverse-
    variance mean of two independent estimates, the sum of the decimal cells above d and the number
    group's cell less the cells at or below d (at d = 0 the first sums 14 cells, the second 6)."""
    above = [f"dec{e}{s}" for e in range(d + 1, NUMBER_DECIMALS + 2) for s in "+-"]
    below = ["zero", "int+", "int-", "bool:1", "bool:0"] + [f"dec{e}{s}" for e in range(1, d + 1) for s in "+-"]
    direct, k1 = sum(c[k] for k in above), len(above)
    by_group, k2 = c["group:number"] - sum(c[k] for k in below), len(below) + 1
    mean = (direct * k2 + by_group * k1) / (k1 + k2)  # weights 1/k1 and 1/k2, normalised
    return mean, math.sqrt(k1 * k2 / (k1 + k2)) * cell_sd


def _day_month(dm: float, md: float, fmt: str, cell_sd: float) -> dict[str, object]:
    """d/m against m/d: the order with more values (noisy) whose other order cannot read them."""
    day_first = dm >= md
    out: dict[str, object] = {"format": fmt if day_first else fmt.replace("%d/%m", "%m/%d")}
    if abs(dm - md) < 3.0 * math.sqrt(2.0) * cell_sd:
        out["note"] = "day/month order: the DP counts of values with a first or a second field above 12 are close"
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
    top: list[Entry] = field(default_factory=list)  # top-level lines after the columns (target, target_positive)

    def text(self) -> str:
        lines = [f"# {h}" if h else "#" for h in self.header]
        lines.append("dataset:")
        lines += [e.line("  ") for e in self.dataset]
        lines.append("columns:")
        for entries in self.columns:
            first, *rest = entries
            lines.append(first.line("- "))
            lines += [e.line("  ") for e in rest]
        lines += [e.line("") for e in self.top]
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
        said = {SUGGESTED: "format suggested from the values", BY_DP: "format by DP counts"}.get(sug.origin)
        out.append(Entry("format", sug.format, said))
    if sug.granularity is not None:
        out.append(Entry("granularity", sug.granularity, "by DP counts" if sug.origin == BY_DP else None))
    if sug.labels is not None:
        said = (
            "[true text, false text], by DP counts (matched without regard to case)"
            if sug.origin == BY_DP
            else ("[true text, false text] as written in the data")
        )
        out.append(Entry("labels", list(sug.labels), said))
    if sug.decimals is not None:
        said = (
            "the fewest d with at most 1% of the values written with more, by 2 noise sd (DP counts)"
            if sug.origin == BY_DP
            else "the most decimals the values are written with"
        )
        out.append(Entry("decimals", sug.decimals, said))
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
    "BY_DP",
    "DETAIL_CELLS",
    "GROUPS",
    "KIND_CELLS",
    "KIND_SENSITIVITY",
    "KindDecision",
    "decide_kind",
    "kind_counts",
    "DATETIME_FORMATS",
    "DATE_FORMATS",
    "FROM_DTYPE",
    "ID_NAME",
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
