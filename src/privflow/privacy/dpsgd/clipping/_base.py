"""Clip factors shared by the strategies."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privflow.privacy.dpsgd.grad_samplers._common import row_view

__all__ = ["factor", "flat_view", "layer_sq_norms", "row_view"]


def factor(norm: Tensor, threshold: Tensor | float) -> Tensor:
    """min(1, threshold / norm), with 1 where norm is 0: the clip_C of Abadi et al. (2016)."""
    thr = torch.as_tensor(threshold, dtype=norm.dtype, device=norm.device)
    return torch.where(norm > thr, thr / torch.where(norm > 0, norm, torch.ones_like(norm)), torch.ones_like(norm))


def flat_view(g: Tensor) -> Tensor:
    """[n, *shape] -> [n, numel]."""
    return g.reshape(g.shape[0], -1)


def layer_sq_norms(layer: Sequence[Tensor]) -> Tensor:
    """Per-example squared norm [n] of one layer's materialised gradients (each [n, *shape])."""
    total = flat_view(layer[0]).pow(2).sum(1)
    for g in layer[1:]:
        total = total + flat_view(g).pow(2).sum(1)
    return total
