"""Per-example gradients of ActNorm, z = (x - loc) * exp(-log_scale), logdet = -sum(log_scale).

dL/dloc = -g * exp(-log_scale); dL/dlog_scale = -g * z - dL/dlogdet (per example).
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.grad_sample import register_grad_sampler
from torch import Tensor, nn

from privflow.models.layers import ActNorm
from privflow.privacy.dpsgd.grad_samplers._common import accepts_tuple, logdet_term, split_backprops


@register_grad_sampler(ActNorm)
@accepts_tuple
def actnorm_grad_sample(layer: ActNorm, activations: list[Any], backprops: Any) -> dict[nn.Parameter, Tensor]:
    g, gld = split_backprops(backprops)
    x = activations[0].to(g.dtype)
    with torch.no_grad():
        inv_scale = torch.exp(-layer.log_scale.to(g.dtype))
        out: dict[nn.Parameter, Tensor] = {}
        if layer.loc.requires_grad:
            out[layer.loc] = -g * inv_scale
        if layer.log_scale.requires_grad:
            gs = -g * (x - layer.loc.to(g.dtype)) * inv_scale
            ld = logdet_term(gld, x.shape[0], g)
            out[layer.log_scale] = gs - ld[:, None] if ld is not None else gs
    return out
