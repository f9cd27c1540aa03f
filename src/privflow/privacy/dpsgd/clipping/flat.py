"""Flat clipping: the whole per-example gradient g is scaled by min(1, C / ||g||_2).

DP-HFlow, "Per-layer Clipping", first equation (Abadi et al. 2016).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privflow.privacy.dpsgd.clipping._base import factor, layer_sq_norms


def flat_factors(sq_norms: Tensor, max_grad_norm: float) -> Tensor:
    """Per-example scale [n] from per-example, per-layer squared norms [n, L]."""
    return factor(torch.sqrt(sq_norms.sum(1)), max_grad_norm)


def clip_flat(grads: Sequence[Sequence[Tensor]], max_grad_norm: float) -> list[list[Tensor]]:
    """Clip materialised per-example gradients (per layer, per parameter, each [n, *shape])."""
    sq = torch.stack([layer_sq_norms(layer) for layer in grads], 1)
    f = flat_factors(sq, max_grad_norm)
    return [[g * f.reshape((-1,) + (1,) * (g.dim() - 1)) for g in layer] for layer in grads]
