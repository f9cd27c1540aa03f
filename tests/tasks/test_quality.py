"""SDMetrics' quality score (tasks/evaluation/quality.py): metadata from the public schema only,
the score's extremes, and its two parts reacting to what they measure."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from privflow.core.errors import DataError
from privflow.data.schema import Schema
from privflow.tasks.evaluation.quality import QUALITY_KEYS, quality_scores, sdmetrics_metadata

pytest.importorskip("sdmetrics", reason="sdmetrics is in the 'dev' and 'bench' extras")

SCHEMA = Schema.model_validate(
    {
        "dataset": {"name": "q", "expected_rows": 2000},
        "target": "y",
        "columns": [
            {"name": "age", "type": "integer", "bounds": [0, 100]},
            {"name": "income", "type": "numeric", "bounds": [0, 1e6], "transform": "log1p"},
            {"name": "city", "type": "categorical", "categories": ["a", "b", "c", "unseen"], "nullable": True},
            {"name": "y", "type": "categorical", "categories": ["no", "yes"]},
        ],
    }
)


def _table(n: int, seed: int, correlated: bool = True) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 90, n)
    noise = rng.normal(0, 0.3, n)
    income = np.exp(8 + 0.03 * (age if correlated else rng.permutation(age)) + noise)
    city = rng.choice(["a", "b", "c", None], n, p=[0.5, 0.3, 0.15, 0.05])
    y = np.where(income > np.median(income), "yes", "no")
    if not correlated:
        y = rng.permutation(y)
    return pl.DataFrame(
        {"age": age, "income": income, "city": city, "y": y},
        schema={
            "age": pl.Int64,
            "income": pl.Float64,
            "city": pl.Enum(["a", "b", "c", "unseen"]),
            "y": pl.Enum(["no", "yes"]),
        },
    )


def test_metadata_comes_from_the_schema_not_the_rows() -> None:
    meta = sdmetrics_metadata(SCHEMA)["tables"]["table"]["columns"]
    assert meta == {
        "age": {"sdtype": "numerical", "computer_representation": "Int64"},
        "income": {"sdtype": "numerical", "computer_representation": "Float"},
        "city": {"sdtype": "categorical"},
        "y": {"sdtype": "categorical"},
    }


def test_identical_tables_score_one() -> None:
    real = _table(1500, 0)
    q = quality_scores(SCHEMA, real, real)
    assert set(q) == set(QUALITY_KEYS)
    for v in q.values():
        assert v == pytest.approx(1.0, abs=1e-9)


def test_shapes_and_pair_trends_measure_what_they_say() -> None:
    real = _table(2000, 0)
    same_population = quality_scores(SCHEMA, real, _table(2000, 1))
    rows_shuffled = quality_scores(SCHEMA, real, real.select(pl.all().shuffle(seed=3)))  # one permutation
    # the same marginals with the dependence broken: column shapes stay perfect, pair trends drop
    shuffled = real.with_columns(*(pl.col(c).shuffle(seed=i) for i, c in enumerate(real.columns)))
    broken = quality_scores(SCHEMA, real, shuffled)
    assert broken["quality_column_shapes"] == pytest.approx(1.0, abs=1e-9)
    assert broken["quality_column_pair_trends"] < same_population["quality_column_pair_trends"] - 0.1
    assert rows_shuffled["quality_score"] == pytest.approx(1.0, abs=1e-9)  # row order is not a property
    # a collapsed column costs column shapes
    collapsed = real.with_columns(pl.lit(50, dtype=pl.Int64).alias("age"))
    shapes = quality_scores(SCHEMA, real, collapsed)["quality_column_shapes"]
    assert shapes < same_population["quality_column_shapes"] - 0.1
    overall = broken["quality_score"]
    assert overall == pytest.approx((broken["quality_column_shapes"] + broken["quality_column_pair_trends"]) / 2)


def test_a_missing_column_is_a_data_error() -> None:
    real = _table(200, 0)
    with pytest.raises(DataError, match="synthetic"):
        quality_scores(SCHEMA, real, real.drop("city"))
