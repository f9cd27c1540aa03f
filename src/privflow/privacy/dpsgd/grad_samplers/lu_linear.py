"""Per-example gradients of LULinear, z = P L U x + b (DP-HFlow eq. 2 and eq. 3).

With h = P^T g (the output gradient pulled back through the permutation) eq. (3) reads
dL/dL = h (U x)^T and dL/dU = L^T h x^T, restricted to the free (strict) triangles. The
diagonal of U is exp(log_diag), so dL/dlog_diag = diag(L^T h x^T) * exp(log_diag) plus the
log-determinant's share: logdet = sum(log_diag), so each example adds its dL/dlogdet.

Fast clipping ops (``LUGhost``): both triangles are masked outer products, so their norms
need no per-example matrix (fast gradient clipping, Lee & Kifer 2021, which DP-HFlow's
"Fast Per-example Gradient Computation" extends to eq. 3). For one call,

    ||tril(h u^T, -1)||^2 = sum_i h_i^2 sum_{j<i} u_j^2,   ||triu(k x^T, 1)||^2 = sum_i k_i^2 sum_{j>i} x_j^2,

an exclusive cumulative sum over the columns (O(d) per example, not O(d^2)); a layer called
J times sums these over pairs of calls (the Gram trick of ``linear``). Row i's L1 norm is
|h_i| sum_{j<i} |u_j| (and the same for the upper triangle), and the clipped sum is one
masked product tril(sum_n w_n h_n u_n^T).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from opacus.grad_sample import register_grad_sampler
from torch import Tensor, nn

from privflow.models.layers import LULinear
from privflow.privacy.dpsgd import cpu_kernels
from privflow.privacy.dpsgd.grad_samplers._common import (
    StepMemo,
    accepts_tuple,
    call_pairs,
    call_sum,
    flat_select,
    logdet_term,
    row_stats,
    single_tensor_calls,
    split_backprops,
    step_key,
)
from privflow.privacy.dpsgd.grad_samplers.registry import Call, register_free_numel, register_ghost


def _terms(layer: LULinear, x: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(h, u, k) of eq. (3) for one call: h = P^T g, u = U x, k = L^T h, each [n, d]."""
    lower = layer.lower_matrix().to(g.dtype)
    upper = layer.upper_matrix().to(g.dtype)
    h = g[:, layer.inv_perm.to(g.device)]  # y = L U x, z = y[:, perm]
    return h, x @ upper.T, h @ lower


def _diag(layer: LULinear, k: Tensor, x: Tensor, gld: Tensor | None) -> Tensor:
    """dL/dlog_diag per example: k * x * exp(log_diag), plus dL/dlogdet."""
    gd = k * x * torch.exp(layer.log_diag.to(k.dtype))
    ld = logdet_term(gld, x.shape[0], k)
    return gd + ld[:, None] if ld is not None else gd


@register_grad_sampler(LULinear)
@accepts_tuple
def lu_linear_grad_sample(layer: LULinear, activations: list[Any], backprops: Any) -> dict[nn.Parameter, Tensor]:
    """Eq. (3) per example, plus the log-determinant term for log_diag."""
    g, gld = split_backprops(backprops)
    x = activations[0].to(g.dtype)
    with torch.no_grad():
        h, u, k = _terms(layer, x, g)
        out: dict[nn.Parameter, Tensor] = {}
        if layer.lower.requires_grad:
            out[layer.lower] = torch.tril(torch.einsum("ni,nj->nij", h, u), -1)
        if layer.upper.requires_grad:
            out[layer.upper] = torch.triu(torch.einsum("ni,nj->nij", k, x), 1)
        if layer.log_diag.requires_grad:
            out[layer.log_diag] = _diag(layer, k, x, gld)
        if layer.bias.requires_grad:
            out[layer.bias] = g.clone()
    return out


@register_free_numel(LULinear)
def lu_linear_free_numel(layer: LULinear) -> dict[nn.Parameter, int]:
    tri = layer.d * (layer.d - 1) // 2
    sizes = {layer.lower: tri, layer.upper: tri, layer.log_diag: layer.d, layer.bias: layer.d}
    return {p: m for p, m in sizes.items() if p.requires_grad}


def _exclusive_cumsum(t: Tensor) -> Tensor:
    """sum_{j<i} t_j along the last axis."""
    return torch.cumsum(t, -1) - t


def _exclusive_revsum(t: Tensor) -> Tensor:
    """sum_{j>i} t_j along the last axis."""
    return t.sum(-1, keepdim=True) - torch.cumsum(t, -1)


def _pair_sum(rows: Tensor, partial: Callable[[Tensor], Tensor], cols: Tensor) -> Tensor:
    """sum_{u,v} sum_i rows_ui rows_vi partial(cols_u * cols_v)_i per example, from [J, n, d]
    stacks: the squared norm of a triangle of sum_u rows_u cols_u^T (one call: no pairs)."""
    if rows.shape[0] == 1:
        return (rows[0] * rows[0] * partial(cols[0] * cols[0])).sum(1)
    iu, iv, w = call_pairs(rows.shape[0], rows.device, rows.dtype)
    return w @ (rows[iu] * rows[iv] * partial(cols[iu] * cols[iv])).sum(2)


def _stacked(ts: list[Tensor]) -> Tensor:
    """[J, n, d] from J calls' [n, d]; a view for one call (the usual case: no copy)."""
    return ts[0].unsqueeze(0) if len(ts) == 1 else torch.stack(ts)


def _as_rows(w: Tensor) -> Tensor:
    """A weight [n] (per example) or [n, rows] (per example and row) as [n, 1] or [n, rows]."""
    return w[:, None] if w.dim() == 1 else w


class LUGhost:
    """Ghost norms, per-row statistics and weighted sums of LULinear, from each call's
    (h, u = U x, k = L^T h, x) and the summed diagonal / bias gradients ([J, n, d] stacks)."""

    def applicable(self, layer: nn.Module, calls: Sequence[Call]) -> bool:
        return single_tensor_calls(calls)

    def __init__(self) -> None:
        self._memo: StepMemo[tuple[Tensor, ...]] = StepMemo()

    def _stack(self, layer: LULinear, calls: Sequence[Call], sl: slice | None = None) -> tuple[Tensor, ...]:
        """h, u, k, x stacked over the calls [J, c, d]; dL/dlog_diag and dL/db summed over calls
        [c, d]. The whole batch's are kept for the step (``StepMemo``)."""
        if sl is None:
            return self._memo.get(layer, step_key(calls), lambda: self._compute(layer, calls, None))
        return self._compute(layer, calls, sl)

    def _compute(self, layer: LULinear, calls: Sequence[Call], sl: slice | None) -> tuple[Tensor, ...]:
        hs: list[Tensor] = []
        us: list[Tensor] = []
        ks: list[Tensor] = []
        xs: list[Tensor] = []
        gds: list[Tensor] = []
        gbs: list[Tensor] = []
        for call in calls:
            g, gld = split_backprops(call.backprops)
            x = call.activations[0].to(g.dtype)
            if sl is not None:
                g, x, gld = g[sl], x[sl], None if gld is None else gld[sl]
            h, u, k = _terms(layer, x, g)
            for out, t in zip((hs, us, ks, xs, gds, gbs), (h, u, k, x, _diag(layer, k, x, gld), g), strict=True):
                out.append(t)
        return (*(_stacked(t) for t in (hs, us, ks, xs)), call_sum(gds), call_sum(gbs))

    def sq_norms(self, layer: LULinear, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        with torch.no_grad():
            kernel = _kernel_sq_norms(layer, calls)
            if kernel is not None:
                return kernel
            h, u, k, x, gd, gb = self._stack(layer, calls)
            out: dict[nn.Parameter, Tensor] = {}
            if layer.lower.requires_grad:
                out[layer.lower] = _pair_sum(h, _exclusive_cumsum, u)
            if layer.upper.requires_grad:
                out[layer.upper] = _pair_sum(k, _exclusive_revsum, x)
            if layer.log_diag.requires_grad:
                out[layer.log_diag] = (gd * gd).sum(1)
            if layer.bias.requires_grad:
                out[layer.bias] = (gb * gb).sum(1)
        return out

    def unit_stats(self, layer: LULinear, calls: Sequence[Call]) -> dict[nn.Parameter, tuple[Tensor, Tensor]]:
        """Per-row (L1, squared L2); a layer called several times is materialised (d x d per example)."""
        with torch.no_grad():
            if len(calls) > 1:
                return {p: row_stats(g) for p, g in self.materialise(layer, calls).items()}
            h, u, k, x, gd, gb = (t[0] if t.dim() == 3 else t for t in self._stack(layer, calls))
            out: dict[nn.Parameter, tuple[Tensor, Tensor]] = {}
            if layer.lower.requires_grad:
                out[layer.lower] = (h.abs() * _exclusive_cumsum(u.abs()), h * h * _exclusive_cumsum(u * u))
            if layer.upper.requires_grad:
                out[layer.upper] = (k.abs() * _exclusive_revsum(x.abs()), k * k * _exclusive_revsum(x * x))
            if layer.log_diag.requires_grad:
                out[layer.log_diag] = (gd.abs(), gd * gd)
            if layer.bias.requires_grad:
                out[layer.bias] = (gb.abs(), gb * gb)
        return out

    def weighted_sum(
        self, layer: LULinear, calls: Sequence[Call], weights: dict[nn.Parameter, Tensor]
    ) -> dict[nn.Parameter, Tensor]:
        with torch.no_grad():
            if all(w.dim() == 1 for w in weights.values()):
                return _example_weighted_sum(layer, calls, weights)
            h, u, k, x, gd, gb = self._stack(layer, calls)
            d = h.shape[2]
            out: dict[nn.Parameter, Tensor] = {}
            if layer.lower.requires_grad:
                hw = (h * _as_rows(weights[layer.lower])).reshape(-1, d)
                out[layer.lower] = torch.tril(hw.T @ u.reshape(-1, d), -1)
            if layer.upper.requires_grad:
                kw = (k * _as_rows(weights[layer.upper])).reshape(-1, d)
                out[layer.upper] = torch.triu(kw.T @ x.reshape(-1, d), 1)
            if layer.log_diag.requires_grad:
                out[layer.log_diag] = (gd * _as_rows(weights[layer.log_diag])).sum(0)
            if layer.bias.requires_grad:
                out[layer.bias] = (gb * _as_rows(weights[layer.bias])).sum(0)
        return out

    def materialise(
        self, layer: LULinear, calls: Sequence[Call], sl: slice | None = None
    ) -> dict[nn.Parameter, Tensor]:
        """Per-example gradients [c, *shape] of examples ``sl``, summed over the calls."""
        return self._blocks(layer, calls, sl, triangles=True)

    def free_entries(self, layer: LULinear, calls: Sequence[Call], sl: slice) -> Tensor:
        """The entries ``free_index`` names, [c, m], the trainable parameters' in turn."""
        full = self._blocks(layer, calls, sl, triangles=False)
        idx = self.free_index(layer)
        return torch.cat([flat_select(v, idx[p]) for p, v in full.items()], 1)

    def _blocks(
        self, layer: LULinear, calls: Sequence[Call], sl: slice | None, triangles: bool
    ) -> dict[nn.Parameter, Tensor]:
        """Per-example gradients; ``triangles=False`` leaves the fixed entries of L and U unzeroed."""
        with torch.no_grad():
            h, u, k, x, gd, gb = self._stack(layer, calls, sl)
            out: dict[nn.Parameter, Tensor] = {}
            if layer.lower.requires_grad:
                lo = torch.einsum("jni,jnk->nik", h, u)
                out[layer.lower] = torch.tril(lo, -1) if triangles else lo
            if layer.upper.requires_grad:
                up = torch.einsum("jni,jnk->nik", k, x)
                out[layer.upper] = torch.triu(up, 1) if triangles else up
            if layer.log_diag.requires_grad:
                out[layer.log_diag] = gd
            if layer.bias.requires_grad:
                out[layer.bias] = gb
        return out

    def free_index(self, layer: nn.Module) -> dict[nn.Parameter, Tensor | None]:
        """Flat indices of the strict triangles; the diagonal and the bias are free (None)."""
        lu = cast(LULinear, layer)  # registered for LULinear: the only layers it is asked about
        lower, upper = _triangles(lu.d, lu.lower.device)
        out: dict[nn.Parameter, Tensor | None] = {lu.lower: lower, lu.upper: upper, lu.log_diag: None, lu.bias: None}
        return {p: v for p, v in out.items() if p.requires_grad}


def _kernel_sq_norms(layer: LULinear, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor] | None:
    """The squared norms from the fused CPU kernel (``cpu_kernels.lu_sq_norms``), or None where
    it does not apply (not on the CPU, mixed dtypes)."""
    parts = [split_backprops(c.backprops) for c in calls]
    g = [gz for gz, _ in parts]
    x = [c.activations[0] for c in calls]
    gld = [None if ld is None else ld.to(g[0].dtype) for _, ld in parts]
    if not cpu_kernels.usable(*x, *g):
        return None
    sq = cpu_kernels.lu_sq_norms(x, g, gld, layer)
    columns = {layer.lower: 0, layer.upper: 1, layer.log_diag: 2, layer.bias: 3}
    return {p: sq[:, col] for p, col in columns.items() if p.requires_grad}


def _example_weighted_sum(
    layer: LULinear, calls: Sequence[Call], weights: dict[nn.Parameter, Tensor]
) -> dict[nn.Parameter, Tensor]:
    """sum_n w_n grad_n for weights per example [n], from one d x d product per call: with
    S = sum_u sum_n w_n h_un x_un^T (h = P^T g), eq. (3) summed over the examples is
    tril(S U^T) for L, triu(L^T S) for U and diag(L^T S) * exp(log_diag) for log_diag (plus
    the weighted dL/dlogdet), so h, U x and L^T h are never formed per example."""
    parts = [split_backprops(c.backprops) for c in calls]
    dtype = parts[0][0].dtype
    out: dict[nn.Parameter, Tensor] = {}
    s: dict[int, Tensor] = {}

    def outer(weight: Tensor) -> Tensor:
        """S for this weight, once per weight tensor (flat and per-layer clipping pass one
        tensor for every parameter)."""
        key = id(weight)
        if key not in s:
            acc = None
            for (g, _), c in zip(parts, calls, strict=True):
                part = (g * weight.to(dtype)[:, None]).T @ c.activations[0].to(dtype)
                acc = part if acc is None else acc.add_(part)
            assert acc is not None
            s[key] = acc[layer.inv_perm.to(acc.device)]
        return s[key]

    upper = layer.upper_matrix().to(dtype)
    if layer.lower.requires_grad:
        out[layer.lower] = torch.tril(outer(weights[layer.lower]) @ upper.T, -1)
    if layer.upper.requires_grad or layer.log_diag.requires_grad:
        lower_t = layer.lower_matrix().to(dtype).T
        used = (weights.get(layer.upper), weights.get(layer.log_diag))
        lts = {id(w): lower_t @ outer(w) for w in used if w is not None}
        if layer.upper.requires_grad:
            out[layer.upper] = torch.triu(lts[id(weights[layer.upper])], 1)
        if layer.log_diag.requires_grad:
            wd = weights[layer.log_diag].to(dtype)
            diag = lts[id(weights[layer.log_diag])].diagonal() * upper.diagonal()  # exp(log_diag)
            lds = [ld for _, ld in parts if ld is not None]
            out[layer.log_diag] = diag + sum(wd @ ld.reshape(-1).to(dtype) for ld in lds) if lds else diag
    if layer.bias.requires_grad:
        wb = weights[layer.bias].to(dtype)
        out[layer.bias] = call_sum([wb @ g for g, _ in parts])
    return out


@functools.cache
def _triangles(d: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Flat indices into [d, d] of the strict lower and upper triangles (asked for every step)."""
    rows, cols = torch.arange(d, device=device)[:, None], torch.arange(d, device=device)[None, :]
    flat = torch.arange(d * d, device=device).reshape(d, d)
    return flat[rows > cols], flat[rows < cols]


register_ghost(LULinear)(LUGhost)
