"""Calendar parts: a date or datetime column as the model sees it, through its day and time of day.

A date or datetime is lowered to one integer, its units since 1970-01-01 (privflow/data/lowering.py,
`Column.calendar_unit`). As one coordinate its DP marginal spreads over a grid of cells a month
wide on a table of decades: the time of day is smeared inside each cell (a table on the
00/06/12/18 h grid comes back at any hour) and every empty cell of an off-season gets noise mass
(a hurricane table comes back with storms in February). So the copula codec and the DP marginals
(privflow/data/copula.py) take such a column through its parts, each an integer column of its own
cells, all of them public functions of the value and of the public bounds:

- the day: its day number when the bounds span at most `max_atoms` days (every day its own cell:
  weekdays and seasons are cells), else two parts, the `year` and the day of the year `yday`
  (0..365), so a season is one set of cells whatever the year;
- the time of day, for a datetime finer than a day: in units of its granularity when a day holds
  at most `max_atoms` of them (`time`; hours: 24 cells), else the `hour` (24 cells) and the time
  inside the hour, `inhour` (minutes: 60 cells; seconds: a grid).

`recompose` writes a value back from its parts (a day past the end of a short year is that year's
last day; a value past the bounds is clamped to them): every part is decoded from its own DP
marginal, so the times on a grid, the seasons and the weekdays follow the released marginals.
The map is a bijection on the values inside the bounds, so decode(encode(x)) == x. A null value
is null in every part; decoding, the first part decides. Everything here is fixed by the public
schema (privacy rule 2): per-row maps, no statistic of the rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from privflow.data.schema import Column, Schema

DAY = 86_400
HOUR = 3_600
SEPARATOR = ":"  # a part's column is named `<column>:<part>` (primed until no declared column has the name)


@dataclass(frozen=True)
class Part:
    """One calendar part of `source`: its column name, what it holds and its integer range."""

    name: str
    source: str
    part: str  # "day", "year", "yday", "time" (of the day), "hour", "inhour" (the time inside the hour)
    low: int
    high: int


def is_calendar(col: Column) -> bool:
    return col.calendar_unit is not None


def parts_of(col: Column, max_atoms: int, taken: frozenset[str] = frozenset()) -> list[Part]:
    """The parts of a calendar column (module docstring), in order; `taken`: the declared names."""
    unit = col.calendar_unit
    if unit is None or col.bounds is None:
        raise ValueError(f"column '{col.name}' is not a calendar column")
    lo, hi = math.ceil(col.bounds[0]), math.floor(col.bounds[1])
    first, last = (lo * unit) // DAY, (hi * unit) // DAY
    out: list[tuple[str, int, int]] = []
    if last - first + 1 <= max_atoms:
        out.append(("day", first, last))
    else:
        out += [("year", _year(first), _year(last)), ("yday", 0, 365)]
    if unit < DAY:
        per_day = DAY // unit
        if per_day <= max_atoms:
            out.append(("time", 0, per_day - 1))
        else:
            out += [("hour", 0, 23), ("inhour", 0, HOUR // unit - 1)]
    return [Part(_name(col.name, p, taken), col.name, p, a, b) for p, a, b in out]


def schema_parts(schema: Schema, max_atoms: int) -> dict[str, list[Part]]:
    """Every calendar column's parts, by column name."""
    taken = frozenset(schema.names)
    return {c.name: parts_of(c, max_atoms, taken) for c in schema.columns if is_calendar(c)}


def part_column(col: Column, part: Part) -> Column:
    """The integer column a part's cells are built from (nullable as its source)."""
    bounds = (float(part.low), float(part.high)) if part.high > part.low else (float(part.low), part.low + 1.0)
    return Column(name=part.name, type="integer", bounds=bounds, nullable=col.nullable)


def part_values(units: np.ndarray, unit: int, part: str) -> np.ndarray:
    """A calendar column's values (float units, NaN for null) -> one part's values (float, NaN kept)."""
    x = np.asarray(units, dtype=np.float64)
    null = ~np.isfinite(x)
    seconds = np.where(null, 0, x).astype(np.int64) * unit
    day, tod = np.divmod(seconds, DAY)
    if part == "day":
        v = day
    elif part == "year":
        v = _years(day)
    elif part == "yday":
        v = day - _new_year(_years(day))
    elif part == "hour":
        v = tod // HOUR
    elif part == "time":
        v = tod // unit
    elif part == "inhour":
        v = (tod % HOUR) // unit
    else:
        raise ValueError(f"unknown calendar part {part!r}")
    return np.where(null, np.nan, v.astype(np.float64))


def recompose(col: Column, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """The column's units (int64) from its parts' decoded integer values, keyed by `Part.part`,
    clamped to its bounds (module docstring); rows whose first part is null are the caller's to null."""
    unit = col.calendar_unit
    if unit is None or col.bounds is None:
        raise ValueError(f"column '{col.name}' is not a calendar column")
    got = {part: np.asarray(v, dtype=np.int64) for part, v in values.items()}
    if "day" in got:
        day = got["day"]
    else:
        start = _new_year(got["year"])
        length = _new_year(got["year"] + 1) - start
        day = start + np.minimum(got["yday"], length - 1)
    seconds = day * DAY
    if "hour" in got:
        seconds = seconds + got["hour"] * HOUR + got["inhour"] * unit
    elif "time" in got:
        seconds = seconds + got["time"] * unit
    lo, hi = math.ceil(col.bounds[0]), math.floor(col.bounds[1])
    return np.clip(seconds // unit, lo, hi)


def _name(source: str, part: str, taken: frozenset[str]) -> str:
    name = f"{source}{SEPARATOR}{part}"
    while name in taken:
        name += "'"
    return name


def _year(day: int) -> int:
    return int(_years(np.array([day]))[0])


def _years(day: np.ndarray) -> np.ndarray:
    """Day numbers -> calendar years (proleptic Gregorian, as numpy's datetime64)."""
    return np.asarray(day, dtype=np.int64).astype("datetime64[D]").astype("datetime64[Y]").astype(np.int64) + 1970


def _new_year(year: np.ndarray) -> np.ndarray:
    """Years -> the day number of their 1 January."""
    return (np.asarray(year, dtype=np.int64) - 1970).astype("datetime64[Y]").astype("datetime64[D]").astype(np.int64)


__all__ = ["Part", "is_calendar", "part_column", "part_values", "parts_of", "recompose", "schema_parts"]
