"""dp_marginals: the DP per-column marginals and the copula codec built from them."""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

from privflow.data.copula import DEFAULT_GRID_BINS, CopulaCodec, schema_cells
from privflow.data.schema import Schema
from privflow.privacy.accounting.plan import StagePlan
from privflow.privacy.mechanisms import dp_marginals as mechanism


def planned_grid_bins(grid_bins: int | Literal["auto"]) -> int:
    """The configured grid, or with "auto" the default: the release's trees find the resolution
    the rows support, so the grid is their finest (public: no row is read)."""
    return DEFAULT_GRID_BINS if grid_bins == "auto" else int(grid_bins)


def dp_marginal_codec(
    df: pl.DataFrame, schema: Schema, stage: StagePlan, grid_bins: int | Literal["auto"]
) -> CopulaCodec:
    """Release every column's histogram once (the planned Gaussian event) and return the codec
    that encodes rows through those DP CDFs; everything after it is post-processing."""
    grid = planned_grid_bins(grid_bins)
    return codec_from_counts(mechanism.marginal_counts(df, schema, grid_bins=grid), schema, stage, grid)


def codec_from_counts(counts: np.ndarray, schema: Schema, stage: StagePlan, grid: int) -> CopulaCodec:
    """The release itself, from the noiseless `mechanism.marginal_counts` on a `grid` (a streamed
    run sums them over chunks of rows): the planned Gaussian noise, then post-processing."""
    noise_multiplier = stage.noise_multiplier
    noisy = mechanism.release_counts(counts, schema_cells(schema, grid_bins=grid), noise_multiplier)
    return CopulaCodec.from_marginals(
        schema, mechanism.marginals_from_counts(noisy, schema, noise_multiplier, grid_bins=grid)
    )


__all__ = ["codec_from_counts", "dp_marginal_codec", "planned_grid_bins"]
