"""Copula codec: a pure function of the schema and the released marginals; round trips, decoded
marginals equal the released ones, spikes and bounds kept, row by row at any batch size."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
from scipy import stats

from privflow.core.errors import DataError
from privflow.data.copula import (
    NULL_BAND,
    U_MARGIN,
    CopulaCodec,
    Marginals,
    column_cells,
    marginal_of,
    schema_cells,
)
from privflow.data.schema import Column, Schema
from privflow.privacy.mechanisms.dp_marginals import with_pattern_nulls


def make_schema() -> Schema:
    return Schema.model_validate(
        {
            "dataset": {"name": "toy"},
            "columns": [
                {
                    "name": "color",
                    "type": "categorical",
                    "categories": ["red", "green", "blue", "teal"],
                    "nullable": True,
                },
                {"name": "term", "type": "integer", "bounds": [12, 60]},
                {"name": "gain", "type": "integer", "bounds": [0, 100000], "transform": "log1p", "nullable": True},
                {"name": "big", "type": "integer", "bounds": [-5000, 5000]},
                {"name": "score", "type": "numeric", "bounds": [-2.0, 3.0]},
                {"name": "income", "type": "numeric", "bounds": [0.0, 1e6], "transform": "log1p", "nullable": True},
                {"name": "flag", "type": "categorical", "categories": ["no", "yes"]},
            ],
        }
    )


def make_frame(n: int, seed: int = 0) -> pl.DataFrame:
    g = np.random.default_rng(seed)
    colors = np.array(["red", "green", "blue", "teal", None], dtype=object)[
        g.choice(5, n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    ]
    gain = np.where(g.random(n) < 0.8, 0, g.integers(0, 100001, n))
    gain_null = g.random(n) < 0.05
    income = np.exp(g.normal(10, 1.5, n)).clip(0, 1e6)
    income_null = g.random(n) < 0.1
    return pl.DataFrame(
        {
            "color": pl.Series(colors.tolist(), dtype=pl.String).cast(pl.Enum(["red", "green", "blue", "teal"])),
            "term": g.choice([12, 24, 36, 48, 60], n),
            "gain": pl.Series([None if z else int(v) for v, z in zip(gain, gain_null, strict=True)], dtype=pl.Int64),
            "big": g.integers(-5000, 5001, n),
            "score": g.uniform(-2.0, 3.0, n),
            "income": pl.Series(
                [None if z else float(v) for v, z in zip(income, income_null, strict=True)], dtype=pl.Float64
            ),
            "flag": pl.Series(g.choice(["no", "yes"], n)).cast(pl.Enum(["no", "yes"])),
        }
    )


def positive_marginals(schema: Schema, seed: int = 1, **kw: int) -> Marginals:
    """Released-looking marginals with mass in every cell (public: drawn from a seed, not from rows),
    a tenth of each column's spread evenly so that no cell (the raked missing pattern's included)
    is thinner than the codec's resolution of u (U_MARGIN)."""
    g = np.random.default_rng(seed)
    cells = schema_cells(schema, **kw)
    probs = {c.column: 0.9 * g.dirichlet(np.ones(c.n_cells)) + 0.1 / c.n_cells for c in cells}
    return Marginals(with_pattern_nulls(probs, cells), **kw)


def tvd(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


# ---------------------------------------------------------------------------- cells


def test_cells_are_public_and_cover_the_support() -> None:
    small = column_cells(Column(name="t", type="integer", bounds=(12, 60)))
    assert small.is_atomic and small.n_cells == 49 and small.starts[0] == 12 and small.ends[-1] == 61
    big = column_cells(
        Column(name="g", type="integer", bounds=(0, 100000), transform="log1p", nullable=True),
        max_atoms=1024,
        grid_bins=512,
    )
    assert big.n_values <= 512 and big.n_cells == big.n_values + 1
    assert big.starts[0] == 0 and big.ends[-1] == 100001
    assert np.all(big.ends > big.starts) and np.array_equal(big.starts[1:], big.ends[:-1])
    assert np.array_equal(big.starts[:5], [0, 1, 2, 3, 4])  # log grid: 0 and small gains are atoms
    lin = column_cells(Column(name="b", type="integer", bounds=(-5000, 5000)), grid_bins=100)
    widths = lin.ends - lin.starts
    assert lin.n_values == 100 and widths.max() - widths.min() <= 1  # equal-width runs
    num = column_cells(Column(name="x", type="numeric", bounds=(0.0, 1e6), transform="log1p"), grid_bins=64)
    assert num.n_values == 64 and num.edges[0] == 0.0 and num.edges[-1] == pytest.approx(np.log1p(1e6))


# ---------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("space", ["uniform", "gaussian"])
def test_round_trip(space: str) -> None:
    schema = make_schema()
    df = make_frame(20_000)
    codec = CopulaCodec.from_marginals(schema, positive_marginals(schema), space=space)  # type: ignore[arg-type]
    u = codec.encode(df, np.random.default_rng(3))
    assert u.shape == (df.height, 8)  # 7 columns and the missing pattern of the nullable ones
    assert u.dtype == np.float64 and np.isfinite(u).all()
    if space == "uniform":
        assert u.min() >= U_MARGIN and u.max() <= 1 - U_MARGIN
    back = codec.decode(u)
    assert back.columns == schema.names
    assert back.schema == df.schema
    for name in ("color", "term", "gain", "big", "flag"):
        assert back[name].equals(df[name]), name
    for name in ("score", "income"):
        a, b = df[name].to_numpy(), back[name].to_numpy()
        assert np.array_equal(np.isnan(a), np.isnan(b))
        cells = codec.cells[schema.names.index(name)]
        ok = ~np.isnan(a)
        bin_width = np.diff(cells.edges).max()
        t = np.log1p if cells.transform == "log1p" else (lambda v: v)
        assert np.abs(t(a[ok]) - t(b[ok])).max() <= bin_width  # within one bin on the column's scale
        assert np.abs(a[ok] - b[ok]).max() <= 1e-6 * max(1.0, np.abs(a[ok]).max())  # in fact exact


def test_encode_is_uniform_under_the_data_marginals() -> None:
    """With the data's own marginals every column encodes to U(0, 1): the copula's premise. A column
    the missing pattern covers: its present values do, its missing ones lie in the band of width
    `null_band` around 1/2 (with a band of 1, the whole column is uniform, as releases made before)."""
    from scipy import stats

    from privflow.data.copula import cell_positions, cell_series

    schema = make_schema()
    df = make_frame(20_000, seed=5)
    m = Marginals({c.column: marginal_of(df, c) for c in schema_cells(schema)})
    for band in (m.null_band, 1.0):
        codec = CopulaCodec.from_marginals(schema, dataclasses.replace(m, null_band=band))
        u = codec.encode(df, np.random.default_rng(6))
        for j, c in enumerate(codec.cells):
            missing = (cell_positions(cell_series(df, c), c)[0] >= c.n_values) & codec.values_only[j]
            if missing.any() and band < 1.0:
                assert np.all(np.abs(u[missing, j] - 0.5) <= band / 2), c.column
            keep = ~missing if band < 1.0 else np.ones(len(missing), dtype=bool)
            assert stats.kstest(u[keep, j], "uniform").pvalue > 1e-3, (c.column, band)
    assert any(codec.values_only)  # the schema has columns the pattern covers


def test_encode_depends_only_on_schema_marginals_and_generator() -> None:
    """A row's code is fixed by its own value, the marginals and the draws: the same rows inside a
    larger frame land in the same cell intervals (numeric: the same point); no statistic of the rows."""
    from privflow.data.copula import cell_positions, cell_series

    schema = make_schema()
    m = positive_marginals(schema)
    df = make_frame(500)
    codec = CopulaCodec.from_marginals(schema, m)
    a = codec.encode(df, np.random.default_rng(11))
    assert np.array_equal(a, CopulaCodec.from_marginals(schema, m).encode(df, np.random.default_rng(11)))
    b = codec.encode(pl.concat([df, make_frame(3000, seed=2)]), np.random.default_rng(12))[:500]
    for j, c in enumerate(codec.cells):
        idx, _ = cell_positions(cell_series(df, c), c)
        lo, hi = codec.cdfs[j][idx], codec.cdfs[j][idx + 1]
        # a missing value of a column the pattern covers: an independent uniform, anywhere in (0, 1)
        apart = codec.values_only[j] & (idx >= c.n_values)
        for u in (a[:, j], b[:, j]):
            assert np.all(((u >= np.maximum(lo, U_MARGIN)) & (u < hi)) | apart), c.column
            assert np.all((u[apart] >= U_MARGIN) & (u[apart] <= 1 - U_MARGIN))
        if c.kind == "numeric":  # no draw, except in the null cell
            value = idx < c.n_values
            assert np.array_equal(a[value, j], b[value, j])
    with pytest.raises(TypeError):
        codec.encode(df, None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- decode reproduces marginals


def sparse_marginals(schema: Schema, g: np.random.Generator, **kw: int) -> Marginals:
    """Sparse, spiky marginals with zero cells, like a projected DP release."""
    probs = {}
    cells = schema_cells(schema, **kw)
    for c in cells:
        p = g.dirichlet(np.full(c.n_cells, 0.3)) * (g.random(c.n_cells) < 0.6)
        p[0] += 0.05
        probs[c.column] = p / p.sum()
    return Marginals(with_pattern_nulls(probs, cells), **kw)


def test_decode_of_uniform_reproduces_the_marginals() -> None:
    """TVD < 0.01 for 200k draws on cells of about 50 (200k multinomial draws over K cells
    alone give a TVD near 0.5 * sum_k sqrt(2 p_k / (pi n)), ~0.02 for 512 even cells)."""
    g = np.random.default_rng(21)
    schema = make_schema()
    m = sparse_marginals(schema, g, max_atoms=64, grid_bins=48)
    codec = CopulaCodec.from_marginals(schema, m)
    out = codec.decode(g.random((200_000, codec.dim)))
    for c in codec.cells:
        got = marginal_of(out, c)
        assert tvd(got, m.probs[c.column]) < 0.01, c.column
        assert np.all(got[m.probs[c.column] == 0] == 0), c.column  # cells of zero mass never drawn


def test_decode_of_uniform_is_exact_on_the_default_grid() -> None:
    """On the default (fine) cells: decoded counts pass a chi-square test against the marginals."""
    from scipy import stats

    g = np.random.default_rng(22)
    schema = make_schema()
    m = sparse_marginals(schema, g)
    codec = CopulaCodec.from_marginals(schema, m)
    n = 200_000
    out = codec.decode(g.random((n, codec.dim)))
    for c in codec.cells:
        p = m.probs[c.column]
        counts = marginal_of(out, c) * n
        assert np.all(counts[p == 0] == 0), c.column
        big = n * p >= 5  # pool the small cells into one
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(n * p[big], n * p[~big].sum())
        keep = exp > 0
        if keep.sum() == 1:  # all the mass in one cell (a sparse draw of the marginals): every row there
            assert obs[keep][0] == pytest.approx(n), c.column
            continue
        assert stats.chisquare(obs[keep], exp[keep]).pvalue > 1e-4, c.column


def test_gaussian_space_decodes_normal_draws_to_the_marginals() -> None:
    schema = make_schema()
    m = positive_marginals(schema, seed=4, max_atoms=64, grid_bins=48)
    codec = CopulaCodec.from_marginals(schema, m, space="gaussian")
    out = codec.decode(np.random.default_rng(8).standard_normal((200_000, codec.dim)))
    for c in codec.cells:
        assert tvd(marginal_of(out, c), m.probs[c.column]) < 0.01, c.column


def test_spikes_are_kept() -> None:
    """An integer column with support {12, 24, 36, 48, 60} decodes only to those values."""
    schema = Schema.model_validate(
        {"dataset": {"name": "loans"}, "columns": [{"name": "term", "type": "integer", "bounds": [12, 60]}]}
    )
    cells = schema_cells(schema)[0]
    p = np.zeros(cells.n_cells)
    spikes = np.array([12, 24, 36, 48, 60])
    p[spikes - 12] = [0.1, 0.2, 0.4, 0.2, 0.1]
    codec = CopulaCodec.from_marginals(schema, Marginals({"term": p}))
    u = np.random.default_rng(2).random((200_000, 1))
    before = u.copy()
    out = codec.decode(u)["term"].to_numpy()
    assert np.array_equal(u, before)  # decode never writes into its input
    assert set(np.unique(out)) == set(spikes)
    assert np.bincount((out - 12) // 12) / out.size == pytest.approx(p[spikes - 12], abs=0.005)
    # the extreme ends of (0, 1) still decode to spikes, not to the bounds' neighbours
    ends = codec.decode(np.array([[0.0], [1e-300], [1 - 1e-16], [1.0], [-3.0], [7.0]]))["term"].to_list()
    assert set(ends) <= set(spikes.tolist())


def test_numeric_decimals_keep_lattice_spikes_in_their_cells() -> None:
    """A numeric column written with 0 decimals (wind in steps of 5 on a 512-cell grid over [0, 320]):
    the decoded values are whole numbers, each in the cell its marginal drew, so the exact marginal
    gives back the spikes' masses (rounding after decoding wrote a fifth of a spike one step up). Where
    a cell holds several lattice points (a log1p grid's wide cells), the position inside it decides."""
    col = {"name": "wind", "type": "numeric", "bounds": [0, 320], "decimals": 0}
    schema = Schema.model_validate({"dataset": {"name": "storms"}, "columns": [col]})
    cells = schema_cells(schema)[0]
    real = pl.DataFrame({"wind": np.random.default_rng(4).choice(np.arange(10, 170, 5), 20_000).astype(float)})
    codec = CopulaCodec.from_marginals(schema, Marginals({"wind": marginal_of(real, cells)}))
    out = codec.decode(np.random.default_rng(5).random((100_000, 1)))["wind"].to_numpy()
    assert np.array_equal(out, np.round(out))
    spikes, x = np.arange(10, 170, 5), real["wind"].to_numpy()
    real_mass, got = np.array([np.mean(x == v) for v in spikes]), np.array([np.mean(out == v) for v in spikes])
    assert np.abs(got - real_mass).max() < 0.006
    assert np.mean(np.isin(out, spikes)) > 0.995


def test_declared_atoms_are_point_masses_kept_exactly() -> None:
    """A numeric column's declared atoms (0 and a default of 3.25, one at each bound, on the linear
    and the log1p scale) get zero-width cells, and an integer column's wide-range atoms runs of
    one integer: rows equal to an atom encode into its cell and decode back to it exactly, and
    the decoded share of each atom is its marginal's mass (fuzzing round 6: all were smeared
    over their grid cell)."""
    rng = np.random.default_rng(0)
    n = 4000
    x = np.where(rng.random(n) < 0.5, 0.0, rng.exponential(5, n).round(3))
    x[:300] = 3.25
    df = pl.DataFrame(
        {
            "x": x,
            "big": rng.choice([10, 500_000, 900_000], n, p=[0.5, 0.3, 0.2]),
            "lg": np.where(rng.random(n) < 0.4, 0.0, rng.exponential(50, n).round(2)),
        }
    )
    schema = Schema.model_validate(
        {
            "dataset": {"name": "atoms"},
            "columns": [
                {"name": "x", "type": "numeric", "bounds": [0, 100], "atoms": [0, 3.25, 100]},
                {"name": "big", "type": "integer", "bounds": [0, 1_000_000], "atoms": [10, 500_000, 900_000]},
                {"name": "lg", "type": "numeric", "bounds": [0, 1000], "transform": "log1p", "atoms": [0]},
            ],
        }
    )
    cells = schema_cells(schema, grid_bins=16)
    x_cells = cells[0]
    # 16 bins, 3.25's bin split in two around it, 3 atom cells: an atom on a grid edge (0, 100) adds
    # its own cell only, not a second empty one
    assert x_cells.n_cells == 16 + 1 + 3
    assert np.all(np.diff(x_cells.edges)[x_cells.atom_cells] == 0)
    assert np.count_nonzero(np.diff(x_cells.edges) == 0) == 3
    assert {10, 500_000, 900_000} <= {int(a) for a, b in zip(cells[1].starts, cells[1].ends, strict=True) if b - a == 1}
    codec = CopulaCodec(schema, Marginals({c.column: marginal_of(df, c) for c in cells}, grid_bins=16))
    back = codec.decode(codec.encode(df, np.random.default_rng(1)))
    for name, atoms in (("x", [0.0, 3.25]), ("lg", [0.0])):
        for a in atoms:
            assert np.array_equal(back[name].to_numpy() == a, df[name].to_numpy() == a), (name, a)
    assert back["big"].equals(df["big"])
    drawn = codec.decode(np.random.default_rng(2).random((40_000, 3)))
    for name, a in (("x", 0.0), ("x", 3.25), ("lg", 0.0), ("big", 500_000)):
        assert float((drawn[name] == a).mean()) == pytest.approx(float((df[name] == a).mean()), abs=0.01), (name, a)
    assert float((drawn["x"] == 100.0).mean()) == 0.0  # an atom without mass is never drawn
    other = CopulaCodec(
        schema.without("lg"), Marginals({c.column: marginal_of(df, c) for c in cells[:2]}, grid_bins=16)
    )
    assert not codec.same_cells(other)
    # an integer atom moved by one keeps the count of cells, not the cells: versions are not comparable
    moved_cols = tuple(
        c.model_copy(update={"atoms": (11, 500_000, 900_000)}) if c.name == "big" else c for c in schema.columns
    )
    moved = schema.model_copy(update={"columns": moved_cols})
    moved_cells = schema_cells(moved, grid_bins=16)
    again = CopulaCodec(moved, Marginals({c.column: marginal_of(df, c) for c in moved_cells}, grid_bins=16))
    assert again.cells[1].n_cells == codec.cells[1].n_cells and not codec.same_cells(again)
    assert codec.same_cells(CopulaCodec(schema, codec.marginals))


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ({"name": "c", "type": "categorical", "categories": ["a"], "atoms": [1]}, "do not apply"),
        ({"name": "v", "type": "numeric", "bounds": [0, 1], "atoms": [2]}, "outside its bounds"),
        ({"name": "v", "type": "integer", "bounds": [0, 9], "atoms": [1.5]}, "whole numbers"),
        ({"name": "v", "type": "numeric", "bounds": [0, 1], "atoms": [0.5, 0.5]}, "not unique"),
        ({"name": "v", "type": "numeric", "bounds": [0, 1], "atoms": [True, 0]}, "must be numbers"),  # YAML's yes
        ({"name": "v", "type": "numeric", "bounds": [0, 1], "atoms": ["0"]}, "must be numbers"),
    ],
)
def test_atoms_are_checked_by_the_schema(column: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Column.model_validate(column)


def test_bounds_respected_for_any_input() -> None:
    schema = make_schema()
    codec = CopulaCodec.from_marginals(schema, positive_marginals(schema))
    g = np.random.default_rng(1)
    wild = np.vstack(
        [
            g.random((1000, codec.dim)),
            g.normal(0, 5, (1000, codec.dim)),
            np.full((1, codec.dim), np.inf),
            np.full((1, codec.dim), -np.inf),
            np.zeros((1, codec.dim)),
            np.ones((1, codec.dim)),
        ]
    )
    out = codec.decode(wild)
    for col in schema.columns:
        s = out[col.name].drop_nulls()
        if col.is_categorical:
            assert set(s.cast(pl.String).to_list()) <= set(col.categories or ())
        else:
            assert s.min() >= col.bounds[0] and s.max() <= col.bounds[1]  # type: ignore[index]
            if not col.nullable:
                assert out[col.name].null_count() == 0
    # out-of-bounds inputs are clipped on encode, like the schema codec does
    df = make_frame(10).with_columns(pl.lit(1e9).alias("score"), pl.lit(-7).cast(pl.Int64).alias("term"))
    back = codec.decode(codec.encode(df, np.random.default_rng(0)))
    assert back["score"].to_list() == pytest.approx([3.0] * 10)
    assert back["term"].to_list() == [12] * 10


def test_decode_is_row_by_row_at_any_batch_size() -> None:
    """A large batch decodes as its rows would one batch at a time (nothing depends on the batch's
    size or on other rows), so sampling may decode in chunks of any size. How fast a million rows
    decode is a benchmark (benchmarks/bench_test_bounds.py), not a test."""
    schema = make_schema()
    codec = CopulaCodec.from_marginals(schema, positive_marginals(schema))
    u = np.random.default_rng(0).random((200_000, codec.dim))
    whole = codec.decode(u)
    assert whole.height == 200_000 and whole.columns == schema.names
    cuts = [0, 1, 7, 50_000, 123_457, 200_000]
    pieces = pl.concat([codec.decode(u[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)])
    assert whole.equals(pieces)


# ---------------------------------------------------------------------------- contracts


def test_bad_inputs_are_refused() -> None:
    schema = make_schema()
    m = positive_marginals(schema)
    codec = CopulaCodec.from_marginals(schema, m)
    with pytest.raises(ValueError):
        codec.decode(np.zeros((3, 6)))
    with pytest.raises(ValueError):
        codec.decode(np.full((3, 7), np.nan))
    short = dict(m.probs)
    short["term"] = short["term"][:-1]
    with pytest.raises(ValueError):
        CopulaCodec.from_marginals(schema, Marginals(short))
    with pytest.raises(ValueError):
        CopulaCodec.from_marginals(schema, Marginals({k: v for k, v in m.probs.items() if k != "flag"}))
    neg = dict(m.probs)
    neg["flag"] = np.array([-0.5, 1.5])
    with pytest.raises(ValueError):
        CopulaCodec.from_marginals(schema, Marginals(neg))
    with pytest.raises(ValueError):
        CopulaCodec.from_marginals(schema, m, space="beta")  # type: ignore[arg-type]
    bad = make_frame(5).with_columns(pl.lit(None, dtype=pl.Int64).alias("term"))
    with pytest.raises(DataError):
        codec.encode(bad, np.random.default_rng(0))
    with pytest.raises(DataError):
        codec.encode(make_frame(5).drop("flag"), np.random.default_rng(0))


def test_marginals_serialise() -> None:
    import json

    schema = make_schema()
    m = positive_marginals(schema, max_atoms=64, grid_bins=32)
    again = Marginals.from_dict(json.loads(json.dumps(m.to_dict())))
    assert (again.max_atoms, again.grid_bins) == (64, 32)
    u = np.random.default_rng(0).random((100, CopulaCodec(schema, m).dim))
    assert CopulaCodec(schema, again).decode(u).equals(CopulaCodec(schema, m).decode(u))


def test_uniformize_makes_each_column_uniform_and_keeps_the_ranks() -> None:
    """The randomised rank transform of a sampled batch: exactly uniform per column, the
    batch's ranks (its dependence) unchanged, any batch size."""
    schema = Schema.model_validate(
        {
            "dataset": {"name": "t", "expected_rows": 1000},
            "columns": [
                {"name": "a", "type": "numeric", "bounds": [0, 1]},
                {"name": "b", "type": "categorical", "categories": ["x", "y", "z"]},
            ],
        }
    )
    from privflow.data.copula import column_cells

    probs = {c.name: np.full(column_cells(c).n_cells, 1.0) for c in schema.columns}
    codec = CopulaCodec.from_marginals(schema, Marginals(probs))
    rng = np.random.default_rng(0)
    skewed = rng.beta(5, 1, size=(20_000, 2))  # far from uniform, correlated below
    skewed[:, 1] = 0.7 * skewed[:, 0] + 0.3 * skewed[:, 1]
    out = codec.uniformize(skewed, rng.random(skewed.shape))
    for j in range(2):
        assert stats.kstest(out[:, j], "uniform").pvalue > 0.01
        np.testing.assert_array_equal(np.argsort(out[:, j]), np.argsort(skewed[:, j], kind="stable"))
    one = codec.uniformize(skewed[:1], rng.random((1, 2)))
    assert one.shape == (1, 2) and ((one > 0) & (one < 1)).all()


def _stable_ranks_reference(u: np.ndarray, jitter: np.ndarray) -> np.ndarray:
    """The randomised rank transform written plainly: ranks from two stable argsorts of float64."""
    u = np.asarray(u, dtype=np.float64)
    ranks = np.argsort(np.argsort(u, axis=0, kind="stable"), axis=0, kind="stable")
    return np.clip((ranks + jitter) / u.shape[0], U_MARGIN, 1 - U_MARGIN)


@pytest.mark.parametrize("m", [1, 2, 3, 257, 20_000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniformize_equals_the_stable_rank_reference(m: int, dtype: type) -> None:
    """The fast ranks (two radix passes over float32 keys; a stable argsort otherwise) are those of
    a stable sort exactly: ties in row order, -0.0 tied with 0.0, negatives, infinities, the
    clamped 0 and 1 a flow returns; NaN takes the plain path."""
    schema = make_schema()  # the plain ranks: no band (`test_a_banded_column_is_ranked_among_its_present_rows`)
    codec = CopulaCodec.from_marginals(schema, dataclasses.replace(positive_marginals(schema), null_band=1.0))
    rng = np.random.default_rng(m)
    u = rng.random((m, codec.dim)).astype(dtype)
    u[: m // 3] = np.round(u[: m // 3], 1)  # many ties
    u[::3, 0], u[::4, 0] = 0.0, -0.0
    u[::5, 1], u[::7, 1] = 1.0, -np.inf
    u[:, 2] = -u[:, 2]
    u[::11, 3] = np.inf
    jitter = rng.random(u.shape)
    np.testing.assert_array_equal(codec.uniformize(u, jitter), _stable_ranks_reference(u, jitter))
    u[::13, 4] = np.nan
    np.testing.assert_array_equal(codec.uniformize(u, jitter), _stable_ranks_reference(u, jitter))


def test_uniformize_in_gaussian_space_is_the_normal_quantile_of_the_ranks() -> None:
    schema = make_schema()
    codec = CopulaCodec.from_marginals(
        schema, dataclasses.replace(positive_marginals(schema), null_band=1.0), space="gaussian"
    )
    rng = np.random.default_rng(3)
    u, jitter = rng.normal(size=(500, codec.dim)).astype(np.float32), rng.random((500, codec.dim))
    np.testing.assert_array_equal(codec.uniformize(u, jitter), stats.norm.ppf(_stable_ranks_reference(u, jitter)))


@pytest.mark.parametrize("knots", [2, 3, 18, 118, 1026, 5001])
def test_decode_cell_lookup_equals_binary_search(knots: int) -> None:
    """decode's cell of u (a bucket table, then a comparison or a binary search) is
    searchsorted(cdf, u, 'right') - 1 exactly: on knots, a hair either side of them, 0, the
    largest u below 1, zero-mass cells (repeated knots) and crowded tails."""
    rng = np.random.default_rng(knots)
    for trial in range(12):
        p = rng.dirichlet(np.full(knots - 1, 0.2 if trial % 2 else 3.0))
        if trial % 3 == 0:
            p[rng.random(knots - 1) < 0.3] = 0.0
            p = p / p.sum() if p.sum() > 0 else np.full(knots - 1, 1.0 / (knots - 1))
        cdf = np.concatenate([[0.0], np.cumsum(p)])
        cdf /= cdf[-1]
        cdf[-1] = 1.0
        u = rng.random(3000)
        u[:300] = rng.choice(cdf, 300)
        u[300:600] = rng.choice(cdf, 300) + rng.choice([-1.0, 1.0], 300) * np.finfo(float).eps
        u[600], u[601] = 0.0, np.nextafter(1.0, 0.0)
        u = np.clip(u, 0.0, np.nextafter(1.0, 0.0))
        np.testing.assert_array_equal(CopulaCodec._cell_of(cdf, u), np.searchsorted(cdf, u, side="right") - 1)


@pytest.mark.parametrize(
    ("bounds", "transform"),
    [
        ((0, 2400), "none"),
        ((-5000, 5000), "none"),
        ((7, 123_457), "none"),
        ((0, 100_000), "log1p"),
        ((3, 9999), "log1p"),
    ],
)
def test_an_integer_columns_runs_never_straddle_a_summary_bins_edge(bounds: tuple[int, int], transform: str) -> None:
    """On the default 640-cell grid, every integer of a run falls in one bin of the 10-, 20-, 40- and
    80-bin summaries of the public bounds (`features.binned_counts`: flights' departures at 6:00 are
    600 on [0, 2400], an edge of the 20-bin summary, and a run across it drew some of them below)."""
    from privflow.data.features import binned_counts

    col = Column(name="x", type="integer", bounds=bounds, transform=transform)
    cells = column_cells(col)
    assert cells.starts[0] == bounds[0] and cells.ends[-1] == bounds[1] + 1
    for n_bins in (10, 20, 40, 80):
        for start, end in zip(cells.starts, cells.ends, strict=True):
            values = pl.DataFrame({"x": np.arange(start, end, dtype=np.int64)})
            counts, _ = binned_counts(col, values, n_bins)
            assert np.count_nonzero(counts) == 1, (n_bins, start, end)


def test_a_release_made_before_the_aligned_runs_decodes_on_its_own_runs() -> None:
    """A stored release without `aligned_runs` reads as made: its integer columns' runs are the grid
    over [lo, hi + 1], rounded, as when it was trained; a new release's are the aligned ones. Without
    `null_band`, a missing value's coordinate spans (0, 1) as it did."""
    schema = Schema.model_validate(
        {"dataset": {"name": "t"}, "columns": [{"name": "minutes", "type": "integer", "bounds": [0, 2400]}]}
    )
    col = schema.column("minutes")
    old, new = column_cells(col, aligned_runs=False), column_cells(col)
    assert old.n_cells == new.n_cells and not np.array_equal(old.starts, new.starts)
    stored = Marginals({"minutes": np.full(old.n_cells, 1.0 / old.n_cells)}).to_dict()
    del stored["aligned_runs"], stored["null_band"]
    loaded = Marginals.from_dict(stored)
    assert loaded.aligned_runs is False and Marginals.from_dict(Marginals(loaded.probs).to_dict()).aligned_runs
    assert loaded.null_band == 1.0 and Marginals.from_dict(Marginals(loaded.probs).to_dict()).null_band == NULL_BAND
    codec = CopulaCodec.from_marginals(schema, loaded)
    assert np.array_equal(codec.cells[0].starts, old.starts)


def test_a_banded_column_is_ranked_among_its_present_rows() -> None:
    """With missing values in a band (`null_band` < 1), `uniformize` ranks a column the pattern
    covers among the rows the batch's pattern calls present, (rank + V) / k, so its decoded values
    follow their marginal; the pattern, the other columns and the rows called missing keep the plain
    ranks. Decoded: the present values' marginal matches the released one."""
    schema = make_schema()
    m = positive_marginals(schema)
    assert m.null_band < 1.0
    banded, plain = (
        CopulaCodec.from_marginals(schema, m),
        CopulaCodec.from_marginals(schema, dataclasses.replace(m, null_band=1.0)),
    )
    rng = np.random.default_rng(8)
    n = 40_000
    u = rng.random((n, banded.dim))
    covered = [j for j, flag in enumerate(banded.values_only) if flag]
    u[: n // 2, covered] = 0.5 + (u[: n // 2, covered] - 0.5) * 0.02  # half the draws in the band
    jitter = rng.random(u.shape)
    a, b = banded.uniformize(u, jitter), plain.uniformize(u, jitter)
    pj = next(j for j, c in enumerate(banded.cells) if c.pattern)
    code = banded._cell_of(banded.cdfs[pj], a[:, pj])
    from privflow.data import missing_pattern

    null = missing_pattern.nulls(code, banded.cells[pj].pattern)
    for j, c in enumerate(banded.cells):
        if j not in covered:
            np.testing.assert_array_equal(a[:, j], b[:, j])
            continue
        present = ~null[c.source or c.column]
        k = int(present.sum())
        rank = np.empty(k)
        rank[np.argsort(b[present, j], kind="stable")] = np.arange(k)
        np.testing.assert_allclose(a[present, j], (rank + jitter[present, j]) / k)
        np.testing.assert_array_equal(a[~present, j], b[~present, j])
        values = banded.decode(a)
        got = marginal_of(values.filter(pl.col(c.column).is_not_null()), c)[: c.n_values]
        want = banded.probs[j][: c.n_values]
        assert tvd(got / got.sum(), want / want.sum()) < 0.03, c.column
