"""dp_marginals: the DP per-column marginals and the copula codec built from them."""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

from privflow.data.copula import DEFAULT_GRID_BINS, CopulaCodec, schema_cells
from privflow.data.schema import Schema
from privflow.privacy.accounting.plan import StagePlan
from privflow.privacy.mechanisms import dp_marginals as mechanism

# "auto" below this many expected rows: 512 cells, a tree of 3 levels instead of the default's 4.
# The rows of so small a table resolve blocks, not cells, and the fourth level's share of the
# noise is not bought back (benchmarks/results/marginal_tree.md: 275 rows, 20-bin TVD 0.22 on
# 512 cells against 0.26 on 640; 1,176 rows about equal; 5,940 rows and more better on 640).
SMALL_TABLE_ROWS = 1_000
SMALL_TABLE_GRID = 512


def planned_grid_bins(grid_bins: int | Literal["auto"], expected_rows: int | None = None) -> int:
    """The configured grid, or with "auto" the default (privflow/data/copula.py DEFAULT_GRID_BINS;
    the release's trees find the resolution the rows support), `SMALL_TABLE_GRID` below
    `SMALL_TABLE_ROWS` public expected rows. Public: no row is read."""
    if grid_bins != "auto":
        return int(grid_bins)
    if expected_rows is not None and expected_rows < SMALL_TABLE_ROWS:
        return SMALL_TABLE_GRID
    return DEFAULT_GRID_BINS


def dp_marginal_codec(
    df: pl.DataFrame, schema: Schema, stage: StagePlan, grid_bins: int | Literal["auto"]
) -> CopulaCodec:
    """Release every column's histogram once (the planned Gaussian event) and return the codec
    that encodes rows through those DP CDFs; everything after it is post-processing."""
    grid = planned_grid_bins(grid_bins, schema.dataset.expected_rows)
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
