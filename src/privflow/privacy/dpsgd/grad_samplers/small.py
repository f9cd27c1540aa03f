"""Fast clipping ops for small layers whose per-example gradients are cheap to form.

ActNorm and BlockEmbedding hold a few dozen parameters, so their per-example gradients
([n, 2d] and [n, blocks, dim]) are as cheap as any ghost norm; what costs is the generic
materialising path around them (a grad sampler call per layer call, chunking, one reduction
per parameter: several times the arithmetic on the demo's DP step). ``SmallGhost`` forms
the gradients once per step in a few whole-batch operations (kept for the clipped sum that
follows: norms, per-row statistics, weighted sums); stochastic sparsification's entries come
through the grad samplers, as before.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor, nn

from privflow.models.layers import ActNorm, BlockEmbedding
from privflow.privacy.dpsgd.grad_samplers._common import (
    StepMemo,
    call_sum,
    row_stats,
    single_tensor_calls,
    split_backprops,
    step_key,
    weighted,
)
from privflow.privacy.dpsgd.grad_samplers.registry import Call, register_ghost
from privflow.privacy.dpsgd.grad_samplers.tape import materialise


class SmallGhost(ABC):
    """Per-example gradients [n, numel] of every trainable parameter, formed once per step
    (``grads``, by the subclass); norms and clipped sums from them."""

    def __init__(self) -> None:
        self._memo: StepMemo[dict[nn.Parameter, Tensor]] = StepMemo()

    @abstractmethod
    def applicable(self, layer: nn.Module, calls: Sequence[Call]) -> bool:
        """Whether the calls have the form ``grads`` reads."""

    @abstractmethod
    def grads(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        """Per-example gradients [n, numel] summed over the calls."""

    def _grads(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        with torch.no_grad():
            return self._memo.get(layer, step_key(calls), lambda: self.grads(layer, calls))

    def sq_norms(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        return {p: torch.linalg.vecdot(v, v) for p, v in self._grads(layer, calls).items()}

    def unit_stats(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, tuple[Tensor, Tensor]]:
        """Per-row (L1, squared L2) [n, rows], rows along each parameter's first axis."""
        return {p: row_stats(v.reshape(v.shape[0], *p.shape)) for p, v in self._grads(layer, calls).items()}

    def weighted_sum(
        self, layer: nn.Module, calls: Sequence[Call], weights: dict[nn.Parameter, Tensor]
    ) -> dict[nn.Parameter, Tensor]:
        grads = self._grads(layer, calls)
        return weighted({p: v.reshape(v.shape[0], *p.shape) for p, v in grads.items()}, weights)

    def materialise(
        self, layer: nn.Module, calls: Sequence[Call], sl: slice | None = None
    ) -> dict[nn.Parameter, Tensor]:
        return materialise(layer, calls, sl)

    def free_entries(self, layer: nn.Module, calls: Sequence[Call], sl: slice) -> Tensor:
        grads = self.materialise(layer, calls, sl)
        return torch.cat([grads[p].reshape(grads[p].shape[0], -1) for p in _trainable(layer)], 1)

    def free_index(self, layer: nn.Module) -> dict[nn.Parameter, Tensor | None]:
        return {p: None for p in _trainable(layer)}


def _trainable(layer: nn.Module) -> list[nn.Parameter]:
    return [p for p in layer.parameters(recurse=False) if p.requires_grad]


@register_ghost(ActNorm)
class ActNormGhost(SmallGhost):
    """z = (x - loc) * exp(-log_scale): dL/dloc = -g * exp(-log_scale), dL/dlog_scale =
    -(g * z + dL/dlogdet) per example (``actnorm``), summed over the calls."""

    def applicable(self, layer: nn.Module, calls: Sequence[Call]) -> bool:
        return single_tensor_calls(calls)

    def grads(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        act = cast(ActNorm, layer)  # registered for ActNorm: the only layers it is asked about
        parts = [split_backprops(c.backprops) for c in calls]
        dtype = parts[0][0].dtype
        inv = torch.exp(-act.log_scale.to(dtype))
        out: dict[nn.Parameter, Tensor] = {}
        if act.loc.requires_grad:
            out[act.loc] = call_sum([g for g, _ in parts]) * -inv
        if act.log_scale.requires_grad:
            terms = []
            for (g, gld), c in zip(parts, calls, strict=True):
                t = g * ((c.activations[0].to(dtype) - act.loc.to(dtype)) * inv)
                terms.append(t if gld is None else t + gld.reshape(-1, 1).to(dtype))
            out[act.log_scale] = call_sum(terms).neg_()
        return out


@register_ghost(BlockEmbedding)
class BlockEmbeddingGhost(SmallGhost):
    """Row index_n of example n's gradient is its output gradient g_n (``block_embedding``):
    every call's gradients are added into [n, blocks, dim] at once, by flat row index."""

    def applicable(self, layer: nn.Module, calls: Sequence[Call]) -> bool:
        for c in calls:
            g, _ = split_backprops(c.backprops)
            index = c.activations[0] if c.activations else None
            if not isinstance(g, Tensor) or g.dim() != 2:
                return False
            if isinstance(index, Tensor) and (index.dim() != 1 or index.shape[0] != g.shape[0]):
                return False
            if not isinstance(index, (Tensor, int)):
                return False
        return True

    def grads(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        if not layer.weight.requires_grad:
            return {}
        g0, _ = split_backprops(calls[0].backprops)
        n, blocks, dim = g0.shape[0], cast(int, layer.blocks), cast(int, layer.dim)
        out = torch.zeros(n * blocks, dim, dtype=g0.dtype, device=g0.device)
        base = torch.arange(n, device=g0.device) * blocks
        for c in calls:
            g, _ = split_backprops(c.backprops)
            index = c.activations[0]
            rows = base + (index.to(g.device).long() if isinstance(index, Tensor) else int(index))
            out.index_add_(0, rows, g)
        return {cast(nn.Parameter, layer.weight): out.reshape(n, blocks * dim)}
