"""Target head (privflow/data/target_head.py): the codec that joins the flow's columns with a head for
the target; draws follow the head's probabilities, the likelihood term is a proper conditional,
calibration meets the released class rates, and a stored release rebuilds the same codec."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from privflow.data.codec import Codec
from privflow.data.copula import CopulaCodec, Marginals, marginal_of, schema_cells
from privflow.data.features import feature_matrix
from privflow.data.schema import Schema
from privflow.data.target_head import (
    TargetCodec,
    TargetHead,
    calibration_shift,
    class_count,
    conditional_loglik,
    draw_classes,
    feature_count,
    head_applies,
    head_features,
    head_widths,
    release_codec,
    release_parts,
    target_codes,
)


def make_schema(nullable_target: bool = False) -> Schema:
    return Schema.model_validate(
        {
            "dataset": {"name": "toy", "expected_rows": 1000},
            "target": "label",
            "columns": [
                {"name": "age", "type": "integer", "bounds": [18, 90]},
                {"name": "color", "type": "categorical", "categories": ["red", "green", "blue"], "nullable": True},
                {"name": "gain", "type": "numeric", "bounds": [0.0, 1e5], "transform": "log1p", "nullable": True},
                {
                    "name": "label",
                    "type": "categorical",
                    "categories": ["no", "yes", "maybe"],
                    "nullable": nullable_target,
                },
            ],
        }
    )


def make_rows(n: int, seed: int = 0, nullable_target: bool = False) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 91, n)
    color = rng.choice(["red", "green", "blue", None], n, p=[0.4, 0.3, 0.2, 0.1])
    gain = np.where(rng.random(n) < 0.7, 0.0, rng.exponential(3000, n))
    labels = ["no", "yes", "maybe", None] if nullable_target else ["no", "yes", "maybe"]
    p = [0.5, 0.3, 0.1, 0.1] if nullable_target else [0.5, 0.3, 0.2]
    label = rng.choice(labels, n, p=p)
    return pl.DataFrame(
        {
            "age": pl.Series(age, dtype=pl.Int64),
            "color": pl.Series(list(color), dtype=pl.String).cast(pl.Enum(["red", "green", "blue"])),
            "gain": pl.Series(np.where(rng.random(n) < 0.05, np.nan, gain)).fill_nan(None),
            "label": pl.Series(list(label), dtype=pl.String).cast(pl.Enum(["no", "yes", "maybe"])),
        }
    )


def random_head(schema: Schema, seed: int = 0, scale: float = 1.0) -> TargetHead:
    rng = np.random.default_rng(seed)
    k = class_count(schema.column("label"))
    return TargetHead("label", scale * rng.normal(size=(feature_count(schema), k)), rng.normal(size=k))


def exact_copula(schema: Schema, df: pl.DataFrame) -> CopulaCodec:
    cells = schema_cells(schema, grid_bins=32)
    return CopulaCodec(schema, Marginals({c.column: marginal_of(df, c) for c in cells}, grid_bins=32))


def test_feature_count_is_the_width_of_the_public_encoding() -> None:
    schema, df = make_schema(), make_rows(50)
    assert head_features(schema, df).shape == (50, feature_count(schema))
    assert feature_count(schema) == feature_matrix(schema, df, exclude=("label",))[0].shape[1]


def test_head_applies_only_with_a_target_and_another_column() -> None:
    schema = make_schema()
    assert head_applies(schema)
    assert not head_applies(schema.without("label"))
    alone = Schema.model_validate(
        {
            "dataset": {"name": "x"},
            "target": "y",
            "columns": [{"name": "y", "type": "categorical", "categories": ["a", "b"]}],
        }
    )
    assert not head_applies(alone)


def test_draws_follow_the_head_probabilities() -> None:
    rng = np.random.default_rng(1)
    p = np.array([0.2, 0.5, 0.0, 0.3])
    with np.errstate(divide="ignore"):
        log_p = np.log(np.tile(p, (40_000, 1)))
    codes = draw_classes(log_p, rng.random(40_000))
    counts = np.bincount(codes, minlength=4)
    assert counts[2] == 0  # a class of probability 0 is never drawn
    live = p > 0
    assert stats.chisquare(counts[live], 40_000 * p[live]).pvalue > 1e-4


def test_target_loglik_is_a_proper_conditional() -> None:
    """exp(target_loglik) summed over every class of the same row is 1."""
    schema, df = make_schema(nullable_target=True), make_rows(200, nullable_target=True)
    codec = TargetCodec(schema, Codec.from_schema(schema.without("label")), random_head(schema, scale=0.5))
    total = np.zeros(df.height)
    for label in ["no", "yes", "maybe", None]:
        rows = df.with_columns(pl.Series("label", [label] * df.height, dtype=pl.String).cast(df.schema["label"]))
        total += np.exp(conditional_loglik(codec, rows))
    np.testing.assert_allclose(total, 1.0, rtol=1e-12)


def test_calibration_meets_the_rates_and_closes_empty_classes() -> None:
    rng = np.random.default_rng(2)
    log_probs = np.log(rng.dirichlet([0.5, 2.0, 1.0, 1.0], size=5000))
    rates = np.array([0.1, 0.0, 0.6, 0.3])
    delta = calibration_shift(log_probs, rates)
    assert np.isneginf(delta[1])
    shifted = log_probs + delta
    p = np.exp(shifted - np.logaddexp.reduce(shifted, axis=1, keepdims=True)).mean(axis=0)
    np.testing.assert_allclose(p, rates, atol=1e-5)


def test_decode_returns_the_whole_schema_with_the_target_drawn_by_the_head() -> None:
    schema, df = make_schema(), make_rows(3000)
    codec = TargetCodec.around(schema, exact_copula(schema, df), random_head(schema, seed=3))
    assert codec.dim == 4 and codec.rates is not None  # three columns and their missing pattern
    x = codec.encode(df, np.random.default_rng(0))
    assert x.shape == (3000, 4)
    u = np.random.default_rng(4).random(3000)
    out = codec.decode(x, u)
    assert out.columns == schema.names
    rest = out.drop("label")
    expected = draw_classes(codec.head.log_probs(head_features(schema, rest)), u)
    np.testing.assert_array_equal(target_codes(schema, out), expected)
    assert out.get_column("label").dtype == pl.Enum(["no", "yes", "maybe"])
    with pytest.raises(ValueError, match="one uniform per row"):
        codec.decode(x, u[:10])


def test_nullable_target_has_a_null_class() -> None:
    schema = make_schema(nullable_target=True)
    assert class_count(schema.column("label")) == 4
    df = make_rows(500, nullable_target=True)
    codes = target_codes(schema, df)
    np.testing.assert_array_equal(codes == 3, df.get_column("label").is_null().to_numpy())
    codec = TargetCodec(schema, Codec.from_schema(schema.without("label")), random_head(schema))
    out = codec.decode(codec.encode(df), np.full(500, 0.999999))
    assert out.get_column("label").null_count() > 0  # the last class is null


def test_release_parts_rebuild_the_same_codec() -> None:
    schema, df = make_schema(), make_rows(2000)
    head = random_head(schema, seed=5).shifted(np.array([0.0, -np.inf, 0.5]))
    codec = TargetCodec.around(schema, exact_copula(schema, df), head)
    marginals, stored = release_parts(codec)
    assert marginals is not None and set(marginals["probs"]) == {*schema.names, "(missing)"}
    again = release_codec(schema, marginals, stored)
    assert isinstance(again, TargetCodec)
    np.testing.assert_array_equal(again.head.bias, codec.head.bias)
    np.testing.assert_allclose(again.rates, codec.rates)
    x, u = codec.encode(df, np.random.default_rng(1)), np.random.default_rng(2).random(2000)
    assert again.decode(x, u).equals(codec.decode(x, u))
    np.testing.assert_array_equal(conditional_loglik(again, df), conditional_loglik(codec, df))
    plain = exact_copula(schema, df)
    assert release_parts(plain)[1] is None
    assert release_parts(Codec.from_schema(schema)) == (None, None)


def test_a_head_that_does_not_fit_the_schema_is_refused() -> None:
    schema = make_schema()
    inner = Codec.from_schema(schema.without("label"))
    with pytest.raises(ValueError, match="does not fit"):
        TargetCodec(schema, inner, TargetHead("label", np.zeros((2, 3)), np.zeros(3)))
    with pytest.raises(ValueError, match="every column but the target"):
        TargetCodec(schema, Codec.from_schema(schema), random_head(schema))
    with pytest.raises(ValueError, match="do not match"):
        TargetHead("label", np.zeros((2, 3)), np.zeros(2))


def test_a_codec_without_a_head_adds_nothing() -> None:
    schema, df = make_schema(), make_rows(10)
    assert conditional_loglik(Codec.from_schema(schema), df) == 0.0


def test_compact_log_probs_equal_the_expanded_product() -> None:
    """The sampler's gather per block gives the same probabilities as the [p, K] product of the
    expanded public features, for nullable, missing and undeclared values alike."""
    from privflow.data.features import compact_features, feature_widths

    schema, df = make_schema(nullable_target=True), make_rows(500, nullable_target=True)
    head = random_head(schema, seed=7)
    rest = ("label",)
    as_strings = df.with_columns(pl.col("color").cast(pl.String))
    for frame in (df, as_strings):  # Enum-typed (as validate returns it) and plain strings
        compact = compact_features(schema, frame, rest)
        np.testing.assert_allclose(
            head.compact_log_probs(compact, feature_widths(schema, rest)),
            head.log_probs(head_features(schema, frame)),
            rtol=1e-12,
            atol=1e-12,
        )
    undeclared = as_strings.with_columns(pl.lit("mauve").alias("color"))
    np.testing.assert_allclose(
        head.compact_log_probs(compact_features(schema, undeclared, rest), feature_widths(schema, rest)),
        head.log_probs(head_features(schema, undeclared)),
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("knots", [0, 2, 5])
def test_compact_log_probs_equal_the_expanded_product_with_a_hat_basis(knots: int) -> None:
    """With numerics through a hat basis the sampler's per-block sums still equal the product of
    the expanded features, and the head keeps its knots through the model artifact."""
    from privflow.data.features import compact_features

    schema, df = make_schema(), make_rows(400)
    k = class_count(schema.column("label"))
    rng = np.random.default_rng(3)
    head = TargetHead("label", rng.normal(size=(feature_count(schema, knots), k)), rng.normal(size=k), knots)
    compact = compact_features(schema, df, ("label",))
    np.testing.assert_allclose(
        head.compact_log_probs(compact, head_widths(schema, knots)),
        head.log_probs(head_features(schema, df, knots)),
        rtol=1e-12,
        atol=1e-12,
    )
    again = TargetHead.from_dict(head.to_dict())
    assert again.knots == knots and again.weight.shape == (feature_count(schema, knots), k)


def test_compact_features_fill_the_leading_columns_of_a_given_array() -> None:
    """`out` gets the same numbers as a fresh array in its leading columns (the head's trainer
    adds the class as the last column without a stacked copy) and its other columns untouched;
    an array of the wrong dtype or shape is refused."""
    from privflow.data.features import compact_features

    schema, df = make_schema(), make_rows(50)
    fresh = compact_features(schema, df, ("label",))
    out = np.full((df.height, fresh.shape[1] + 1), 7.0, dtype=np.float32)
    view = compact_features(schema, df, ("label",), out=out)
    np.testing.assert_array_equal(out[:, :-1], fresh)
    np.testing.assert_array_equal(view, fresh)
    assert np.all(out[:, -1] == 7.0)
    for bad in (np.zeros((df.height, fresh.shape[1])), np.zeros((df.height, fresh.shape[1] - 1), np.float32)):
        with pytest.raises(ValueError, match="out must be float32"):
            compact_features(schema, df, ("label",), out=bad)


def test_hat_basis_is_a_partition_of_unity_that_reproduces_lines() -> None:
    from privflow.data.features import hat_basis

    z = np.linspace(0.0, 1.0, 101)
    h = hat_basis(z, 5)
    np.testing.assert_allclose(h.sum(1), 1.0)
    assert ((h > 0).sum(1) <= 2).all()
    np.testing.assert_allclose(h @ np.linspace(0.0, 1.0, 5), z, atol=1e-12)  # linear functions stay exact
    np.testing.assert_allclose(hat_basis(np.array([-0.5, 1.5]), 5), hat_basis(np.array([0.0, 1.0]), 5))


def test_a_head_released_before_the_hat_basis_loads_as_linear() -> None:
    """Stored heads without `numeric_knots` (older registered models) keep their linear features."""
    schema = make_schema()
    stored = random_head(schema).to_dict()
    stored.pop("numeric_knots")
    head = TargetHead.from_dict(stored)
    assert head.knots == 0
    TargetCodec(schema, Codec.from_schema(schema.without("label")), head)  # fits the schema as before
    with pytest.raises(ValueError, match="does not fit"):
        TargetCodec(schema, Codec.from_schema(schema.without("label")), TargetHead("label", head.weight, head.bias, 5))


def test_the_flows_codec_keeps_every_flag_of_the_release() -> None:
    """A release made before the pattern took the nulls (`nulls_in_pattern` False) keeps its
    columns' own null cells in the flow's codec beside a head, as it was trained."""
    schema, df = make_schema(), make_rows(500)
    cells = schema_cells(schema, grid_bins=32)
    for flag in (False, True):
        made = Marginals({c.column: marginal_of(df, c) for c in cells}, grid_bins=32, nulls_in_pattern=flag)
        codec = TargetCodec.around(schema, CopulaCodec(schema, made), random_head(schema))
        assert codec.inner.marginals.nulls_in_pattern is flag
        assert any(codec.inner.values_only) is flag  # gain and color are nullable, under the pattern
        if codec.rates is not None:  # what is stored beside the weights reads back with the same flags
            stored, head = release_parts(codec)
            again = release_codec(schema, stored, head)
            assert again.inner.marginals.nulls_in_pattern is flag
            assert again.inner.marginals.aligned_runs is made.aligned_runs
