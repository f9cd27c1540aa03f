"""dp_marginals: the DP per-column marginals and the copula codec built from them (issue 13)."""

from __future__ import annotations

import polars as pl
from prefect import task

from privflow.copula import CopulaCodec
from privflow.privacy.mechanisms import dp_marginals as mechanism
from privflow.privacy.plan import StagePlan
from privflow.schema import Schema
from privflow.tasks._options import PRIVATE


@task(name="dp_marginals", **PRIVATE)
def dp_marginal_codec(df: pl.DataFrame, schema: Schema, stage: StagePlan, grid_bins: int) -> CopulaCodec:
    """Release every column's histogram once (the planned Gaussian event) and return the codec
    that encodes rows through those DP CDFs; everything after it is post-processing."""
    marginals = mechanism.dp_marginals(df, schema, stage.event.noise_multiplier, grid_bins=grid_bins)  # type: ignore[attr-defined]
    return CopulaCodec.from_marginals(schema, marginals)


__all__ = ["dp_marginal_codec"]
