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

from privflow.privacy.dpsgd.clipping._base import row_view
from privflow.privacy.dpsgd.grad_samplers._common import row_stats


def unit_thresholds(l1: Tensor, layer_threshold: float) -> Tensor:
    """C_l[i] = C_l sqrt(||G_i||_1 / sum_j ||G_j||_1), per example: [n, U] from L1 norms [n, U].
    An example whose layer gradient is 0 (every ||G_i||_1 = 0) gets thresholds 0 (nothing to clip)."""
    total = l1.sum(1, keepdim=True).clamp_(min=torch.finfo(l1.dtype).tiny)
    return torch.div(l1, total).sqrt_().mul_(layer_threshold)


def unit_factors(l1: Tensor, sq: Tensor, layer_threshold: float) -> Tensor:
    """Per-example, per-unit scale [n, U]: min(1, C_l[i] / ||G_i||) (1 where ||G_i|| = 0).
    The step's unit count is small, but the step runs this per layer: one pass per operation,
    no masks built (a unit over its threshold has a positive norm, so the quotient is finite)."""
    thr = unit_thresholds(l1, layer_threshold)
    norm = sq.sqrt()
    return torch.where(norm > thr, thr.div_(norm), 1.0)


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
