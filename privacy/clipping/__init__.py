"""Clipping strategies of DP-HFlow (flat, per-layer, per-unit, stochastic sparsification).

Each strategy keeps every example's total clipped gradient norm <= C, so one Gaussian
noise scale sigma * C serves all of them (ARCHITECTURE.md, privacy rule 4).
"""

from __future__ import annotations

from privflow.privacy.clipping.engine import CLIPPINGS, ClippedSum, GradientMismatch, clipped_gradient_sum
from privflow.privacy.clipping.flat import clip_flat, flat_factors
from privflow.privacy.clipping.per_layer import clip_per_layer, layer_thresholds, per_layer_factors
from privflow.privacy.clipping.per_unit import clip_per_unit, row_stats, unit_factors, unit_thresholds
from privflow.privacy.clipping.registry import CLIPPING_STRATEGIES, StepContext, get_clipping, register_clipping
from privflow.privacy.clipping.sparsify import (
    clip_sparsify,
    sparsify_k,
    stochastic_sparsify,
    threshold,
    threshold_positions,
)
from privflow.privacy.clipping.structure import LayerInfo, model_layers

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
