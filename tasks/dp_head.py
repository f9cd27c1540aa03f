"""dp_head: train the target head on the private rows (privacy/mechanisms/dp_head.py) and join
it with the flow's codec (privflow/target_head.py)."""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import task

from privflow.config import HeadConfig
from privflow.features import compact_features
from privflow.privacy.mechanisms import dp_head as mechanism
from privflow.privacy.plan import SGDShape, StagePlan
from privflow.schema import Schema
from privflow.target_head import TargetHead, class_count, head_widths, target_codes
from privflow.tasks._options import PRIVATE


def fit_head(
    df: pl.DataFrame,
    schema: Schema,
    cfg: HeadConfig,
    shape: SGDShape,
    noise_multiplier: float | None,
) -> TargetHead:
    """The head trained on every row of `df` (`noise_multiplier=None`: the non-private reference,
    no clipping or noise). The public features and the class index are per-row maps."""
    assert schema.target is not None and schema.dataset.expected_rows is not None
    settings = mechanism.head_settings(
        shape, schema.dataset.expected_rows, noise_multiplier, cfg.lr, cfg.max_grad_norm, cfg.ema_decay
    )
    classes = class_count(schema.column(schema.target))
    rest = (schema.target,)
    compact, widths = compact_features(schema, df, rest), head_widths(schema, cfg.numeric_knots)
    weight, bias, _ = mechanism.train_head(compact, target_codes(schema, df), widths, classes, settings)
    return TargetHead(schema.target, weight, bias, cfg.numeric_knots)


@task(name="dp_head", **PRIVATE)
def dp_target_head(df: pl.DataFrame, schema: Schema, cfg: HeadConfig, stage: StagePlan) -> TargetHead:
    """Spend the planned stage: the head's DP-SGD run of the stage's shape and noise."""
    event: Any = stage.event
    return fit_head(df, schema, cfg, SGDShape(event.sample_rate, event.steps), event.noise_multiplier)


__all__ = ["dp_target_head", "fit_head"]
