"""encode: the schema-only per-row transform, and the public-seed split for selection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from privflow.data.codec import Codec
from privflow.data.row_hash import row_units

if TYPE_CHECKING:
    from privflow.data.copula import CopulaCodec
    from privflow.data.target_head import TargetCodec


def selection_coins(
    df: pl.DataFrame, validation_fraction: float, seed: int, ranks: np.ndarray | None = None
) -> np.ndarray:
    """True for the rows of the selection split: each row's coin is a salted hash of the row
    and its occurrence rank (`privflow.data.row_hash`), so adding or removing one row changes one
    split by that row and nothing else, and the copies of a repeated row split like any other
    rows. `ranks` are the rows' ranks in the whole table where `df` is one chunk of it."""
    return row_units(df, seed, ranks) < validation_fraction


ENCODE_CHUNK_ROWS = 262_144  # rows encoded at a time: only the float32 result is table-sized


def encode_split(
    chunk: pl.DataFrame, coin: np.ndarray, codec: Codec | CopulaCodec | TargetCodec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of rows encoded (float32) and split by its selection coins into its training
    and selection rows."""
    x = codec.encode(chunk, rng).astype(np.float32, copy=False)
    return x[~coin], x[coin]


def encode_rows(
    df: pl.DataFrame, codec: Codec | CopulaCodec | TargetCodec, validation_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Encode every row (float32, what the flows train on) and split off the selection rows
    (`selection_coins`), chunk by chunk into the two outputs. Integer columns and atoms are
    dequantized with fresh uniform offsets (data-independent, OS entropy)."""
    coins = selection_coins(df, validation_fraction, seed)
    n_val = int(coins.sum())
    x_train = np.empty((df.height - n_val, codec.dim), dtype=np.float32)
    x_val = np.empty((n_val, codec.dim), dtype=np.float32)
    rng = np.random.default_rng()
    i_train = i_val = 0
    for start in range(0, df.height, ENCODE_CHUNK_ROWS):
        coin = coins[start : start + ENCODE_CHUNK_ROWS]
        train, val = encode_split(df.slice(start, ENCODE_CHUNK_ROWS), coin, codec, rng)
        x_train[i_train : i_train + len(train)] = train
        x_val[i_val : i_val + len(val)] = val
        i_train, i_val = i_train + len(train), i_val + len(val)
    return x_train, x_val
