"""A number as its released marginal's CDF: the target head's scale where DP marginals exist.

Why. The head's numeric features are scaled by the column's PUBLIC bounds
(`privflow.data.features.scaled`), and public bounds are wide: penguins' bill lengths (32-60 mm)
fill 28% of [0, 100] mm, so most of the hat basis's equally spaced knots fall where no row is,
and the few rows' features differ by less than the clipped, noisy gradient can resolve. The
released marginal's CDF F maps the same values onto [0, 1] by rank: the knots become the
marginal's quantiles, the rows fill the whole range, and the head bends where the rows are.

Privacy. F is post-processing of the DP marginals (a release) and x -> F(x) a per-row map fixed
by it, so the head's DP-SGD keeps its sensitivity and event (privacy/mechanisms/dp_head.py); the
marginals are spent before the head (tasks/fit.py), and the released head scores a row through
the copula codec its TargetCodec holds.

F at a value: `CopulaCodec.value_ranks` (the codec's own cells and CDFs). A missing value keeps
its public-scale feature (0) beside its missing flag; a column released through calendar parts
(privflow/data/calendar.py), or without released mass, keeps the public scale.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from privflow.data.copula import CopulaCodec
from privflow.data.schema import Schema


def rank_features(
    compact: np.ndarray, schema: Schema, df: pl.DataFrame, codec: CopulaCodec, exclude: tuple[str, ...]
) -> np.ndarray:
    """`compact` (`privflow.data.features.compact_features(schema, df, exclude)`) with each
    numeric column's scaled value replaced, in place, by its rank under `codec`'s marginals
    (module docstring); returned for chaining."""
    j = 0
    for col in schema.columns:
        if col.name in exclude:
            continue
        if col.is_categorical:
            j += 1
            continue
        ranks = codec.value_ranks(df, col.name)
        if ranks is not None:
            compact[:, j] = np.where(np.isnan(ranks), compact[:, j], ranks)
        j += 2 if col.nullable else 1
    return compact


__all__ = ["rank_features"]
