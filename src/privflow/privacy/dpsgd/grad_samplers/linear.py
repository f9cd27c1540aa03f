"""Fast clipping ops for linear layers y = x W^T + b, optionally with a fixed mask (W * M).

Per-example weight gradient of a layer called J times in one forward (the MADE shared by
all DP-HFlow blocks): G_n = (sum_u g_{u,n} a_{u,n}^T) * M. Its squared norm never needs G_n
(fast gradient clipping, Lee & Kifer 2021; Gram trick for repeated calls):

    ||G_n||^2 = sum_{u,v} (g_u * g_v)^T M (a_u * a_v)        (elementwise products, per n)

which for M = 1 is sum_{u,v} (a_u . a_v)(g_u . g_v). On the CPU, rows that see column
prefixes (below) take it along the staircase in a kernel (``cpu_kernels.masked_sq_norms``).
Elsewhere: a MADE mask has few distinct rows
(one per degree), so M (a_u * a_v) is computed on the distinct rows only, and g_u * g_v is
summed within each group of equal rows (a reshape when the groups are runs of rows, as in
MADE's feature-major output layer). The clipped sum sum_n w_n G_n is one matrix product
(sum_u (w * g_u)^T a_u) * M.

Per-row L1 norms (per-unit clipping) of a layer called several times, and the entries that
stochastic sparsification selects from, need G_n itself. A MADE mask's distinct rows are
nested (a unit of degree m sees every input of degree < m), so with the columns in a
"staircase" order every row sees a prefix of them: G_n's free entries are those prefixes
(about half of the dense entries). On the CPU they are formed row by row in a fused kernel
(``privacy.dpsgd.cpu_kernels``), which reduces them in the same loop for the row norms; elsewhere
group by group, one batched product per group of equal rows.
nn.Linear's grad sampler is opacus' own; MaskedLinear's is in ``masked_linear.py``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from privflow.privacy.dpsgd import cpu_kernels
from privflow.privacy.dpsgd.grad_samplers._common import (
    StepMemo,
    call_sum,
    examples_per_chunk,
    flat_select,
    single_tensor_calls,
    split_backprops,
    step_key,
)
from privflow.privacy.dpsgd.grad_samplers.registry import Call, register_ghost

if TYPE_CHECKING:

    class _Linear(nn.Module):
        """The layers ``LinearGhost`` is asked about (nn.Linear; MaskedLinear through its subclass) as
        their parameters are: torch types nn.Linear.weight as a Tensor, but both hold Parameters."""

        weight: nn.Parameter
        bias: nn.Parameter | None


_CHUNK_ELEMENTS = 1 << 20  # per-example gradient entries per chunk: small chunks stay in cache and
# reuse freed memory (a fresh large tensor costs more in page faults than its arithmetic)
_STAIRCASE_MIN_ROWS = 8  # rows per group of equal mask rows from which products go group by group


@dataclass(frozen=True, eq=False)
class Prefixes:
    """A weight whose every row's free entries are a prefix of one column order (no mask, or a
    mask whose rows nest): what the fused CPU kernels read (``cpu_kernels``).

    cols [in]: that column order (None: as is); lengths [out]: each row's prefix length;
    order [out]: the rows in ``free_index``'s order (free entries row by row in this order)."""

    cols: Tensor | None
    lengths: Tensor
    order: Tensor

    @functools.cached_property
    def coords(self) -> tuple[Tensor, Tensor]:
        """Row and prefix position of each free entry, in ``order``."""
        run = self.lengths[self.order]
        rows = self.order.repeat_interleave(run)
        starts = torch.cumsum(run, 0) - run
        return rows, torch.arange(rows.numel(), device=rows.device) - starts.repeat_interleave(run)


@functools.cache
def _dense_prefixes(rows: int, cols: int, device: torch.device) -> Prefixes:
    """An unmasked [rows, cols] weight: every row sees every column."""
    return Prefixes(None, torch.full((rows,), cols, dtype=torch.long, device=device), torch.arange(rows, device=device))


@dataclass(frozen=True, eq=False)
class MaskLayout:
    """A fixed mask [out, in] grouped by its distinct rows, and its staircase when they nest.

    rows [k, in]: the distinct rows, in the order ``group_sum`` returns the groups;
    inverse [out]: each output row's group; onehot [out, k] the same as a matrix;
    run: s when the groups are consecutive runs of s output rows (else 0);
    members: the output rows of each group; cols [in]: a column order in which every group
    sees a prefix (None when the rows do not nest); lengths: each group's prefix length;
    back [out]: puts per-row results back in row order from the groups' order (groups with an
    empty prefix last); prefixes: the rows' prefixes, group by group (None when the rows do
    not nest).
    """

    rows: Tensor
    inverse: Tensor
    onehot: Tensor
    run: int
    members: tuple[Tensor, ...]
    cols: Tensor | None
    lengths: tuple[int, ...]
    back: Tensor | None
    prefixes: Prefixes | None

    def group_sum(self, t: Tensor) -> Tensor:
        """[n, out] -> [n, k]: t summed within each group of equal mask rows."""
        if self.run:
            return t.reshape(t.shape[0], -1, self.run).sum(2)
        return t @ self.onehot.to(t.dtype)

    @functools.cached_property
    def free_index(self) -> Tensor:
        """Flat indices (into [out, in]) of the free entries, group by group, each group's rows
        times its prefix of ``cols`` (row-major within the group); computed once."""
        assert self.cols is not None
        n_in = self.rows.shape[1]
        parts = [
            (r[:, None] * n_in + self.cols[None, :m]).reshape(-1)
            for r, m in zip(self.members, self.lengths, strict=True)
        ]
        return torch.cat(parts)


_LAYOUTS: weakref.WeakKeyDictionary[nn.Module, tuple[Tensor, MaskLayout]] = weakref.WeakKeyDictionary()


def _run_length(inverse: Tensor, k: int) -> int:
    """s when output row i belongs to group i // s (after renumbering), else 0."""
    out = inverse.numel()
    if k == 0 or out % k:
        return 0
    runs = inverse.reshape(k, out // k)
    same = bool((runs == runs[:, :1]).all()) and runs[:, 0].unique().numel() == k
    return out // k if same else 0


def _staircase(rows: Tensor) -> tuple[Tensor, tuple[int, ...]] | None:
    """Column order (most-seen columns first) in which every distinct row is a prefix, and the
    prefix lengths; None when the rows do not nest."""
    cols = torch.argsort(rows.sum(0), descending=True, stable=True)
    ordered = rows[:, cols]
    lengths = ordered.sum(1).long()
    prefix = torch.arange(rows.shape[1], device=rows.device)[None, :] < lengths[:, None]
    if not bool((ordered == prefix.to(ordered.dtype)).all()):
        return None
    return cols, tuple(int(v) for v in lengths)


def mask_layout(layer: nn.Module, mask: Tensor) -> MaskLayout:
    """The layout of ``mask`` (cached per layer and mask)."""
    cached = _LAYOUTS.get(layer)
    if cached is not None and cached[0] is mask:
        return cached[1]
    rows, inverse = torch.unique(mask, dim=0, return_inverse=True)
    k = rows.shape[0]
    run = _run_length(inverse, k)
    if run:  # number the groups in the order of their runs, so a reshape sums them
        first = inverse[::run]
        rows, inverse = rows[first], torch.arange(k, device=mask.device).repeat_interleave(run)
    onehot = torch.nn.functional.one_hot(inverse, k).to(mask.dtype)
    members = tuple((inverse == c).nonzero().squeeze(1) for c in range(k))
    stair = _staircase(rows)
    cols, lengths = stair if stair is not None else (None, ())
    back = None
    if stair is not None:
        full = [m for m, length in zip(members, lengths, strict=True) if length]
        empty = [m for m, length in zip(members, lengths, strict=True) if not length]
        back = torch.argsort(torch.cat(full + empty))
    prefixes = None
    if stair is not None:
        row_lengths = torch.tensor(lengths, dtype=torch.long, device=mask.device)[inverse]
        prefixes = Prefixes(cols, row_lengths, torch.cat(members))
    layout = MaskLayout(rows, inverse, onehot, run, members, cols, lengths, back, prefixes)
    _LAYOUTS[layer] = (mask, layout)
    return layout


class LinearGhost:
    """Ghost norms / weighted sums for a linear layer; subclasses supply the mask."""

    def __init__(self) -> None:
        self._memo: StepMemo[tuple[Tensor, Tensor]] = StepMemo()
        self._kernel_memo: StepMemo[tuple[Tensor, Tensor]] = StepMemo()

    def mask(self, layer: nn.Module) -> Tensor | None:
        return None

    def applicable(self, layer: nn.Module, calls: Sequence[Call]) -> bool:
        return single_tensor_calls(calls)

    def _stack(self, layer: nn.Module, calls: Sequence[Call]) -> tuple[Tensor, Tensor]:
        """Activations and output gradients of all calls stacked: [J, n, in], [J, n, out]
        (kept for the step, ``StepMemo``)."""

        def stack() -> tuple[Tensor, Tensor]:
            a, g = _per_call(calls)
            return torch.stack(a), torch.stack(g)

        return self._memo.get(layer, step_key(calls), stack)

    def sq_norms(self, layer: _Linear, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        a, g = _per_call(calls)
        out: dict[nn.Parameter, Tensor] = {}
        if layer.weight.requires_grad:
            mask = self.mask(layer)
            prefixes = self._prefixes(layer) if cpu_kernels.usable(*a, *g) else None
            layout = mask_layout(layer, mask) if mask is not None and prefixes is None else None
            if prefixes is not None:
                out[layer.weight] = cpu_kernels.masked_sq_norms(a, g, prefixes.cols, prefixes.lengths)
            elif layout is None:
                a_s, g_s = self._stack(layer, calls)
                ka = torch.einsum("uni,vni->nuv", a_s, a_s)
                kg = torch.einsum("uni,vni->nuv", g_s, g_s)
                out[layer.weight] = (ka * kg).sum((1, 2))
            else:
                out[layer.weight] = _masked_gram(a, g, layout)
        if layer.bias is not None and layer.bias.requires_grad:
            b = call_sum(g)
            out[layer.bias] = (b * b).sum(1)
        return out

    def materialise(self, layer: _Linear, calls: Sequence[Call], sl: slice | None = None) -> dict[nn.Parameter, Tensor]:
        """Per-example gradients [c, *shape] of examples ``sl``, summed over the calls."""
        a, g = self._stack(layer, calls)
        if sl is not None:
            a, g = a[:, sl], g[:, sl]
        out: dict[nn.Parameter, Tensor] = {}
        if layer.weight.requires_grad:
            out[layer.weight] = _outer_sum(a, g, self.mask(layer))
        if layer.bias is not None and layer.bias.requires_grad:
            out[layer.bias] = g.sum(0)
        return out

    def _layout(self, layer: nn.Module) -> MaskLayout | None:
        """The staircase layout of the layer's mask when it pays: None without a mask, with rows
        that do not nest, or with small groups of rows (one batched product per group costs
        about as much as the dense one at a few rows per group)."""
        mask = self.mask(layer)
        if mask is None:
            return None
        layout = mask_layout(layer, mask)
        if layout.cols is None or mask.shape[0] < _STAIRCASE_MIN_ROWS * len(layout.members):
            return None
        return layout

    def _prefixes(self, layer: nn.Module) -> Prefixes | None:
        """The weight's row prefixes (``Prefixes``), or None when its mask's rows do not nest."""
        mask = self.mask(layer)
        if mask is None:
            weight = cast(Tensor, layer.weight)
            rows, cols = weight.shape
            return _dense_prefixes(rows, cols, weight.device)
        return mask_layout(layer, mask).prefixes

    def _kernel_inputs(self, layer: nn.Module, calls: Sequence[Call]) -> tuple[Tensor, Tensor, Prefixes] | None:
        """The fused CPU kernels' arguments (``cpu_kernels``) for the whole batch: activations
        in prefix column order [n, J, in], output gradients [J, n, out] (kept for the step;
        a chunk of examples is a slice) and the row prefixes; None where the kernels do not
        apply (not on the CPU, rows that do not nest)."""
        prefixes = self._prefixes(layer)
        if prefixes is None:
            return None
        a, g = _per_call(calls)
        if not cpu_kernels.usable(*a, *g):
            return None
        cols = prefixes.cols

        def stack() -> tuple[Tensor, Tensor]:
            return torch.stack([x if cols is None else x.index_select(1, cols) for x in a], 1), torch.stack(g)

        a_k, g_k = self._kernel_memo.get(layer, step_key(calls), stack)
        return a_k, g_k, prefixes

    def sampled_entries(self, layer: nn.Module, calls: Sequence[Call], positions: Tensor) -> Tensor | None:
        """The per-example gradient entries [n, S] at ``positions`` of the free entries
        (``free_index``'s order, the bias after the weight), without forming the others:
        what sparsification's threshold is estimated from. None where the CPU kernels do
        not apply (``sparsified_sum`` goes with it)."""
        kernel = self._kernel_inputs(layer, calls) if layer.weight.requires_grad else None
        if kernel is None:
            return None
        a_k, g_k, prefixes = kernel
        rows, ks = prefixes.coords
        weight = positions[positions < rows.numel()]
        bias = positions[positions >= rows.numel()] - rows.numel()  # empty without a trainable bias
        return cpu_kernels.masked_entries(a_k, g_k, rows[weight], ks[weight], bias)

    def sparsified_sum(self, layer: _Linear, calls: Sequence[Call], tau: Tensor, gamma: Tensor, clip: float) -> Tensor:
        """sum_i clip_C(T_{tau_i, gamma_i}(v_i)) over the examples' free entries (the layout of
        ``free_entries``), in the fused CPU kernel: no per-example gradient is stored."""
        kernel = self._kernel_inputs(layer, calls)
        assert kernel is not None, "sampled_entries said the kernels apply"
        a_k, g_k, prefixes = kernel
        bias = layer.bias is not None and layer.bias.requires_grad
        return cpu_kernels.masked_sparsify_sum(a_k, g_k, prefixes.lengths, prefixes.order, bias, tau, gamma, clip)

    def free_index(self, layer: _Linear) -> dict[nn.Parameter, Tensor | None]:
        """Flat indices of the entries ``free_entries`` returns (None: all, row-major)."""
        out: dict[nn.Parameter, Tensor | None] = {}
        if layer.weight.requires_grad:
            mask = self.mask(layer)
            layout = mask_layout(layer, mask) if mask is not None else None
            if layout is not None and layout.cols is not None:
                out[layer.weight] = layout.free_index
            elif mask is not None:
                out[layer.weight] = (mask.reshape(-1) != 0).nonzero().squeeze(1)
            else:
                out[layer.weight] = None
        if layer.bias is not None and layer.bias.requires_grad:
            out[layer.bias] = None
        return out

    def free_entries(self, layer: _Linear, calls: Sequence[Call], sl: slice) -> Tensor:
        """Per-example gradient entries that can be non-zero, [c, m], the trainable parameters'
        (weight, bias) in turn, each in the order of ``free_index``: group by group on the
        staircase, never forming the masked entries, and one copy into the result (on the
        CPU the fused kernel writes them in place)."""
        has_bias = layer.bias is not None and layer.bias.requires_grad
        kernel = self._kernel_inputs(layer, calls) if layer.weight.requires_grad else None
        if kernel is not None:
            a_k, g_k, prefixes = kernel
            return cpu_kernels.masked_free_rows(a_k[sl], g_k[:, sl], prefixes.lengths, prefixes.order, bias=has_bias)
        layout = self._layout(layer)
        if layout is None:
            full = self.materialise(layer, calls, sl)
            idx = self.free_index(layer)
            return torch.cat([flat_select(v, idx[p]) for p, v in full.items()], 1)
        a, g = self._stack(layer, calls)
        a, g = a[:, sl], g[:, sl]
        parts = []
        if layer.weight.requires_grad:
            assert layout is not None
            parts += [w.reshape(w.shape[0], -1) for w in _staircase_slabs(a, g, layout)]
        if layer.bias is not None and layer.bias.requires_grad:
            parts.append(g.sum(0))
        return torch.cat(parts, 1)

    def unit_stats(self, layer: _Linear, calls: Sequence[Call]) -> dict[nn.Parameter, tuple[Tensor, Tensor]] | None:
        a, g = _per_call(calls)
        out: dict[nn.Parameter, tuple[Tensor, Tensor]] = {}
        if layer.weight.requires_grad:
            mask = self.mask(layer)
            if len(calls) > 1:
                out[layer.weight] = self._materialised_row_stats(layer, calls)
            else:
                a0, g0 = a[0], g[0]
                if mask is None:
                    l1 = g0.abs() * a0.abs().sum(1, keepdim=True)
                    sq = g0 * g0 * (a0 * a0).sum(1, keepdim=True)
                else:
                    layout = mask_layout(layer, mask)
                    rt, oh = layout.rows.to(a0.dtype).T, layout.onehot.to(a0.dtype).T
                    l1 = g0.abs() * ((a0.abs() @ rt) @ oh)
                    sq = g0 * g0 * (((a0 * a0) @ rt) @ oh)
                out[layer.weight] = (l1, sq)
        if layer.bias is not None and layer.bias.requires_grad:
            b = call_sum(g)
            out[layer.bias] = (b.abs(), b * b)
        return out

    def _materialised_row_stats(self, layer: _Linear, calls: Sequence[Call]) -> tuple[Tensor, Tensor]:
        """Row L1 norms and squared norms of a sum over calls: they need the per-example
        gradient, formed in chunks of examples (group by group on the staircase), keeping only
        the per-row reductions; on the CPU row by row in the fused kernel, never stored."""
        kernel = self._kernel_inputs(layer, calls)
        if kernel is not None:
            a_k, g_k, prefixes = kernel
            return cpu_kernels.masked_row_stats(a_k, g_k, prefixes.lengths)
        a, g = self._stack(layer, calls)
        n, rows = a.shape[1], g.shape[2]
        layout = self._layout(layer)
        if layout is None:
            size = examples_per_chunk(a.device, layer.weight.numel(), _CHUNK_ELEMENTS)
            l1s, sqs = [], []
            for i in range(0, n, size):
                w = _outer_sum(a[:, i : i + size], g[:, i : i + size], self.mask(layer))
                l1s.append(w.abs_().sum(2))  # in place: far faster here than vector_norm
                sqs.append(w.square_().sum(2))
            return torch.cat(l1s), torch.cat(sqs)
        assert layout.back is not None
        largest = max(m.numel() * length for m, length in zip(layout.members, layout.lengths, strict=True))
        size = examples_per_chunk(a.device, largest, _CHUNK_ELEMENTS)  # slabs are reduced one at a time
        l1s, sqs = [], []
        for i in range(0, n, size):
            parts_l1, parts_sq = [], []
            for w in _staircase_slabs(a[:, i : i + size], g[:, i : i + size], layout):
                w = w.abs_()
                parts_l1.append(w.sum(2))
                parts_sq.append(w.mul_(w).sum(2))
            zeros = a.new_zeros(parts_l1[0].shape[0], rows - sum(t.shape[1] for t in parts_l1))  # rows seeing no input
            l1s.append(torch.cat([*parts_l1, zeros], 1))
            sqs.append(torch.cat([*parts_sq, zeros], 1))
        return torch.cat(l1s)[:, layout.back], torch.cat(sqs)[:, layout.back]

    def weighted_sum(
        self, layer: _Linear, calls: Sequence[Call], weights: dict[nn.Parameter, Tensor]
    ) -> dict[nn.Parameter, Tensor]:
        """sum_n w_n G_n = (sum_u (w * g_u)^T a_u) * M, one product per call (no stacked copies).
        A weight per example scales the narrower side of each product."""
        a, g = _per_call(calls)
        out: dict[nn.Parameter, Tensor] = {}
        if layer.weight.requires_grad:
            w = weights[layer.weight]
            grad = None
            for a_u, g_u in zip(a, g, strict=True):
                if w.dim() == 1 and a_u.shape[1] < g_u.shape[1]:
                    lhs, rhs = g_u, a_u * w[:, None]
                else:
                    lhs, rhs = g_u * (w[:, None] if w.dim() == 1 else w), a_u
                grad = lhs.T @ rhs if grad is None else grad.addmm_(lhs.T, rhs)
            assert grad is not None
            mask = self.mask(layer)
            out[layer.weight] = grad.mul_(mask.to(grad.dtype)) if mask is not None else grad
        if layer.bias is not None and layer.bias.requires_grad:
            w, b = weights[layer.bias], call_sum(g)
            out[layer.bias] = w @ b if w.dim() == 1 else (b * w).sum(0)
        return out


def _per_call(calls: Sequence[Call]) -> tuple[list[Tensor], list[Tensor]]:
    """Each call's activations [n, in] (in the output gradients' dtype) and output gradients [n, out]."""
    g = [split_backprops(c.backprops)[0] for c in calls]
    return [c.activations[0].to(g[0].dtype) for c in calls], g


def _outer_sum(a: Tensor, g: Tensor, mask: Tensor | None) -> Tensor:
    """sum_u g_u a_u^T per example, masked: one batched product with inner dimension J
    ([c, out, J] @ [c, J, in]) instead of one per call."""
    w = torch.bmm(g.permute(1, 2, 0), a.transpose(0, 1))
    return w.mul_(mask.to(w.dtype)) if mask is not None else w


def _masked_gram(a: Sequence[Tensor], g: Sequence[Tensor], layout: MaskLayout) -> Tensor:
    """sum_{u,v} (g_u * g_v)^T M (a_u * a_v) per example, on the mask's distinct rows, from
    each call's activations [n, in] and output gradients [n, out]."""
    rt = layout.rows.to(a[0].dtype).T
    s = torch.zeros(a[0].shape[0], dtype=a[0].dtype, device=a[0].device)
    for u in range(len(a)):  # pairs u <= v, the others by symmetry; views, no index copies
        for v in range(u, len(a)):
            p = (a[u] * a[v]) @ rt  # [n, k]: M (a_u * a_v) on the distinct mask rows
            q = layout.group_sum(g[u] * g[v])  # [n, k]: g_u * g_v summed within each group of rows
            s.add_(torch.linalg.vecdot(p, q), alpha=1.0 if u == v else 2.0)
    return s


def _staircase_slabs(a: Tensor, g: Tensor, layout: MaskLayout) -> Iterator[Tensor]:
    """Per group of rows with a non-empty prefix, the free block of sum_u g_u a_u^T on the
    staircase columns, [c, rows, prefix]: one batched product per group."""
    assert layout.cols is not None
    a_s = a.index_select(2, layout.cols).permute(1, 0, 2)  # [c, J, in], staircase columns
    g_t = g.permute(1, 2, 0).contiguous()  # [c, out, J]; contiguous, or every selection copies it whole
    for members, length in zip(layout.members, layout.lengths, strict=True):
        if length:  # bmm takes a slow path on strided operands: both contiguous
            yield torch.bmm(g_t.index_select(1, members), a_s[:, :, :length].contiguous())


register_ghost(nn.Linear)(LinearGhost)
