"""Stochastic sparsification T_{tau,gamma} followed by per-layer clipping.

DP-HFlow, "Fine-grained Gradient Clipping" (operator of Ye et al. 2020): for a layer's
vectorised per-example gradient, tau is its k-th largest entry in absolute value with
k = m (1 - s) (m = the layer's free entries, s the sparsity), gamma ~ U[0, 1] (one draw per
example and layer), and

    T(x) = x                 if |x| > tau
         = sign(x) tau       if tau gamma <= |x| <= tau
         = 0                 if |x| < tau gamma,

which is unbiased: for |x| <= tau, P(|x| >= tau gamma) = |x| / tau. Then clip_{C_l}(T(g_l)).
Clipping after T keeps the bound ||clipped|| <= C_l, so noise calibrated to C is right.

tau on long rows (more than ``EXACT_ROW`` free entries) is estimated, not selected exactly: the
k-th largest is taken in proportion among ``THRESHOLD_SAMPLE`` of the row's free entries at
positions drawn uniformly without replacement from the step's generator, the same positions
for every example of the step (the threshold-by-sampling of Deep Gradient Compression, Lin et
al. 2018, Section 3). The exact selection is a pass over every per-example gradient entry and
was most of the sparsified step (benchmarks/results/dp_step.md). Neither property
above depends on tau being the exact k-th largest: T is unbiased for any tau > 0 fixed before
gamma is drawn, and the clip after T bounds the norm whatever tau is; only the share of
entries kept varies around 1 - s (standard error sqrt(s (1 - s) / THRESHOLD_SAMPLE), 3% here).
The positions are public randomness, independent of the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from privflow.privacy.dpsgd import cpu_kernels
from privflow.privacy.dpsgd.clipping._base import factor
from privflow.privacy.dpsgd.grad_samplers._common import flat_select


def sparsify_k(free_entries: int, sparsity: float) -> int:
    """k = m (1 - s), at least 1."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must lie in [0, 1), got {sparsity}")
    return max(1, int(math.ceil(free_entries * (1.0 - sparsity))))


THRESHOLD_SAMPLE = 256  # free entries of a long row that tau is estimated from
EXACT_ROW = 2 * THRESHOLD_SAMPLE  # free entries up to which tau is selected exactly (beyond, selecting
# among all of a row costs more than the rest of its sparsification; benchmarks/results/dp_step.md)
_SHORT_ROW = 1024  # entries: below, one vectorised partition beats a Python loop over rows (its per-row overhead)
_NEGATIVES: dict[tuple[int, np.dtype], np.ndarray] = {}


def kth_largest(a: Tensor, k: int) -> Tensor:
    """Row-wise k-th largest value of a [n, m] >= 0 as [n, 1].

    On CPU: numpy's introselect (linear time, much faster than torch.topk for k ~ m / 2).
    Exact zeros (a ReLU unit that is off, a row or column of a MADE block that gets no
    gradient) are many ties, on which introselect is much slower; they need no
    selecting: the k-th largest is 0 when fewer than k entries are positive, else it is the
    k-th largest positive entry. Long rows therefore select among their positive entries
    only, row by row; short rows (where the loop would cost more) in one call, the zeros
    given distinct negative stand-ins (below every positive entry; clamped back to 0).
    """
    m = a.shape[1]
    if a.device.type != "cpu":
        return torch.kthvalue(a, m - k + 1, dim=1, keepdim=True).values
    arr = a.detach().numpy()
    if m < _SHORT_ROW:
        zero = arr == 0
        work = np.where(zero, _negatives(m, arr.dtype), arr) if zero.any() else arr.copy()
        work.partition(m - k, axis=1)  # our own copy: in place
        return torch.from_numpy(np.maximum(work[:, m - k : m - k + 1], 0))
    nonzero = arr != 0
    counts = nonzero.sum(1).tolist()
    flat = arr[nonzero]  # our own copy, row by row: each row's segment is partitioned in place
    out = np.zeros(arr.shape[0], dtype=arr.dtype)
    start = 0
    for i, c in enumerate(counts):
        if c >= k:
            seg = flat[start : start + c]
            seg.partition(c - k)
            out[i] = seg[c - k]
        start += c
    return torch.from_numpy(out[:, None])


def _negatives(m: int, dtype: np.dtype) -> np.ndarray:
    """-1, -2, ..., -m (cached): distinct values below every absolute value."""
    key = (m, np.dtype(dtype))
    if key not in _NEGATIVES:
        _NEGATIVES[key] = -np.arange(1, m + 1, dtype=dtype)
    return _NEGATIVES[key]


def threshold_positions(m: int, generator: torch.Generator | None, device: torch.device) -> Tensor | None:
    """The free-entry positions tau is estimated from on a row of m free entries (module
    docstring), or None: exact selection (m <= EXACT_ROW)."""
    if m <= EXACT_ROW:
        return None
    gen_device = generator.device if generator is not None else device
    return torch.randperm(m, generator=generator, device=gen_device)[:THRESHOLD_SAMPLE].to(device)


def threshold(v: Tensor, k: int, positions: Tensor | None = None) -> Tensor:
    """tau [n, 1] of rows v [n, m]: the k-th largest |entry|, or with `positions` the |entry|
    of the same rank share among those positions (round(k S / m)-th largest of S; only
    those entries are read)."""
    if positions is None:
        return kth_largest(v.abs(), rank(k, v.shape[1]))
    return sampled_threshold(v.index_select(1, positions), k, v.shape[1])


def sampled_threshold(sample: Tensor, k: int, m: int) -> Tensor:
    """tau [n, 1] from the entries of rows of m at sampled positions, sample [n, S]
    (overwritten): the |entry| of the k-th largest's rank share (``rank``)."""
    return kth_largest(sample.abs_(), rank(k, m, sample.shape[1]))


def rank(k: int, m: int, sampled: int | None = None) -> int:
    """Which largest entry is tau: the k-th of a row of m, or the same share of ``sampled``
    positions (round(k S / m), at least 1)."""
    if sampled is None:
        return min(k, m)
    return min(sampled, max(1, round(k * sampled / m)))


def clamped_gamma(gamma: Tensor, like: Tensor) -> Tensor:
    """gamma as a column [n, 1] in like's dtype, clamped to [tiny, 1] (``stochastic_sparsify``)."""
    return gamma.reshape(-1, 1).to(like.dtype).clamp(min=torch.finfo(like.dtype).tiny, max=1.0)


def stochastic_sparsify(v: Tensor, k: int, gamma: Tensor, positions: Tensor | None = None) -> Tensor:
    """T_{tau,gamma} row by row: v [n, m], gamma [n] (uniform draws), tau = k-th largest |v_i|
    (estimated from `positions`, if given: ``threshold``).

    Written as sign(x) max(|x|, tau) [|x| >= tau gamma], which equals the three cases above
    (gamma <= 1, so |x| > tau always passes the indicator). gamma is clamped to at least the
    smallest positive float so that x = 0 is never rounded up to tau (a zero-probability draw).
    """
    tau = threshold(v, k, positions)
    g = clamped_gamma(gamma, v)
    a = v.abs()
    keep = torch.ge(a, tau * g, out=torch.empty_like(a))  # 1.0 / 0.0: faster than a bool mask
    torch.maximum(a, tau, out=a)
    a.mul_(keep)
    return a.copysign_(v)


def sparsify_clipped_sum(
    v: Tensor, k: int, gamma: Tensor, clip_threshold: float, positions: Tensor | None = None
) -> Tensor:
    """sum_i clip_C(T(v_i)) over the rows of v [n, m], as one matrix-vector product. v is
    overwritten: on the CPU T and the norms are one pass of a fused kernel over it
    (``cpu_kernels.sparsify_clip_sum_``, the sum included), elsewhere the torch operations above."""
    if cpu_kernels.usable(v) and v.is_contiguous():
        return cpu_kernels.sparsify_clip_sum_(v, threshold(v, k, positions), clamped_gamma(gamma, v), clip_threshold)
    t = stochastic_sparsify(v, k, gamma, positions)
    f = factor(torch.linalg.vector_norm(t, dim=1), clip_threshold)
    return f @ t


def clip_sparsify(
    grads: Sequence[Sequence[Tensor]],
    thresholds: Sequence[float],
    sparsity: float,
    gammas: Sequence[Tensor],
    positions: Sequence[Tensor | None] | None = None,
    free_index: Sequence[Sequence[Tensor | None]] | None = None,
) -> list[list[Tensor]]:
    """Sparsify each layer's materialised per-example gradient, then clip it to C_l.

    ``gammas[l]`` holds the layer's uniform draws, one per example ([n]); ``positions[l]`` the
    positions its tau is estimated from (``threshold_positions``; None: exact);
    ``free_index[l][j]`` the flat indices of parameter j's free entries (None: all): T works on
    the free entries only, in this order (the layout the fast path's positions refer to), and
    the structural zeros stay 0.
    """
    out = []
    for i, (layer, thr, gamma) in enumerate(zip(grads, thresholds, gammas, strict=True)):
        index = free_index[i] if free_index is not None else [None] * len(layer)
        flat = free_rows(layer, index)
        pos = positions[i] if positions is not None else None
        t = stochastic_sparsify(flat, sparsify_k(flat.shape[1], sparsity), gamma, pos)
        t = t * factor(t.norm(dim=1), thr)[:, None]
        out.append(from_free_rows(t, [g.shape[1:] for g in layer], index))
    return out


def free_rows(grads: Sequence[Tensor], index: Sequence[Tensor | None]) -> Tensor:
    """A layer's per-example gradients [n, *shape_j] -> [n, m]: each parameter's free entries
    (``index[j]``, None: all) in turn, the layout T and the tau positions work on."""
    return torch.cat([flat_select(g, idx) for g, idx in zip(grads, index, strict=True)], 1)


def from_free_rows(t: Tensor, shapes: Sequence[Sequence[int]], index: Sequence[Tensor | None]) -> list[Tensor]:
    """The inverse of ``free_rows``: t [r, m] -> one [r, *shape_j] per parameter, its
    structural zeros 0."""
    parts, start = [], 0
    for shape, idx in zip(shapes, index, strict=True):
        numel = math.prod(shape)
        size = numel if idx is None else idx.numel()
        piece = t[:, start : start + size]
        if idx is not None:
            piece = piece.new_zeros(t.shape[0], numel).index_copy_(1, idx, piece)
        parts.append(piece.reshape(t.shape[0], *shape))
        start += size
    return parts
