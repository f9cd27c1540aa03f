"""Per-layer clipping with a global threshold split between networks, then layers.

DP-HFlow, "Per-layer Clipping" (after McMahan et al. 2018): local thresholds C_l satisfy
C = sqrt(sum_l C_l^2), so the clipped per-example gradient has norm <= C and Gaussian noise
calibrated to C gives the same guarantee as flat clipping. The split: every network gets an
equal share of C^2, and within a network each layer's share of C^2 is proportional to its
parameter complexity (entries of its gradient that can be non-zero), i.e.
C_l^2 = C^2 / J * m_l / sum_{l' in network} m_l'.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privflow.privacy.dpsgd.clipping._base import factor, layer_sq_norms
from privflow.privacy.dpsgd.clipping.structure import LayerInfo


def layer_thresholds(layers: Sequence[LayerInfo], max_grad_norm: float) -> list[float]:
    """Local thresholds C_l, with sum_l C_l^2 = C^2."""
    networks: dict[str, int] = {}
    for layer in layers:
        networks[layer.network] = networks.get(layer.network, 0) + layer.complexity
    share = max_grad_norm**2 / len(networks)
    out = []
    for layer in layers:
        total = networks[layer.network]
        # A network whose parameters are all structurally zero still gets an equal split.
        frac = (
            layer.complexity / total
            if total > 0
            else 1.0 / sum(1 for other in layers if other.network == layer.network)
        )
        out.append(float((share * frac) ** 0.5))
    return out


def per_layer_factors(sq_norms: Tensor, thresholds: Sequence[float]) -> Tensor:
    """Per-example, per-layer scale [n, L] from squared norms [n, L]."""
    thr = torch.as_tensor(list(thresholds), dtype=sq_norms.dtype, device=sq_norms.device)
    return factor(torch.sqrt(sq_norms), thr)


def clip_per_layer(grads: Sequence[Sequence[Tensor]], thresholds: Sequence[float]) -> list[list[Tensor]]:
    """Clip each layer's materialised per-example gradient to its own threshold."""
    sq = torch.stack([layer_sq_norms(layer) for layer in grads], 1)
    f = per_layer_factors(sq, thresholds)
    return [[g * f[:, i].reshape((-1,) + (1,) * (g.dim() - 1)) for g in layer] for i, layer in enumerate(grads)]
