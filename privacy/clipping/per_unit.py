"""Per-unit clipping: a layer's threshold C_l is split between its units by gradient mass.

DP-HFlow, "Fine-grained Gradient Clipping", per-unit clipping: for each example,
C_l[i] = C_l * sqrt(||G[i,:]||_1 / sum_j ||G[j,:]||_1) and row i is clipped to C_l[i].
Since sum_i C_l[i]^2 = C_l^2 the layer's clipped gradient has norm <= C_l, and with the
per-layer split (``per_layer.layer_thresholds``) the whole example's has norm <= C.
Units: the rows of each parameter's first axis (a weight matrix [out, in] has one unit per
output unit, as in the paper; a vector parameter such as a bias has one unit per entry).
All units of all parameters of the layer share C_l.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from privflow.privacy.clipping._base import factor, row_view
from privflow.privacy.grad_samplers._common import row_stats


def unit_thresholds(l1: Tensor, layer_threshold: float) -> Tensor:
    """C_l[i] = C_l sqrt(||G_i||_1 / sum_j ||G_j||_1), per example: [n, U] from L1 norms [n, U]."""
    total = l1.sum(1, keepdim=True)
    share = torch.where(total > 0, l1 / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(l1))
    return layer_threshold * torch.sqrt(share)


def unit_factors(l1: Tensor, sq: Tensor, layer_threshold: float) -> Tensor:
    """Per-example, per-unit scale [n, U]."""
    return factor(torch.sqrt(sq), unit_thresholds(l1, layer_threshold))


def clip_per_unit(grads: Sequence[Sequence[Tensor]], thresholds: Sequence[float]) -> list[list[Tensor]]:
    """Clip each layer's materialised per-example gradient unit by unit."""
    out = []
    for layer, thr in zip(grads, thresholds, strict=False):
        stats = [row_stats(g) for g in layer]
        f = unit_factors(torch.cat([s[0] for s in stats], 1), torch.cat([s[1] for s in stats], 1), thr)
        clipped, start = [], 0
        for g in layer:
            rows = row_view(g).shape[1]
            clipped.append((row_view(g) * f[:, start : start + rows, None]).reshape(g.shape))
            start += rows
        out.append(clipped)
    return out
