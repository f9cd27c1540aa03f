"""privflow.data.codec: the schema-only map between typed rows and the encoded space."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from privflow.core.errors import DataError
from privflow.data.codec import Codec, Feature
from privflow.data.io import read_table
from privflow.data.schema import Schema

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"

MIXED = Schema.model_validate(
    {
        "dataset": {"name": "mixed"},
        "columns": [
            {"name": "age", "type": "integer", "bounds": [18, 90]},
            {"name": "income", "type": "numeric", "bounds": [0, 1e6], "transform": "log1p", "nullable": True},
            {"name": "color", "type": "categorical", "categories": ["red", "green", "blue"]},
            {"name": "size", "type": "categorical", "categories": ["S", "M", "L"], "nullable": True},
            {"name": "score", "type": "numeric", "bounds": [-2.5, 7.5]},
            {"name": "kids", "type": "integer", "bounds": [0.5, 10.5], "nullable": True},
        ],
    }
)


def mixed_frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "age": pl.Series([18, 90, 45, 30], dtype=pl.Int64),
            "income": [0.0, 1e6, None, 52_345.75],
            "color": pl.Series(["red", "blue", "green", "red"], dtype=pl.Enum(["red", "green", "blue"])),
            "size": pl.Series([None, "S", "L", "M"], dtype=pl.Enum(["S", "M", "L"])),
            "score": [-2.5, 7.5, 0.125, 3.3],
            "kids": pl.Series([1, None, 10, 4], dtype=pl.Int64),
        }
    )


@pytest.fixture(scope="module")
def adult() -> tuple[Schema, pl.DataFrame]:
    """The Adult training rows typed as validate() returns them (casts done here, no GX)."""
    schema = Schema.from_yaml(DEMO / "adult.yaml")
    raw = read_table(DEMO / "adult_train.csv")
    exprs = [
        pl.col(c.name).cast(pl.Enum(list(c.categories or ())))
        if c.is_categorical
        else pl.col(c.name).cast(pl.Int64 if c.type == "integer" else pl.Float64)
        for c in schema.columns
    ]
    return schema, raw.select(exprs)


# --------------------------------------------------------------------------- layout


def test_feature_layout_follows_the_contract() -> None:
    codec = Codec.from_schema(MIXED)
    assert codec.features == [
        Feature("age", "age", "continuous", None),
        Feature("income", "income", "continuous", None),
        Feature("income__missing", "income", "categorical", 2),
        Feature("color", "color", "categorical", 3),
        Feature("size", "size", "categorical", 4),
        Feature("score", "score", "continuous", None),
        Feature("kids", "kids", "continuous", None),
        Feature("kids__missing", "kids", "categorical", 2),
    ]
    assert codec.dim == 8
    assert codec.cardinalities == [None, None, 2, 3, 4, None, None, 2]
    d = codec.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["dim"] == 8 and d["features"][2] == {
        "name": "income__missing",
        "column": "income",
        "kind": "categorical",
        "cardinality": 2,
    }


def test_adult_layout(adult: tuple[Schema, pl.DataFrame]) -> None:
    codec = Codec.from_schema(adult[0])
    # nullable categoricals get one extra code; no numeric Adult column is nullable
    assert codec.cardinalities == [None, 9, None, 16, None, 7, 15, 6, 5, 2, None, None, None, 42, 2]


def test_integer_column_whose_bounds_hold_no_integer_is_refused() -> None:
    with pytest.raises(ValueError, match="hold no whole number"):  # by the schema, before any codec
        Schema.model_validate(
            {"dataset": {"name": "x"}, "columns": [{"name": "a", "type": "integer", "bounds": [0.2, 0.8]}]}
        )


# --------------------------------------------------------------------------- encode


def test_encode_matches_a_hand_computed_reference() -> None:
    codec = Codec.from_schema(MIXED)
    x = codec.encode(mixed_frame())
    assert x.dtype == np.float32 and x.shape == (4, 8)

    def lin(v: float, lo: float, hi: float) -> float:
        return (v - lo) / (hi - lo)

    def logt(v: float, lo: float, hi: float) -> float:
        return (math.log1p(v) - math.log1p(lo)) / (math.log1p(hi) - math.log1p(lo))

    expected = np.array(
        [
            # integer columns: the cell centre x + 1/2 over the cells [lo, hi + 1)
            [lin(18.5, 18, 91), logt(0, 0, 1e6), 0, 0, 3, 0.0, lin(1.5, 1, 11), 0],
            [lin(90.5, 18, 91), logt(1e6, 0, 1e6), 0, 2, 0, 1.0, 0.0, 1],
            [lin(45.5, 18, 91), 0.0, 1, 1, 2, lin(0.125, -2.5, 7.5), lin(10.5, 1, 11), 0],
            [lin(30.5, 18, 91), logt(52_345.75, 0, 1e6), 0, 0, 1, lin(3.3, -2.5, 7.5), lin(4.5, 1, 11), 0],
        ]
    )
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-7)


def test_log1p_spreads_small_values() -> None:
    codec = Codec.from_schema(MIXED)
    df = mixed_frame().with_columns(pl.Series("income", [1.0, 10.0, 100.0, 1000.0]))
    u = codec.encode(df)[:, 1].astype(np.float64)
    # equal steps in log1p, not in x: u(x) = log1p(x) / log1p(1e6)
    np.testing.assert_allclose(u, np.log1p([1.0, 10.0, 100.0, 1000.0]) / math.log1p(1e6), atol=1e-7)
    assert u[1] > 0.15  # a linear scale would put 10 at 1e-5


def test_encode_clips_out_of_bounds_values() -> None:
    codec = Codec.from_schema(MIXED)
    df = mixed_frame().with_columns(pl.Series("age", [5, 200, 45, 30]), pl.Series("score", [-100.0, 1e9, 0.0, 0.0]))
    x = codec.encode(df)
    # integer age clipped to the first and last cell: their centres
    np.testing.assert_allclose((x[0, 0], x[1, 0]), (0.5 / 73, 72.5 / 73), rtol=1e-6)
    assert (x[0, 5], x[1, 5]) == (0.0, 1.0)


def test_encode_is_row_by_row(adult: tuple[Schema, pl.DataFrame]) -> None:
    """Schema-only: a row's code does not depend on the other rows (no data statistic)."""
    schema, df = adult
    codec = Codec.from_schema(schema)
    full = codec.encode(df)
    rows = [0, 17, 31_000]
    np.testing.assert_array_equal(codec.encode(df[rows]), full[rows])
    np.testing.assert_array_equal(codec.encode(df[rows[::-1]]), full[rows[::-1]])


def test_encode_accepts_plain_strings_for_categoricals() -> None:
    codec = Codec.from_schema(MIXED)
    typed = mixed_frame()
    plain = typed.with_columns(pl.col("color").cast(pl.String), pl.col("size").cast(pl.String))
    np.testing.assert_array_equal(codec.encode(plain), codec.encode(typed))


def test_encode_refuses_what_validation_should_have_caught() -> None:
    codec = Codec.from_schema(MIXED)
    df = mixed_frame()
    with pytest.raises(DataError, match="lacks.*'score'"):
        codec.encode(df.drop("score"))
    with pytest.raises(DataError, match="'age'.*1 null"):
        codec.encode(df.with_columns(pl.Series("age", [1, None, 3, 4])))
    with pytest.raises(DataError, match="'color'.*not in its declared"):
        codec.encode(df.with_columns(pl.Series("color", ["red", "pink", "red", "red"])))
    with pytest.raises(DataError, match="'score'.*not numbers"):
        codec.encode(df.with_columns(pl.Series("score", ["a", "b", "c", "d"])))


# --------------------------------------------------------------------------- round trip


def test_round_trip_on_mixed_frame() -> None:
    codec = Codec.from_schema(MIXED)
    df = mixed_frame()
    back = codec.decode(codec.encode(df))
    assert back.schema == df.schema
    for name in ("age", "color", "size", "kids"):
        assert back[name].to_list() == df[name].to_list(), name
    for name in ("income", "score"):
        a, b = df[name].to_numpy(), back[name].to_numpy()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(b[~np.isnan(b)], a[~np.isnan(a)], rtol=2e-6, atol=1e-5)


def _float32_error_bound(schema: Schema, name: str, x: np.ndarray) -> np.ndarray:
    """|decode(encode(x)) - x| before rounding: float32 keeps u to 2^-24 relative (<= 2^-24 absolute
    since u <= 1), and dx/du = width (identity) or width * (1 + x) (log1p)."""
    col = schema.column(name)
    lo, hi = Codec._domain(col)
    if col.transform == "log1p":
        return (math.log1p(hi) - math.log1p(lo)) * (1.0 + x) * 2.0**-24
    return np.full_like(x, (hi - lo) * 2.0**-24, dtype=np.float64)


def test_integer_dequantization_stays_in_the_cell(adult: tuple[Schema, pl.DataFrame]) -> None:
    """Random offsets spread each integer over its unit cell; floor brings it back."""
    schema, df = adult
    codec = Codec.from_schema(schema)
    a = codec.encode(df.head(2000), np.random.default_rng(0))
    b = codec.encode(df.head(2000), np.random.default_rng(1))
    back = codec.decode(a)
    j = [f.name for f in codec.features].index("age")
    assert not np.array_equal(a[:, j], b[:, j])  # the offsets are random...
    for col in ("age", "education-num", "hours-per-week", "capital-loss"):
        assert back[col].equals(df.head(2000)[col]), col  # ...and never leave the cell
    # the zero mass of capital-gain is spread out, not stacked on one value
    g = [f.name for f in codec.features].index("capital-gain")
    assert len(np.unique(a[:, g])) > 1000


def test_round_trip_on_real_adult(adult: tuple[Schema, pl.DataFrame]) -> None:
    schema, df = adult
    codec = Codec.from_schema(schema)
    back = codec.decode(codec.encode(df))
    assert back.schema == df.schema and back.height == df.height
    for col in schema.columns:
        if col.is_categorical:
            assert back[col.name].equals(df[col.name]), col.name  # nulls included
            continue
        x = df[col.name].to_numpy().astype(np.float64)
        y = back[col.name].to_numpy().astype(np.float64)
        err = _float32_error_bound(schema, col.name, x)
        exact = err < 0.5  # rounding recovers the integer whenever the error is below one half
        assert np.array_equal(y[exact], x[exact]), col.name
        assert np.all(np.abs(y[~exact] - x[~exact]) <= 0.5 + err[~exact]), col.name
        if col.name != "fnlwgt":
            assert exact.all(), col.name  # every other Adult column round-trips exactly, row for row
    # fnlwgt (log1p up to 1.5e6) is the only column where float32 cannot hold every integer;
    # in practice almost every row still comes back exactly
    fn, fn_back = df["fnlwgt"].to_numpy(), back["fnlwgt"].to_numpy()
    assert (fn != fn_back).sum() <= 5


# --------------------------------------------------------------------------- decode of anything


def assert_valid(schema: Schema, out: pl.DataFrame, n: int) -> None:
    """Independent check that every decoded row is valid under the schema."""
    assert out.columns == schema.names and out.height == n
    for col in schema.columns:
        s = out[col.name]
        if not col.nullable:
            assert s.null_count() == 0, col.name
        v = s.drop_nulls()
        if col.is_categorical:
            assert set(v.cast(pl.String).to_list()) <= set(col.categories or ()), col.name
        else:
            lo, hi = col.bounds  # type: ignore[misc]
            a = v.to_numpy().astype(np.float64)
            assert np.all(np.isfinite(a)) and np.all(a >= lo) and np.all(a <= hi), col.name
            if col.type == "integer":
                assert s.dtype == pl.Int64 and np.all(a == np.round(a)), col.name


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 30), st.just(8)),
        elements=st.floats(allow_nan=False, allow_infinity=True, width=64),
    )
)
def test_decode_of_arbitrary_arrays_is_valid(a: np.ndarray) -> None:
    codec = Codec.from_schema(MIXED)
    assert_valid(MIXED, codec.decode(a), a.shape[0])


def test_decode_of_wide_random_arrays_on_adult(adult: tuple[Schema, pl.DataFrame]) -> None:
    schema = adult[0]
    codec = Codec.from_schema(schema)
    rng = np.random.default_rng(7)
    a = rng.normal(0.5, 2.0, size=(5000, codec.dim)) * rng.choice([1.0, 50.0, 1e6], size=(5000, codec.dim))
    out = codec.decode(a.astype(np.float32))
    assert_valid(schema, out, 5000)
    # out-of-range codes land on the ends: the missing code (null) for nullable columns
    assert out["workclass"].null_count() > 0 and out["native-country"].null_count() > 0


def test_decode_rules_at_the_edges() -> None:
    codec = Codec.from_schema(MIXED)
    a = np.array(
        [
            # age   income  miss  color size  score  kids  miss
            [-3.0, 2.0, 0.0, 2.99, 3.0, -1.0, 0.0, 0.9],
            [0.5, 0.0, 1.0, -7.0, 0.5, 0.5, 1.0, 1.0],
            [1.0, 1.0, 5.0, 99.0, 2.2, 2.0, 0.5, -4.0],
        ]
    )
    out = codec.decode(a)
    assert out["age"].to_list() == [18, 54, 90]
    assert out["income"].to_list()[0] == pytest.approx(1e6)
    assert out["income"].to_list()[1:] == [None, None]
    assert out["color"].to_list() == ["blue", "red", "blue"]
    assert out["size"].to_list() == [None, "S", "L"]  # code 3 = missing
    assert out["score"].to_list() == [-2.5, 2.5, 7.5]
    assert out["kids"].to_list() == [1, None, 6]  # bounds [0.5, 10.5]: integers 1..10, midpoint 5.5 -> 6


def test_decode_refuses_bad_shapes_and_nan() -> None:
    codec = Codec.from_schema(MIXED)
    with pytest.raises(ValueError, match=r"\[n, 8\]"):
        codec.decode(np.zeros((3, 7)))
    with pytest.raises(ValueError, match=r"\[n, 8\]"):
        codec.decode(np.zeros(8))
    a = np.zeros((2, 8))
    a[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        codec.decode(a)
    assert codec.decode(np.zeros((0, 8))).height == 0


def test_integer_columns_stay_integers_through_pandas() -> None:
    """Nullable integer columns decode as Int64 (pandas: nullable Int64), never 39.0."""
    from privflow.data.codec import restore_types, to_pandas

    schema = Schema.model_validate(
        {
            "dataset": {"name": "t"},
            "columns": [
                {"name": "a", "type": "integer", "bounds": [0, 100], "nullable": True},
                {"name": "b", "type": "integer", "bounds": [0, 100]},
            ],
        }
    )
    codec = Codec(schema)
    arr = np.array([[0.395, 0.0, 0.3], [0.2, 1.0, 0.1]])
    df = codec.decode(arr)
    assert df.schema["a"] == pl.Int64 and df.schema["b"] == pl.Int64
    assert df["a"].to_list() == [39, None]
    pdf = to_pandas(df, schema)
    assert str(pdf["a"].dtype) == "Int64" and pdf["a"].tolist()[0] == 39
    back = restore_types(pl.from_pandas(df.to_pandas()), schema)  # float64 with NaN, as a pyfunc returns it
    assert back.schema["a"] == pl.Int64 and back["a"].to_list() == [39, None]
    assert "39.0" not in back.write_csv()
