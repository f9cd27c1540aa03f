"""A uniform number per row from the row itself: for coins that must not depend on a row's position.

Adding or removing one row then changes that row's coin only (a coin per position would
shift every later row), which is what the selection split (tasks/encode.py) and DP-AD's
partitions (privacy/mechanisms/dp_ad.py) need for their sensitivity arguments.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def mix64(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014), a bijection of 64-bit words with full
    avalanche: polars' multi-column row hash is not uniform in its top bits (measured: one
    tenth of [0, 1) held 14.6% of 20,000 distinct rows), so its words are mixed before use."""
    with np.errstate(over="ignore"):
        z = np.asarray(h, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def unit_hash(df: pl.DataFrame, salt: int) -> np.ndarray:
    """A uniform number in [0, 1) per row from the top 53 bits of its salted, mixed 64-bit hash."""
    h = mix64(df.hash_rows(seed=int(salt)).to_numpy())
    return (h >> np.uint64(11)).astype(np.float64) / float(2**53)


__all__ = ["mix64", "unit_hash"]
