"""Layer-level operations of the fast clipping path (shared by the registered strategies).

Per-example norms and weighted sums per layer: from stored activations and output gradients
(``grad_samplers.GHOST_OPS``) where the layer type allows, else from per-example gradients
materialised in small chunks of examples. See ``engine`` for the method as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast

import torch
from torch import Tensor, nn

from privflow.privacy.dpsgd.clipping.per_layer import layer_thresholds
from privflow.privacy.dpsgd.clipping.per_unit import clip_per_unit, unit_factors
from privflow.privacy.dpsgd.clipping.sparsify import (
    clamped_gamma,
    free_rows,
    from_free_rows,
    sampled_threshold,
    sparsify_clipped_sum,
    sparsify_k,
    threshold_positions,
)
from privflow.privacy.dpsgd.clipping.structure import LayerInfo
from privflow.privacy.dpsgd.grad_samplers import GHOST_OPS, materialise
from privflow.privacy.dpsgd.grad_samplers._common import examples_per_chunk, weighted
from privflow.privacy.dpsgd.grad_samplers.registry import Call, GhostOps, SampledOps

Method = Literal["fast", "hooks"]

_CHUNK_ELEMENTS = 1 << 21  # per-example gradient entries per chunk: small chunks stay in cache and
# reuse freed memory (a fresh large tensor costs more in page faults than its arithmetic). 2^21: on
# the sparsified step of the shared MADE layer it was faster than 2^20 and 2^22.


def chunks(n: int, layer: LayerInfo, entries: int | None = None) -> list[slice]:
    """Slices of the n examples, ``_CHUNK_ELEMENTS`` per-example gradient entries each on the
    CPU (``examples_per_chunk``: more on a GPU) (``entries`` per example; default: every entry
    of the layer's parameters)."""
    if entries is None:
        entries = sum(p.numel() for p in layer.params)
    size = examples_per_chunk(layer.params[0].device, entries, _CHUNK_ELEMENTS)
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def ghost_ops(layer: LayerInfo, calls: Sequence[Call], method: Method) -> GhostOps | None:
    if method != "fast":
        return None
    ops = GHOST_OPS.get(type(layer.module))
    return ops if ops is not None and ops.applicable(layer.module, calls) else None


def materialise_chunk(layer: LayerInfo, calls: Sequence[Call], sl: slice, method: Method) -> dict[nn.Parameter, Tensor]:
    ops = ghost_ops(layer, calls, method)
    if ops is not None:
        return ops.materialise(layer.module, calls, sl)
    return materialise(layer.module, calls, sl)


def add_into(acc: dict[nn.Parameter, Tensor], part: dict[nn.Parameter, Tensor]) -> None:
    for p, g in part.items():
        acc[p] = acc[p] + g if p in acc else g


def layer_sq(
    layer: LayerInfo, calls: Sequence[Call], n: int, method: Method
) -> tuple[Tensor, dict[nn.Parameter, Tensor] | None]:
    """Per-example squared norm [n] of the layer's gradient, and the materialised per-example
    gradients when they fit in one chunk (kept for the weighted sum that follows)."""
    ops = ghost_ops(layer, calls, method)
    if ops is not None:
        return cast(Tensor, sum(ops.sq_norms(layer.module, calls).values())), None
    parts_sl = chunks(n, layer)
    parts, kept = [], None
    for sl in parts_sl:
        g = materialise_chunk(layer, calls, sl, method)
        parts.append(cast(Tensor, sum(v.reshape(v.shape[0], -1).pow(2).sum(1) for v in g.values())))
        kept = g if len(parts_sl) == 1 else None
    return torch.cat(parts), kept


def layer_sum(
    layer: LayerInfo,
    calls: Sequence[Call],
    n: int,
    method: Method,
    w: Tensor,
    kept: dict[nn.Parameter, Tensor] | None = None,
) -> dict[nn.Parameter, Tensor]:
    """sum_i w_i grad_i of the layer for a per-example weight w [n]."""
    if kept is not None:
        return weighted(kept, {p: w for p in kept})
    ops = ghost_ops(layer, calls, method)
    if ops is not None:
        return ops.weighted_sum(layer.module, calls, {p: w for p in layer.params})
    acc: dict[nn.Parameter, Tensor] = {}
    for sl in chunks(n, layer):
        g = materialise_chunk(layer, calls, sl, method)
        add_into(acc, weighted(g, {p: w[sl] for p in g}))
    return acc


def per_unit_layer(
    layer: LayerInfo, calls: Sequence[Call], n: int, method: Method, thr: float
) -> dict[nn.Parameter, Tensor]:
    ops = ghost_ops(layer, calls, method)
    stats = ops.unit_stats(layer.module, calls) if ops is not None else None
    if ops is not None and stats is not None:
        l1 = torch.cat([stats[p][0] for p in layer.params], 1)
        sq = torch.cat([stats[p][1] for p in layer.params], 1)
        f = unit_factors(l1, sq, thr)
        weights, start = {}, 0
        for p in layer.params:
            rows = stats[p][0].shape[1]
            weights[p] = f[:, start : start + rows]
            start += rows
        return ops.weighted_sum(layer.module, calls, weights)
    acc: dict[nn.Parameter, Tensor] = {}
    for sl in chunks(n, layer):
        g = materialise_chunk(layer, calls, sl, method)
        clipped = clip_per_unit([[g[p] for p in layer.params]], [thr])[0]
        add_into(acc, {p: c.sum(0) for p, c in zip(layer.params, clipped, strict=False)})
    return acc


def sparsify_layer(
    layer: LayerInfo,
    calls: Sequence[Call],
    n: int,
    method: Method,
    thr: float,
    sparsity: float,
    gamma: Tensor,
    positions: Tensor | None = None,
) -> dict[nn.Parameter, Tensor]:
    """sum_i clip_{C_l}(T(g_i)) for one layer, in chunks of examples. Structurally zero
    entries (a MADE mask, the fixed triangles of LU) are left out: they are 0 and stay 0 under
    T, and the k-th largest entry is the same with or without them (k <= free entries).
    `positions` index the free entries (``sparsify.threshold_positions``)."""
    ops = ghost_ops(layer, calls, method)
    index = free_index(layer)
    k = sparsify_k(layer.complexity, sparsity)
    # ops with `sampled_entries` have `sparsified_sum` with it (grad_samplers/registry.py, SampledOps)
    sampling = cast(SampledOps, ops) if hasattr(ops, "sampled_entries") else None
    sample = None
    if sampling is not None and positions is not None:
        sample = sampling.sampled_entries(layer.module, calls, positions)
    if sampling is not None and sample is not None:
        # the CPU kernel: tau from the sampled entries, then one pass per example, nothing stored
        tau = sampled_threshold(sample, k, layer.complexity)
        total = sampling.sparsified_sum(layer.module, calls, tau, clamped_gamma(gamma, sample), thr)
    else:
        parts = []
        for sl in chunks(n, layer, layer.complexity):
            if ops is not None:
                v = ops.free_entries(layer.module, calls, sl)
            else:
                g = materialise(layer.module, calls, sl)
                v = free_rows([g[p] for p in layer.params], [index.get(p) for p in layer.params])
            parts.append(sparsify_clipped_sum(v, k, gamma[sl], thr, positions))
        total = torch.stack(parts).sum(0)
    sums = from_free_rows(total[None], [p.shape for p in layer.params], [index.get(p) for p in layer.params])
    return {p: s[0] for p, s in zip(layer.params, sums, strict=True)}


def free_index(layer: LayerInfo) -> dict[nn.Parameter, Tensor | None]:
    """Flat indices of each parameter's free entries (absent or None: all), from the layer
    type's ghost ops whether or not they apply to this batch (the mask is the module's)."""
    ops = GHOST_OPS.get(type(layer.module))
    return ops.free_index(layer.module) if ops is not None else {}


def thresholds(layers: Sequence[LayerInfo], max_grad_norm: float, active: Sequence[LayerInfo]) -> list[float]:
    """Thresholds of the active layers, from the split over ALL layers (a fixed, public split)."""
    all_thr = dict(zip((id(layer) for layer in layers), layer_thresholds(layers, max_grad_norm), strict=False))
    return [all_thr[id(layer)] for layer in active]


def gammas(
    n: int, count: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
) -> list[Tensor]:
    gen_device = generator.device if generator is not None else device
    u = 1.0 - torch.rand((count, n), generator=generator, device=gen_device, dtype=dtype).to(device)  # (0, 1]
    return list(u)


def positions(
    layers: Sequence[LayerInfo], generator: torch.Generator | None, device: torch.device
) -> list[Tensor | None]:
    """Each layer's tau positions for the step (``sparsify.threshold_positions``), drawn after
    the gammas: the fast path and the reference draw the same."""
    return [threshold_positions(layer.complexity, generator, device) for layer in layers]
