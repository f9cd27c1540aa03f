"""Per-example gradients of LULinear, z = P L U x + b (DP-HFlow eq. 2 and eq. 3).

With h = P^T g (the output gradient pulled back through the permutation) eq. (3) reads
dL/dL = h (U x)^T and dL/dU = L^T h x^T, restricted to the free (strict) triangles. The
diagonal of U is exp(log_diag), so dL/dlog_diag = diag(L^T h x^T) * exp(log_diag) plus the
log-determinant's share: logdet = sum(log_diag), so each example adds its dL/dlogdet.
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.grad_sample import register_grad_sampler
from torch import Tensor, nn

from privflow.models.layers import LULinear
from privflow.privacy.grad_samplers._common import accepts_tuple, logdet_term, split_backprops
from privflow.privacy.grad_samplers.registry import register_free_numel


@register_grad_sampler(LULinear)
@accepts_tuple
def lu_linear_grad_sample(layer: LULinear, activations: list[Any], backprops: Any) -> dict[nn.Parameter, Tensor]:
    """Eq. (3) per example, plus the log-determinant term for log_diag."""
    g, gld = split_backprops(backprops)
    x = activations[0].to(g.dtype)
    n = x.shape[0]
    with torch.no_grad():
        lower = layer.lower_matrix().to(g.dtype)
        upper = layer.upper_matrix().to(g.dtype)
        h = g[:, layer.inv_perm]  # P^T g: y = L U x, z = y[:, perm]
        k = h @ lower  # rows of (L^T h)^T
        out: dict[nn.Parameter, Tensor] = {}
        if layer.lower.requires_grad:
            out[layer.lower] = torch.tril(torch.einsum("ni,nj->nij", h, x @ upper.T), -1)
        if layer.upper.requires_grad:
            out[layer.upper] = torch.triu(torch.einsum("ni,nj->nij", k, x), 1)
        if layer.log_diag.requires_grad:
            gd = k * x * torch.exp(layer.log_diag.to(g.dtype))
            ld = logdet_term(gld, n, g)
            out[layer.log_diag] = gd + ld[:, None] if ld is not None else gd
        if layer.bias.requires_grad:
            out[layer.bias] = g.clone()
    return out


@register_free_numel(LULinear)
def lu_linear_free_numel(layer: LULinear) -> dict[nn.Parameter, int]:
    tri = layer.d * (layer.d - 1) // 2
    sizes = {layer.lower: tri, layer.upper: tri, layer.log_diag: layer.d, layer.bias: layer.d}
    return {p: m for p, m in sizes.items() if p.requires_grad}
