"""dp_head: train the target head on the private rows (privacy/mechanisms/dp_head.py) and join
it with the flow's codec (privflow/data/target_head.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from privflow.core.config import HeadConfig
from privflow.data.chunked import DiskRows
from privflow.data.copula import CopulaCodec
from privflow.data.features import compact_features
from privflow.data.marginal_ranks import rank_features
from privflow.data.schema import Schema
from privflow.data.target_head import TargetHead, class_count, head_widths, target_codes
from privflow.privacy.accounting.plan import SGDShape, StagePlan
from privflow.privacy.mechanisms import dp_head as mechanism


def head_rows(schema: Schema, df: pl.DataFrame, knots: int, ranks: CopulaCodec | None = None) -> np.ndarray:
    """[n, blocks + 1] float32: the head's compact features of `df` and each row's class index
    last (`mechanism.train_head`'s input), filled in place: one table-sized array. With `ranks`,
    a codec of released DP marginals, numbers enter as their CDF (privflow/data/marginal_ranks.py)."""
    assert schema.target is not None
    rows = np.empty((df.height, len(head_widths(schema, knots)) + 1), dtype=np.float32)
    compact_features(schema, df, (schema.target,), out=rows)
    if ranks is not None:
        rank_features(rows[:, :-1], schema, df, ranks, (schema.target,))
    rows[:, -1] = target_codes(schema, df)
    return rows


def fit_head(
    rows: np.ndarray | DiskRows,
    schema: Schema,
    cfg: HeadConfig,
    shape: SGDShape,
    noise_multiplier: float | None,
    ranked: bool = False,
) -> TargetHead:
    """The head trained on `head_rows` of every row (in memory, or on disk for a streamed run);
    `noise_multiplier=None` is the non-private reference, no clipping or noise; `ranked`: the
    rows' numbers are their marginals' CDF. The features and the class index are per-row maps."""
    assert schema.target is not None and schema.dataset.expected_rows is not None
    settings = mechanism.head_settings(
        shape, schema.dataset.expected_rows, noise_multiplier, cfg.lr, cfg.max_grad_norm, cfg.ema_decay
    )
    classes = class_count(schema.column(schema.target))
    weight, bias, _ = mechanism.train_head(rows, head_widths(schema, cfg.numeric_knots), classes, settings)
    return TargetHead(schema.target, weight, bias, cfg.numeric_knots, ranked)


def dp_target_head(
    df: pl.DataFrame, schema: Schema, cfg: HeadConfig, stage: StagePlan, ranks: CopulaCodec | None = None
) -> TargetHead:
    """Spend the planned stage: the head's DP-SGD run of the stage's shape and noise (numbers as
    their ranks under the released marginals of `ranks` when given)."""
    rows = head_rows(schema, df, cfg.numeric_knots, ranks)
    return fit_head_planned(rows, schema, cfg, stage, ranked=ranks is not None)


def fit_head_planned(
    rows: np.ndarray | DiskRows, schema: Schema, cfg: HeadConfig, stage: StagePlan, ranked: bool = False
) -> TargetHead:
    """The planned stage's DP-SGD run on `head_rows` (a streamed run passes them on disk)."""
    event: Any = stage.event
    shape = SGDShape(event.sample_rate, event.steps)
    return fit_head(rows, schema, cfg, shape, event.noise_multiplier, ranked)


__all__ = ["dp_target_head", "fit_head", "fit_head_planned", "head_rows"]
