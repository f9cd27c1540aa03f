"""The selection split is a per-row coin: a neighbouring table changes one split by one row."""

from __future__ import annotations

import polars as pl

from privflow.tasks.encode import selection_coins


def _rows(frame: pl.DataFrame, mask) -> set[tuple]:
    return set(frame.filter(pl.Series(mask)).iter_rows())


def test_adding_a_row_moves_no_other_row_between_splits(demo_dir) -> None:
    df = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=3000)
    base = selection_coins(df, 0.1, seed=0)
    extra = df.head(1).with_columns(pl.lit("99").alias("age"))
    neighbour = pl.concat([df.head(1500), extra, df.tail(1500)])  # inserted in the middle
    coins = selection_coins(neighbour, 0.1, seed=0)
    before_val, after_val = _rows(df, base), _rows(neighbour, coins)
    before_train, after_train = _rows(df, ~base), _rows(neighbour, ~coins)
    assert len(after_val ^ before_val) + len(after_train ^ before_train) == 1
    assert 0.07 < base.mean() < 0.13  # the public fraction
