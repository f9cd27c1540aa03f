"""Per-example gradients of BlockEmbedding (DP-HFlow's block-index embedding q(j)).

Output row n is weight[index_n], so grad_n = one_hot(index_n) g_n^T: the example's output
gradient lands in the row of its block. Both call forms are handled: ``forward(index:
LongTensor[n])`` and ``forward(index: int, n: int)`` (the same row for every example).
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.grad_sample import register_grad_sampler
from torch import Tensor, nn

from privflow.models.layers import BlockEmbedding
from privflow.privacy.dpsgd.grad_samplers._common import accepts_tuple, split_backprops


@register_grad_sampler(BlockEmbedding)
@accepts_tuple
def block_embedding_grad_sample(
    layer: BlockEmbedding, activations: list[Any], backprops: Any
) -> dict[nn.Parameter, Tensor]:
    g, _ = split_backprops(backprops)
    n = g.shape[0]
    out: dict[nn.Parameter, Tensor] = {}
    if not layer.weight.requires_grad:
        return out
    gs = torch.zeros((n, layer.blocks, layer.dim), dtype=g.dtype, device=g.device)
    index = activations[0]
    if isinstance(index, Tensor) and index.dim() == 1:
        gs[torch.arange(n, device=g.device), index.to(g.device).long()] = g
    else:
        gs[:, int(index)] = g
    out[layer.weight] = gs
    return out
