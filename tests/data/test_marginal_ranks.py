"""The target head on the marginals' ranks (privflow/data/marginal_ranks.py): a number's feature is
its released marginal's CDF, checked against the empirical CDF of the rows; a ranked head is
stored, reloaded and scored through the marginals; and where the rows fill a small part of wide
public bounds, a DP-trained head on ranks separates the classes that the public scale blurs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from privflow.core.config import HeadConfig
from privflow.data.codec import Codec
from privflow.data.copula import CopulaCodec, Marginals, marginal_of, schema_cells
from privflow.data.features import compact_features
from privflow.data.marginal_ranks import rank_features
from privflow.data.schema import Schema
from privflow.data.target_head import TargetCodec, TargetHead, feature_count, release_codec, release_parts
from privflow.privacy.accounting.plan import SGDShape
from privflow.tasks.head_stage import fit_head, head_rows


def _schema(n: int) -> Schema:
    return Schema.model_validate(
        {
            "dataset": {"name": "ranks", "expected_rows": n},
            "target": "label",
            "columns": [
                # public bounds far wider than the rows (a bill length in mm, bounded by 1 m)
                {"name": "length", "type": "numeric", "bounds": [0.0, 1000.0], "nullable": True},
                {"name": "count", "type": "integer", "bounds": [0, 100_000]},  # runs of 195 integers a cell
                {"name": "small", "type": "integer", "bounds": [0, 1000]},  # an integer a cell
                {"name": "label", "type": "categorical", "categories": ["edge", "mid"]},
            ],
        }
    )


def _rows(n: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    length = rng.uniform(30.0, 60.0, n)
    count = rng.integers(0, 5000, n)
    small = rng.integers(0, 50, n)
    # not monotone in the length: "mid" between 40 and 50 mm
    label = np.where(np.abs(length + rng.normal(0.0, 1.0, n) - 45.0) < 5.0, "mid", "edge")
    length = np.where(rng.random(n) < 0.05, np.nan, length)
    return pl.DataFrame(
        {
            "length": pl.Series(length).fill_nan(None),
            "count": pl.Series(count, dtype=pl.Int64),
            "small": pl.Series(small, dtype=pl.Int64),
            "label": pl.Series(label).cast(pl.Enum(["edge", "mid"])),
        }
    )


def _exact(schema: Schema, df: pl.DataFrame) -> Marginals:
    return Marginals({c.column: marginal_of(df, c) for c in schema_cells(schema)})


def test_a_numbers_rank_is_its_empirical_cdf_within_a_cell() -> None:
    """Through exact marginals F(x) is the share of rows below x, to within the mass of x's cell
    (the reference: numpy's sorted search over the rows), and a missing value keeps its 0."""
    schema, df = _schema(3000), _rows(3000)
    marginals = _exact(schema, df)
    compact = compact_features(schema, df, ("label",))
    ranked = rank_features(compact.copy(), schema, df, CopulaCodec(schema, marginals), ("label",))
    length = df.get_column("length").to_numpy()
    present = ~np.isnan(length)
    values = np.sort(length[present])
    ecdf = np.searchsorted(values, length[present], side="right") / values.size
    cell_mass = 1000.0 / 512 / 30.0  # a 512-cell grid on [0, 1000], rows uniform over 30 mm
    assert np.max(np.abs(ranked[present, 0] - ecdf)) <= cell_mass + 0.01
    assert np.all(ranked[~present, 0] == 0.0) and np.all(ranked[:, 1] == compact[:, 1])  # the missing flag kept
    for j, name, tolerance in ((2, "count", 1000.0 / 512 / 5000 * 100), (3, "small", 1.0 / 50)):
        x = df.get_column(name).to_numpy()
        ecdf_x = np.searchsorted(np.sort(x), x, side="right") / x.size
        assert np.max(np.abs(ranked[:, j] - ecdf_x)) <= tolerance + 0.01, name  # a cell's mass
    assert compact[present, 0].max() < 0.07  # the public scale: the rows in 3% of [0, 1]


def test_a_ranked_head_is_stored_reloaded_and_scored_through_the_marginals() -> None:
    schema, df = _schema(2000), _rows(2000)
    marginals = _exact(schema, df)
    rng = np.random.default_rng(3)
    head = TargetHead("label", rng.normal(size=(feature_count(schema, 5), 2)), rng.normal(size=2), 5, ranked=True)
    codec = TargetCodec.around(schema, CopulaCodec(schema, marginals), head)
    stored_marginals, stored = release_parts(codec)
    assert stored is not None and stored["ranked"] is True
    again = release_codec(schema, stored_marginals, stored)
    assert isinstance(again, TargetCodec) and again.head.ranked
    np.testing.assert_array_equal(again.head_log_probs(df), codec.head_log_probs(df))
    public = TargetCodec.around(schema, CopulaCodec(schema, marginals), TargetHead("label", head.weight, head.bias, 5))
    assert not np.allclose(public.head_log_probs(df), codec.head_log_probs(df))  # the ranks are what it reads
    with pytest.raises(ValueError, match="DP marginals"):
        TargetCodec(schema, Codec.from_schema(schema.without("label")), head)


def test_a_dp_head_on_ranks_bends_where_the_rows_are() -> None:
    """The label is "mid" for lengths in 40-50 of rows in 30-60 of [0, 1000]: on the public scale
    the hat basis's knots (0, 250, ...) leave the rows one straight piece and the head can only
    guess the majority; on ranks the knots sit at the rows' quantiles and the same DP-SGD (noise
    multiplier 2) finds the bump."""
    n = 1000
    schema, df = _schema(n), _rows(n)
    marginals = _exact(schema, df)
    cfg = HeadConfig()
    shape = SGDShape(250 / n, 60)
    truth = (df.get_column("label") == "mid").to_numpy()

    def accuracy(ranked: bool) -> float:
        rows = head_rows(schema, df, cfg.numeric_knots, CopulaCodec(schema, marginals) if ranked else None)
        head = fit_head(rows, schema, cfg, shape, 2.0, ranked)
        codec = TargetCodec.around(schema, CopulaCodec(schema, marginals), head)
        return float(np.mean((codec.head_log_probs(df).argmax(axis=1) == 1) == truth))

    on_ranks, on_bounds = accuracy(True), accuracy(False)
    majority = max(truth.mean(), 1 - truth.mean())
    assert on_bounds <= majority + 0.03 and on_ranks >= majority + 0.15, (on_ranks, on_bounds, majority)
