"""The toy schema and tables the validation tests share (tests/data/test_validation*.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from privflow.core.errors import ValidationFailed
from privflow.data.schema import Schema
from privflow.data.validation import ValidationReport, validate

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"

SMALL = Schema.model_validate(
    {
        "dataset": {"name": "toy"},
        "columns": [
            {"name": "age", "type": "integer", "bounds": [18, 90]},
            {"name": "income", "type": "numeric", "bounds": [0, 1e6], "transform": "log1p", "nullable": True},
            {"name": "color", "type": "categorical", "categories": ["red", "green", "blue"]},
            {"name": "size", "type": "categorical", "categories": ["S", "M", "L"], "nullable": True},
        ],
    }
)


def toy(n: int = 10) -> pl.DataFrame:
    """All-string frame, as read_table gives a CSV; every row valid under SMALL."""
    return pl.DataFrame(
        {
            "age": [str(20 + i) for i in range(n)],
            "income": [None if i % 4 == 0 else f"{1000.5 * i}" for i in range(n)],
            "color": [["red", "green", "blue"][i % 3] for i in range(n)],
            "size": [None if i % 5 == 0 else ["S", "M", "L"][i % 3] for i in range(n)],
        }
    )


def set_cells(df: pl.DataFrame, column: str, rows: list[int], value: str | None) -> pl.DataFrame:
    idx = pl.int_range(pl.len())
    return df.with_columns(
        pl.when(idx.is_in(rows)).then(pl.lit(value, dtype=pl.String)).otherwise(pl.col(column)).alias(column)
    )


def fails(df: pl.DataFrame, schema: Schema = SMALL, **kw: object) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as exc:
        validate(df, schema, **kw)  # type: ignore[arg-type]
    assert isinstance(exc.value.report, ValidationReport)  # type: ignore[attr-defined]
    return exc.value
