"""encode: the schema-only per-row transform, and the public-seed split for selection."""

from __future__ import annotations

import numpy as np
import polars as pl
from prefect import task

from privflow.codec import Codec
from privflow.row_hash import unit_hash
from privflow.tasks._options import PRIVATE


def selection_coins(df: pl.DataFrame, validation_fraction: float, seed: int) -> np.ndarray:
    """True for the rows of the selection split: each row's coin is a salted hash of the row
    itself, so adding or removing one row changes one split by that row and nothing else
    (a coin per position would shift every later row). Uses no statistic of the data."""
    return unit_hash(df, seed) < validation_fraction


@task(name="encode", **PRIVATE)
def encode_rows(df: pl.DataFrame, codec: Codec, validation_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Encode every row and split off the selection rows (`selection_coins`). Integer columns
    are dequantized with fresh uniform offsets (data-independent)."""
    x = codec.encode(df, np.random.default_rng())
    coin = selection_coins(df, validation_fraction, seed)
    return x[~coin], x[coin]
