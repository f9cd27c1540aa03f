"""A uniform number per row from the row itself and its occurrence rank, for coins that must
not depend on a row's position.

Each row's number is a salted hash of its values together with how many earlier rows equal it
(`occurrence_ranks`). Seen as multisets, adding or removing one row then changes one coin: the
added copy of a value takes the next rank of that value, and every other (value, rank) pair
keeps its coin. A coin per position would shift every later row; a coin of the values alone
would send every copy of a row to the same side, so a table of few distinct rows would split
by value (every copy in the selection split or none). The selection split (tasks/encode.py)
and DP-AD's partitions (privacy/mechanisms/dp_ad.py) rest on this for their sensitivity.

A table read in chunks (tasks/stream.py) ranks through `privflow.data.rank_spill.SpilledRanks`: it
compares rows by `row_keys`, two salted row hashes (128 bits), on disk, and gives the same
ranks as the whole table's exact ranks unless two distinct rows share all 128 bits.
"""

from __future__ import annotations

import numpy as np
import polars as pl

_KEY_SEEDS = (0x243F_6A88, 0x85A3_08D3)  # public: two row hashes, one 128-bit equality key
_RANK_SALT = np.uint64(0x6A09_E667_F3BC_C908)


def mix64(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014), a bijection of 64-bit words with full
    avalanche: polars' multi-column row hash is not uniform in its top bits (distinct rows
    crowd into some ranges of [0, 1)), so its words are mixed before use."""
    with np.errstate(over="ignore"):
        z = np.asarray(h, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def occurrence_ranks(df: pl.DataFrame) -> np.ndarray:
    """For each row, how many earlier rows are equal to it (0 for a value's first copy).

    Rows are compared exactly (polars groups by every column), and also by their row hash so
    that two rows polars groups together (0.0 and -0.0) but hashes apart rank apart too."""
    if df.height == 0:
        return np.zeros(0, dtype=np.uint64)
    key = "__privflow_row_hash__"
    keyed = df.with_columns(df.hash_rows(seed=_KEY_SEEDS[0]).alias(key))
    rank = pl.int_range(pl.len(), dtype=pl.UInt64).over([key, *df.columns])
    return keyed.select(rank).to_series().to_numpy().astype(np.uint64, copy=False)


def row_keys(df: pl.DataFrame) -> np.ndarray:
    """[rows, 2] uint64: two salted row hashes, one 128-bit equality key per row."""
    keys = np.empty((df.height, 2), dtype=np.uint64)
    for j, seed in enumerate(_KEY_SEEDS):
        keys[:, j] = df.hash_rows(seed=seed).to_numpy()
    return keys


def row_units(df: pl.DataFrame, salt: int, ranks: np.ndarray | None = None) -> np.ndarray:
    """A uniform number in [0, 1) per row: the top 53 bits of a mixed hash of the row's salted
    hash and its occurrence rank (`occurrence_ranks` unless given, e.g. by `SpilledRanks`)."""
    ranks = occurrence_ranks(df) if ranks is None else np.asarray(ranks, dtype=np.uint64)
    if len(ranks) != df.height:
        raise ValueError(f"{len(ranks)} ranks for {df.height} rows")
    with np.errstate(over="ignore"):
        word = mix64(mix64(df.hash_rows(seed=int(salt)).to_numpy()) + mix64(ranks ^ _RANK_SALT))
    return (word >> np.uint64(11)).astype(np.float64) / float(2**53)


__all__ = ["mix64", "occurrence_ranks", "row_keys", "row_units"]
