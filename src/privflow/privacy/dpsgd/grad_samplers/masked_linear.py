"""Per-example gradients of MaskedLinear (MADE): grad_W,n = (g_n a_n^T) * M, grad_b,n = g_n.

Registered with opacus (``register_grad_sampler``); the fast clipping ops are the masked
variant of ``linear.LinearGhost``. When the layer is called several times in one forward
(the MADE shared by the DP-HFlow blocks) each call gives one such term and the per-example
gradient is their sum: opacus 1.6's hooks accumulate them (``_current_grad_sample`` +=, one
activation popped per backward call), and so does our recorder.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from opacus.grad_sample import register_grad_sampler
from torch import Tensor, nn

from privflow.models.layers import MaskedLinear
from privflow.privacy.dpsgd.grad_samplers._common import accepts_tuple, split_backprops
from privflow.privacy.dpsgd.grad_samplers.linear import LinearGhost
from privflow.privacy.dpsgd.grad_samplers.registry import register_free_numel, register_ghost


@register_grad_sampler(MaskedLinear)
@accepts_tuple
def masked_linear_grad_sample(
    layer: MaskedLinear, activations: list[Any], backprops: Any
) -> dict[nn.Parameter, Tensor]:
    """Per-example (g a^T) * mask and g; inputs may carry extra middle dims (summed over)."""
    g, _ = split_backprops(backprops)
    a = activations[0].to(g.dtype)
    out: dict[nn.Parameter, Tensor] = {}
    if layer.weight.requires_grad:
        out[layer.weight] = torch.einsum("n...i,n...j->nij", g, a) * layer.mask.to(g.dtype)
    if layer.bias.requires_grad:
        out[layer.bias] = torch.einsum("n...k->nk", g)
    return out


@register_ghost(MaskedLinear)
class MaskedLinearGhost(LinearGhost):
    def mask(self, layer: nn.Module) -> Tensor | None:
        return cast(Tensor | None, layer.mask)


@register_free_numel(MaskedLinear)
def masked_linear_free_numel(layer: MaskedLinear) -> dict[nn.Parameter, int]:
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = int((layer.mask != 0).sum().item())
    if layer.bias.requires_grad:
        out[layer.bias] = layer.bias.numel()
    return out
