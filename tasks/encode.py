"""encode: the schema-only per-row transform, and the public-seed split for selection."""

from __future__ import annotations

import numpy as np
import polars as pl
from prefect import task

from privflow.codec import Codec
from tasks._options import PRIVATE


@task(name="encode", **PRIVATE)
def encode_rows(df: pl.DataFrame, codec: Codec, validation_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Encode every row, then assign each row to the selection split independently with a
    public probability (a per-row coin, so the split itself uses no statistic of the data).
    Integer columns are dequantized with fresh uniform offsets (data-independent)."""
    x = codec.encode(df, np.random.default_rng())
    coin = np.random.default_rng([seed, 0x5E1EC7]).random(len(x)) < validation_fraction
    return x[~coin], x[coin]
