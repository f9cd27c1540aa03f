"""Fast clipping ops for linear layers y = x W^T + b, optionally with a fixed mask (W * M).

Per-example weight gradient of a layer called J times in one forward (the MADE shared by
all DP-HFlow blocks): G_n = (sum_u g_{u,n} a_{u,n}^T) * M. Its squared norm never needs G_n
(fast gradient clipping, Lee & Kifer 2021; Gram trick for repeated calls):

    ||G_n||^2 = sum_{u,v} (g_u * g_v)^T M (a_u * a_v)        (elementwise products, per n)

which for M = 1 is sum_{u,v} (a_u . a_v)(g_u . g_v). A MADE mask has few distinct rows
(one per degree), so M (a_u * a_v) is computed on the distinct rows only and scattered back.
The clipped sum sum_n w_n G_n is one matrix product (sum_u (w * g_u)^T a_u) * M.
nn.Linear's grad sampler is opacus' own; MaskedLinear's is in ``masked_linear.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from privflow.privacy.grad_samplers._common import split_backprops
from privflow.privacy.grad_samplers.registry import Call, register_ghost

_CHUNK_ELEMENTS = 1 << 20  # per-example gradient entries per chunk: small chunks stay in cache and
# reuse freed memory (a fresh 40 MB tensor costs more in page faults than its arithmetic)
_FREE: weakref.WeakKeyDictionary[nn.Module, tuple[Tensor, Tensor]] = weakref.WeakKeyDictionary()
_GROUPS: weakref.WeakKeyDictionary[nn.Module, tuple[Tensor, Tensor, Tensor, Tensor]] = weakref.WeakKeyDictionary()


def mask_groups(layer: nn.Module, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Distinct rows of the mask [k, in], each output row's group index [out] and the same as
    a one-hot matrix [out, k] (cached per layer and mask)."""
    cached = _GROUPS.get(layer)
    if cached is not None and cached[0] is mask:
        return cached[1], cached[2], cached[3]
    rows, inverse = torch.unique(mask, dim=0, return_inverse=True)
    onehot = torch.nn.functional.one_hot(inverse, rows.shape[0]).to(mask.dtype)
    _GROUPS[layer] = (mask, rows, inverse, onehot)
    return rows, inverse, onehot


def _free_index(layer: nn.Module, mask: Tensor) -> Tensor:
    cached = _FREE.get(layer)
    if cached is not None and cached[0] is mask:
        return cached[1]
    idx = (mask.reshape(-1) != 0).nonzero().squeeze(1)
    _FREE[layer] = (mask, idx)
    return idx


class LinearGhost:
    """Ghost norms / weighted sums for a linear layer; subclasses supply the mask."""

    def mask(self, layer: nn.Module) -> Tensor | None:
        return None

    def applicable(self, layer: nn.Module, calls: Sequence[Call]) -> bool:
        sizes = set()
        for c in calls:
            if len(c.activations) != 1 or not isinstance(c.activations[0], Tensor) or c.kwargs:
                return False
            a = c.activations[0]
            g, _ = split_backprops(c.backprops)
            if a.dim() != 2 or g.dim() != 2 or a.shape[0] != g.shape[0]:
                return False
            sizes.add(a.shape[0])
        return len(sizes) == 1

    def _stack(self, calls: Sequence[Call]) -> tuple[Tensor, Tensor]:
        """Activations and output gradients of all calls stacked: [J, n, in], [J, n, out].
        The last result is kept (keyed by the identity of the recorded tensors): a step asks
        for it once for the norms and again for every chunk of examples."""
        gs = [split_backprops(c.backprops)[0] for c in calls]
        acts = [c.activations[0] for c in calls]
        key = tuple(id(t) for t in acts) + tuple(id(t) for t in gs)
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] == key and all(x is y for x, y in zip(cached[1], acts + gs, strict=False)):
            return cached[2], cached[3]
        a = torch.stack([t.to(gs[0].dtype) for t in acts])
        g = torch.stack(gs)
        self._cache = (key, acts + gs, a, g)
        return a, g

    def sq_norms(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        a, g = self._stack(calls)
        j = a.shape[0]
        out: dict[nn.Parameter, Tensor] = {}
        if layer.weight.requires_grad:
            mask = self.mask(layer)
            if mask is None:
                if j == 1:
                    s = (a[0] * a[0]).sum(1) * (g[0] * g[0]).sum(1)
                else:
                    ka = torch.einsum("uni,vni->nuv", a, a)
                    kg = torch.einsum("uni,vni->nuv", g, g)
                    s = (ka * kg).sum((1, 2))
            else:
                rows, _, onehot = mask_groups(layer, mask)
                rt, oh = rows.to(a.dtype).T, onehot.to(a.dtype)
                s = torch.zeros(a.shape[1], dtype=a.dtype, device=a.device)
                for u in range(j):  # pairs u <= v of calls; views, no index copies
                    for v in range(u, j):
                        p = (a[u] * a[v]) @ rt  # [n, k]: M (a_u * a_v) on the distinct mask rows
                        q = (g[u] * g[v]) @ oh  # [n, k]: g_u * g_v summed within each group of rows
                        s += (1.0 if u == v else 2.0) * (p * q).sum(1)
            out[layer.weight] = s
        if layer.bias is not None and layer.bias.requires_grad:
            b = g.sum(0)
            out[layer.bias] = (b * b).sum(1)
        return out

    def materialise(
        self, layer: nn.Module, calls: Sequence[Call], sl: slice | None = None, apply_mask: bool = True
    ) -> dict[nn.Parameter, Tensor]:
        """Per-example gradients [c, *shape] summed over the calls: one batched product
        sum_u g_u a_u^T (inner dimension = number of calls) instead of one per call.
        ``apply_mask=False`` leaves the structurally zero entries unmasked (for callers that
        read only the free entries, see ``free_columns``)."""
        a, g = self._stack(calls)
        if sl is not None:
            a, g = a[:, sl], g[:, sl]
        out: dict[nn.Parameter, Tensor] = {}
        if layer.weight.requires_grad:
            w = torch.bmm(g.permute(1, 2, 0), a.transpose(0, 1))  # [c, out, J] @ [c, J, in]
            mask = self.mask(layer)
            out[layer.weight] = w.mul_(mask.to(w.dtype)) if mask is not None and apply_mask else w
        if layer.bias is not None and layer.bias.requires_grad:
            out[layer.bias] = g.sum(0)
        return out

    def free_columns(self, layer: nn.Module) -> dict[nn.Parameter, Tensor | None]:
        """Flat indices of the entries that can be non-zero (None: all of them)."""
        mask = self.mask(layer)
        out: dict[nn.Parameter, Tensor | None] = {layer.weight: None if mask is None else _free_index(layer, mask)}
        if layer.bias is not None:
            out[layer.bias] = None
        return out

    def unit_stats(self, layer: nn.Module, calls: Sequence[Call]) -> dict[nn.Parameter, tuple[Tensor, Tensor]] | None:
        a, g = self._stack(calls)
        out: dict[nn.Parameter, tuple[Tensor, Tensor]] = {}
        if layer.weight.requires_grad:
            mask = self.mask(layer)
            if len(calls) > 1:
                # Row L1 norms of a sum over calls need the per-example gradient: materialise
                # it in chunks of examples, keeping only the per-row reductions.
                n, (d_out, d_in) = a.shape[1], layer.weight.shape
                size = max(1, _CHUNK_ELEMENTS // (d_out * d_in))
                l1s, sqs = [], []
                for i in range(0, n, size):
                    w = self.materialise(layer, calls, slice(i, i + size))[layer.weight]
                    l1s.append(w.abs_().sum(2))  # in place: far faster here than vector_norm
                    sqs.append(w.square_().sum(2))
                out[layer.weight] = (torch.cat(l1s), torch.cat(sqs))
            else:
                a0, g0 = a[0], g[0]
                if mask is None:
                    l1 = g0.abs() * a0.abs().sum(1, keepdim=True)
                    sq = g0 * g0 * (a0 * a0).sum(1, keepdim=True)
                else:
                    rows, inverse, _ = mask_groups(layer, mask)
                    rt = rows.to(a0.dtype).T
                    l1 = g0.abs() * torch.index_select(a0.abs() @ rt, 1, inverse)
                    sq = g0 * g0 * torch.index_select((a0 * a0) @ rt, 1, inverse)
                out[layer.weight] = (l1, sq)
        if layer.bias is not None and layer.bias.requires_grad:
            b = g.sum(0)
            out[layer.bias] = (b.abs(), b * b)
        return out

    def weighted_sum(
        self, layer: nn.Module, calls: Sequence[Call], weights: dict[nn.Parameter, Tensor]
    ) -> dict[nn.Parameter, Tensor]:
        a, g = self._stack(calls)
        j, n, d_in = a.shape
        out: dict[nn.Parameter, Tensor] = {}
        if layer.weight.requires_grad:
            w = weights[layer.weight]
            w = w[:, None] if w.dim() == 1 else w
            gw = (g * w).reshape(j * n, -1)
            grad = gw.T @ a.reshape(j * n, d_in)
            mask = self.mask(layer)
            out[layer.weight] = grad * mask.to(grad.dtype) if mask is not None else grad
        if layer.bias is not None and layer.bias.requires_grad:
            w = weights[layer.bias]
            w = w[:, None] if w.dim() == 1 else w
            out[layer.bias] = (g * w).sum((0, 1))
        return out


register_ghost(nn.Linear)(LinearGhost)
