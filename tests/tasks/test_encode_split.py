"""The selection split is a per-row coin: a neighbouring table changes one split by one row."""

from __future__ import annotations

import polars as pl
import pytest

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


def test_rows_are_encoded_in_chunks_into_the_two_splits(demo_dir, monkeypatch) -> None:
    """Chunked encoding (bounded memory) gives each split the rows the coins give it, in order:
    with the schema codec (deterministic for every column but the integer offsets) the continuous
    and categorical columns match a one-pass encoding exactly."""
    import numpy as np

    from privflow.data.codec import Codec
    from privflow.data.schema import Schema
    from privflow.data.validation import validate
    from privflow.tasks import encode

    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    df, _ = validate(pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=1000), schema, "strict")
    codec = Codec.from_schema(schema)
    monkeypatch.setattr(encode, "ENCODE_CHUNK_ROWS", 97)
    x_train, x_val = encode.encode_rows(df, codec, 0.2, seed=4)
    coin = encode.selection_coins(df, 0.2, seed=4)
    whole = codec.encode(df, np.random.default_rng(0))
    exact = [j for j, f in enumerate(codec.features) if f.kind == "categorical"]
    assert x_train.dtype == np.float32 and len(x_train) + len(x_val) == 1000 and len(x_val) == coin.sum()
    np.testing.assert_array_equal(x_train[:, exact], whole[~coin][:, exact])
    np.testing.assert_array_equal(x_val[:, exact], whole[coin][:, exact])


def test_a_table_of_few_distinct_rows_still_gets_its_selection_share(demo_dir) -> None:
    """1,000 rows over 24 distinct ones (the fuzzing run's allcat table) used to give no selection
    row at all: every copy of a row took its values' coin."""
    df = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=24)
    repeated = pl.concat([df] * 42).head(1000)
    coins = selection_coins(repeated, 0.1, seed=0)
    assert 60 <= coins.sum() <= 140  # 1,000 coins at 0.1: sd 9.5
    # each distinct row's ~42 copies split on their own: nearly every one has a copy selected
    assert repeated.filter(pl.Series(coins)).unique().height >= 18  # values' coins alone: ~2.4 of 24


@pytest.mark.parametrize("max_validation_rows", [100_000, 300])
def test_a_streamed_encoding_splits_as_the_whole_table_does(
    demo_dir, tmp_path, monkeypatch, max_validation_rows: int
) -> None:
    """The streamed path counts occurrence ranks across its chunks: on a table of repeated rows
    read 1,000 rows at a time (3 chunks, keys spread over 16 partition files) it puts the same
    rows in the selection file as encoding it whole. With the split capped at 300 of the
    schema's 32,561 expected rows, both expect 3,000 * 300 / 32,561 = 28 selection rows, not 600."""
    import numpy as np

    from privflow.core.config import RunConfig
    from privflow.data import rank_spill
    from privflow.data.chunked import parquet_chunks
    from privflow.data.codec import Codec
    from privflow.data.schema import Schema
    from privflow.data.validation import validate
    from privflow.tasks import encode, stream

    schema_path = demo_dir / "adult.yaml"
    schema = Schema.from_yaml(schema_path)
    head = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=150)
    df, _ = validate(pl.concat([head] * 20), schema, "strict")
    data = tmp_path / "repeated.parquet"
    df.write_parquet(data)
    config = RunConfig.build(
        data=data,
        schema_path=schema_path,
        store=tmp_path / "store",
        select={"validation_fraction": 0.2, "max_validation_rows": max_validation_rows},
        train={"seed": 4},
        stream={"enabled": True, "chunk_rows": 1000, "diagnostic_rows": 1000},
    )
    codec = Codec.from_schema(schema)
    monkeypatch.setattr(rank_spill, "PARTITION_ROWS", 200)
    ranks = rank_spill.SpilledRanks(tmp_path / "ranks", df.height)
    for chunk in parquet_chunks(data, 1000):  # the first pass's record of the clean rows
        ranks.record(validate(chunk, schema, "strict")[0])
    assert ranks.partitions == 16
    x_train, x_val, _ = stream.encode_chunks(config, schema, codec, tmp_path, ranks)
    share = config.select.fraction(schema.dataset.expected_rows)
    assert share == (0.2 if max_validation_rows == 100_000 else 300 / schema.dataset.expected_rows)
    whole_train, whole_val = encode.encode_rows(df, codec, share, seed=4)
    assert abs(len(whole_val) - df.height * share) < 5 * (df.height * share) ** 0.5  # 5 sd of the coins
    exact = [j for j, f in enumerate(codec.features) if f.kind == "categorical"]
    streamed_val = x_val[:]  # the selection file, in table order
    assert x_train.rows == len(whole_train) and x_val.rows == len(whole_val) > 0
    np.testing.assert_array_equal(streamed_val[:, exact], whole_val[:, exact])
