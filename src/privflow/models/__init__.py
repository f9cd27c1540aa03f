"""Torch-only flow models of privflow (no Prefect, no MLflow).

``build_flow(name, cardinalities, **model_config)`` builds a ``TabularFlow`` from the fields of
``privflow.core.config.ModelConfig``; ``model.config`` holds the arguments so that
``build_flow(**model.config)`` rebuilds an identical module for ``load_state_dict``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from privflow.models.base import TabularFlow
from privflow.models.dphflow import DPHFlow
from privflow.models.maf import MAF

if TYPE_CHECKING:
    from privflow.core.config import ModelConfig

__all__ = ["DPHFlow", "MAF", "TabularFlow", "build_flow", "initial_flow", "FLOW_OPTIONS"]

# Options each family takes (ModelConfig field names plus a few model-only knobs).
FLOW_OPTIONS: dict[str, frozenset[str]] = {
    "maf": frozenset(
        {
            "blocks",
            "hidden",
            "hidden_layers",
            "dequantization",
            "prior",
            "mog_components",
            "logit_alpha",
            "deq_components",
        }
    ),
    "dphflow": frozenset(
        {
            "blocks",
            "hidden",
            "hidden_layers",
            "spline_bins",
            "spline_bound",
            "linear",
            "rank",
            "embed_dim",
            "dequantization",
            "prior",
            "mog_components",
            "logit_alpha",
            "deq_components",
            "seed",
        }
    ),
}
# ModelConfig fields that concern another family or DP-EM only: accepted and ignored.
_IGNORED = frozenset({"spline_bins", "spline_bound", "linear", "rank", "mog_iterations", "seed"})


def build_flow(name: str, cardinalities: list[int | None], **kwargs: Any) -> TabularFlow:
    """Build the flow ``name`` ("maf" or "dphflow") for features with these cardinalities
    (None = continuous in [0, 1], K = categorical codes 0..K-1)."""
    if name not in FLOW_OPTIONS:
        raise ValueError(f"unknown flow '{name}'; choose one of {sorted(FLOW_OPTIONS)}")
    allowed = FLOW_OPTIONS[name]
    unknown = set(kwargs) - allowed - _IGNORED
    if unknown:
        raise TypeError(f"build_flow('{name}') got unknown options {sorted(unknown)}")
    used = {k: v for k, v in kwargs.items() if k in allowed}
    cards = [None if c is None else int(c) for c in cardinalities]
    config = {"name": name, "cardinalities": cards, **used}
    cls = MAF if name == "maf" else DPHFlow
    return cls(cards, config=config, **used)


def initial_flow(model: ModelConfig, cardinalities: list[int | None], seed: int) -> TabularFlow:
    """The configured flow before training, its weights drawn from the public `seed` (torch's
    global RNG is left as it was): what a run trains from, and what the audit's pre-flight counts
    canary slots on."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_flow(model.name, cardinalities, **model.model_dump(exclude={"name"}))
