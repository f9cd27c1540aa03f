"""Per-example gradients of LowRankLinear, z = (diag(exp(log_s)) + A B) x + b (DP-HFlow eq. 1, 4).

Eq. (4): dL/dA = g (B x)^T, dL/dB = A^T g x^T, dL/ds = g * x (here s = exp(log_s), so the
log_s gradient is g * x * exp(log_s)). The layer also returns logdet = log|det W|, which
depends on (log_s, A, B) but not on the example: each example adds dL/dlogdet times the
gradient of log|det W| (matrix determinant lemma), computed once per call by autograd.
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.grad_sample import register_grad_sampler
from torch import Tensor, nn

from privflow.models.layers import LowRankLinear
from privflow.privacy.dpsgd.grad_samplers._common import accepts_tuple, logdet_term, split_backprops


def _logdet_grads(layer: LowRankLinear, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Gradient of log|det W| w.r.t. (log_s, A, B): a property of the weights, not of the data."""
    with torch.enable_grad():
        ps = [
            layer.log_s.detach().to(dtype).requires_grad_(),
            layer.A.detach().to(dtype).requires_grad_(),
            layer.B.detach().to(dtype).requires_grad_(),
        ]
        log_s, a, b = ps
        if layer.rank == 1:
            c = 1.0 + (b[0] * torch.exp(-log_s) * a[:, 0]).sum()
            val = log_s.sum() + torch.log(torch.abs(c))
        else:
            eye = torch.eye(layer.rank, dtype=dtype, device=a.device)
            val = log_s.sum() + torch.linalg.slogdet(eye + (b * torch.exp(-log_s)) @ a)[1]
        grads = torch.autograd.grad(val, ps)
    return grads[0], grads[1], grads[2]


@register_grad_sampler(LowRankLinear)
@accepts_tuple
def low_rank_grad_sample(layer: LowRankLinear, activations: list[Any], backprops: Any) -> dict[nn.Parameter, Tensor]:
    """Eq. (4) per example, plus the log-determinant term."""
    g, gld = split_backprops(backprops)
    x = activations[0].to(g.dtype)
    n = x.shape[0]
    ld = logdet_term(gld, n, g)
    with torch.no_grad():
        a_mat = layer.A.to(g.dtype)
        b_mat = layer.B.to(g.dtype)
        if ld is not None:  # the log-determinant's gradients: read below only where ld is not None
            d_log_s, d_a, d_b = _logdet_grads(layer, g.dtype)
        out: dict[nn.Parameter, Tensor] = {}
        if layer.log_s.requires_grad:
            gs = g * x * torch.exp(layer.log_s.to(g.dtype))
            out[layer.log_s] = gs + ld[:, None] * d_log_s if ld is not None else gs
        if layer.A.requires_grad:
            ga = torch.einsum("ni,nk->nik", g, x @ b_mat.T)
            out[layer.A] = ga + ld[:, None, None] * d_a if ld is not None else ga
        if layer.B.requires_grad:
            gb = torch.einsum("nk,nj->nkj", g @ a_mat, x)
            out[layer.B] = gb + ld[:, None, None] * d_b if ld is not None else gb
        if layer.bias.requires_grad:
            out[layer.bias] = g.clone()
    return out
