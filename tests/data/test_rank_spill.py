"""Occurrence ranks counted on disk (privflow/data/rank_spill.py): the same as the whole table's
whatever the chunking and the number of partitions, with a bounded block per partition, and a
changed file between the passes refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privflow.core.errors import DataError
from privflow.data import rank_spill
from privflow.data.rank_spill import SpilledRanks, partitions_for
from privflow.data.row_hash import occurrence_ranks


def _few_distinct(n: int, seed: int, values: int = 4) -> pl.DataFrame:
    """A table of n rows over few distinct ones, nulls included."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame(
        {"a": rng.integers(0, values, n), "b": rng.choice(["x", "y", None], n), "c": rng.integers(0, 2, n) * 0.5}
    )


def _two_passes(df: pl.DataFrame, chunk: int, folder: Path, rows: int) -> tuple[SpilledRanks, np.ndarray]:
    spill = SpilledRanks(folder, rows)
    chunks = [df.slice(start, chunk) for start in range(0, df.height, chunk)]
    for c in chunks:
        spill.record(c)
    got = [spill.ranks(c) for c in chunks]
    spill.close()
    return spill, np.concatenate(got) if got else np.zeros(0, dtype=np.uint64)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    chunk=st.integers(1, 700),
    n=st.integers(0, 2000),
    values=st.sampled_from([1, 4, 1000]),
    partition_rows=st.sampled_from([1, 7, 1 << 19]),
)
def test_ranks_counted_on_disk_are_the_whole_tables(
    tmp_path_factory: pytest.TempPathFactory, seed: int, chunk: int, n: int, values: int, partition_rows: int
) -> None:
    df = _few_distinct(n, seed, values)
    chunk = max(chunk, -(-n // 40))  # at most 40 chunks: every record call appends to each partition's file
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rank_spill, "PARTITION_ROWS", partition_rows)
        mp.setattr(rank_spill, "BLOCK_ROWS", 5)  # many blocks per partition
        spill, got = _two_passes(df, chunk, tmp_path_factory.mktemp("spill"), n)
        assert spill.partitions == partitions_for(n)
    assert np.array_equal(got, occurrence_ranks(df))


def test_partitions_grow_with_the_rows_up_to_the_cap() -> None:
    assert partitions_for(0) == partitions_for(1) == partitions_for(rank_spill.PARTITION_ROWS) == 1
    assert partitions_for(rank_spill.PARTITION_ROWS + 1) == 2
    assert partitions_for(3 * rank_spill.PARTITION_ROWS) == 4
    assert partitions_for(10**12) == rank_spill.MAX_PARTITIONS


def test_only_later_copies_are_kept_and_the_key_files_are_gone(tmp_path: Path) -> None:
    df = pl.DataFrame({"a": list(range(3000)) + [5, 5, 7]})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rank_spill, "PARTITION_ROWS", 500)
        spill, got = _two_passes(df, 1000, tmp_path, df.height)
    assert spill.partitions == 8
    assert got[-3:].tolist() == [1, 2, 1] and not got[:-3].any()
    assert not list(tmp_path.glob("keys-*"))
    kept = sum(p.stat().st_size for p in tmp_path.glob("ranks-*"))
    assert kept == 3 * 16  # three (position, rank) pairs on disk, nothing for first copies
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir())  # private working data


def test_a_file_changed_between_the_passes_is_refused(tmp_path: Path) -> None:
    df = _few_distinct(300, 0)
    spill = SpilledRanks(tmp_path, df.height)
    spill.record(df.head(150))
    spill.record(df.tail(150))
    spill.ranks(df.head(150))
    changed = df.tail(150).with_columns(pl.col("a") + 1)
    with pytest.raises(DataError, match="changed"):
        spill.ranks(changed)
    spill = SpilledRanks(tmp_path / "again", df.height)
    spill.record(df)
    spill.ranks(df)
    with pytest.raises(DataError, match="changed"):
        spill.ranks(df.head(1))  # more chunks than the first pass saw
    with pytest.raises(RuntimeError):
        spill.record(df)
