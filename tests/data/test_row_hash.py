"""Row coins from a row's values and occurrence rank: one row added or removed changes one coin
(as multisets), and a repeated row's copies get coins of their own."""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privflow.data.row_hash import occurrence_ranks, row_units


def _few_distinct(n: int, seed: int) -> pl.DataFrame:
    """A table of n rows over at most 24 distinct ones, nulls included."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame(
        {"a": rng.integers(0, 4, n), "b": rng.choice(["x", "y", None], n), "c": rng.integers(0, 2, n) * 0.5}
    )


def _sides(df: pl.DataFrame, coin: np.ndarray) -> tuple[Counter, Counter]:
    return Counter(df.filter(pl.Series(coin)).iter_rows()), Counter(df.filter(pl.Series(~coin)).iter_rows())


def test_ranks_count_the_earlier_equal_rows() -> None:
    df = pl.DataFrame({"a": [1, 1, 2, 1, None, None, 2], "b": ["x", "x", "y", "x", None, None, "z"]})
    assert occurrence_ranks(df).tolist() == [0, 1, 0, 2, 0, 1, 0]
    assert occurrence_ranks(df.head(0)).tolist() == []


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), where=st.floats(0, 1), drop=st.booleans())
def test_one_row_added_or_removed_moves_one_row_in_one_split(seed: int, where: float, drop: bool) -> None:
    """The neighbouring-table property the selection split and DP-AD's parts rest on, on a table
    whose rows repeat (where a row's later copies change rank when an earlier copy goes)."""
    df = _few_distinct(600, seed)
    i = int(where * (df.height - 1))
    if drop:
        neighbour = df.filter(pl.int_range(pl.len()) != i)
    else:
        neighbour = pl.concat([df.head(i), df.slice(seed % df.height, 1), df.slice(i)])
    before = _sides(df, row_units(df, salt=7) < 0.3)
    after = _sides(neighbour, row_units(neighbour, salt=7) < 0.3)
    moved = sum(((before[k] - after[k]) + (after[k] - before[k])).total() for k in range(2))
    assert moved == 1


def test_copies_of_a_repeated_row_split_like_distinct_rows() -> None:
    """A coin of the values alone sent all copies of a row to one side: 3 distinct rows got a
    selection split of 0% or 100% of each."""
    df = pl.DataFrame({"v": ["a", "b", "c"] * 2000})
    coin = row_units(df, salt=11) < 0.1
    for value in ("a", "b", "c"):
        share = coin[(df["v"] == value).to_numpy()].mean()
        assert 0.07 < share < 0.13  # 2,000 coins at 0.1: sd 0.0067


def test_coins_are_uniform_and_depend_on_the_salt() -> None:
    df = _few_distinct(20_000, seed=3)
    u = row_units(df, salt=1)
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 1800  # 2,000 +- ~4.5 sd per tenth
    assert np.corrcoef(u, row_units(df, salt=2))[0, 1] < 0.05


def test_ranks_of_another_length_are_refused() -> None:
    with pytest.raises(ValueError, match="3 ranks for 2 rows"):
        row_units(pl.DataFrame({"a": [1, 2]}), salt=0, ranks=np.zeros(3, dtype=np.uint64))
