"""dp_marginals: the DP per-column marginals and the copula codec built from them."""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

from privflow.data.copula import CopulaCodec
from privflow.data.schema import Schema
from privflow.privacy.accounting.plan import StagePlan
from privflow.privacy.mechanisms import dp_marginals as mechanism
from privflow.tasks.lazy_task import task


def planned_grid_bins(schema: Schema, stage: StagePlan, grid_bins: int | Literal["auto"]) -> int:
    """The configured grid, or with "auto" the rule of `mechanism.auto_grid_bins` from the
    schema's public expected_rows and the planned noise (public: no row is read)."""
    if grid_bins != "auto":
        return int(grid_bins)
    sigma = stage.event.noise_multiplier * mechanism.marginals_sensitivity(len(schema.columns))  # type: ignore[attr-defined]
    return mechanism.auto_grid_bins(schema.dataset.expected_rows, sigma)


@task(name="dp_marginals", private=True)
def dp_marginal_codec(
    df: pl.DataFrame, schema: Schema, stage: StagePlan, grid_bins: int | Literal["auto"]
) -> CopulaCodec:
    """Release every column's histogram once (the planned Gaussian event) and return the codec
    that encodes rows through those DP CDFs; everything after it is post-processing."""
    grid = planned_grid_bins(schema, stage, grid_bins)
    return codec_from_counts(mechanism.marginal_counts(df, schema, grid_bins=grid), schema, stage, grid)


def codec_from_counts(counts: np.ndarray, schema: Schema, stage: StagePlan, grid: int) -> CopulaCodec:
    """The release itself, from the noiseless `mechanism.marginal_counts` on a `grid` (a streamed
    run sums them over chunks of rows): the planned Gaussian noise, then post-processing."""
    noisy = mechanism.release_counts(counts, schema, stage.event.noise_multiplier)  # type: ignore[attr-defined]
    return CopulaCodec.from_marginals(schema, mechanism.marginals_from_counts(noisy, schema, grid_bins=grid))


__all__ = ["codec_from_counts", "dp_marginal_codec", "planned_grid_bins"]
