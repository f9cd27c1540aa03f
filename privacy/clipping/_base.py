"""Clip factors shared by the strategies."""

from __future__ import annotations

import torch
from torch import Tensor


def factor(norm: Tensor, threshold: Tensor | float) -> Tensor:
    """min(1, threshold / norm), with 1 where norm is 0: the clip_C of Abadi et al. (2016)."""
    thr = torch.as_tensor(threshold, dtype=norm.dtype, device=norm.device)
    return torch.where(norm > thr, thr / torch.where(norm > 0, norm, torch.ones_like(norm)), torch.ones_like(norm))


def flat_view(g: Tensor) -> Tensor:
    """[n, *shape] -> [n, numel]."""
    return g.reshape(g.shape[0], -1)


def row_view(g: Tensor) -> Tensor:
    """[n, *shape] -> [n, rows, rest]: the units of a parameter are the rows of its first axis."""
    if g.dim() == 1:
        return g.reshape(g.shape[0], 1, 1)
    if g.dim() == 2:
        return g.reshape(g.shape[0], g.shape[1], 1)
    return g.reshape(g.shape[0], g.shape[1], -1)
