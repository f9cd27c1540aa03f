"""Clipping strategies of DP-HFlow (flat, per-layer, per-unit, stochastic sparsification).

Each strategy keeps every example's total clipped gradient norm <= C, so one Gaussian
noise scale sigma * C serves all of them (docs/architecture.md, privacy rule 4).
"""

from __future__ import annotations

from privflow.privacy.dpsgd.clipping.engine import CLIPPINGS, ClippedSum, GradientMismatch, clipped_gradient_sum
from privflow.privacy.dpsgd.clipping.flat import clip_flat, flat_factors
from privflow.privacy.dpsgd.clipping.per_layer import clip_per_layer, layer_thresholds, per_layer_factors
from privflow.privacy.dpsgd.clipping.per_unit import clip_per_unit, row_stats, unit_factors, unit_thresholds
from privflow.privacy.dpsgd.clipping.registry import CLIPPING_STRATEGIES, StepContext, get_clipping, register_clipping
from privflow.privacy.dpsgd.clipping.sparsify import (
    clip_sparsify,
    sparsify_k,
    stochastic_sparsify,
    threshold,
    threshold_positions,
)
from privflow.privacy.dpsgd.clipping.structure import LayerInfo, model_layers

__all__ = [
    "CLIPPINGS",
    "CLIPPING_STRATEGIES",
    "ClippedSum",
    "StepContext",
    "get_clipping",
    "register_clipping",
    "GradientMismatch",
    "LayerInfo",
    "clip_flat",
    "clip_per_layer",
    "clip_per_unit",
    "clip_sparsify",
    "clipped_gradient_sum",
    "flat_factors",
    "layer_thresholds",
    "model_layers",
    "per_layer_factors",
    "row_stats",
    "sparsify_k",
    "stochastic_sparsify",
    "threshold",
    "threshold_positions",
    "unit_factors",
    "unit_thresholds",
]
