"""Fused CPU kernels (numba) for the per-example work that torch can only do in many passes.

Two parts of the DP step need entries of per-example gradients, not just their norms:
per-unit clipping's row L1 norms of a layer called several times (the MADE shared by the
DP-HFlow blocks) and stochastic sparsification's operator T (DP-HFlow, "Fine-grained
Gradient Clipping"). In torch both materialise G_n = sum_u g_{u,n} a_{u,n}^T with a batched
product whose inner dimension is the number of calls (4), then take abs, compare, maximum,
multiply, copysign and norm, each a pass over every entry (benchmarks/results/dp_step.md:
most of the per-unit and sparsified steps). Here each row of G_n is formed once in a small
buffer that stays in L1 cache and reduced or transformed in the same loop.

Two more take squared norms by the Gram trick where torch would need a pass per small
operation: a masked layer's along its staircase (``masked_sq_norms``), an LULinear's
(``lu_sq_norms``, DP-HFlow eq. 3) in one pass per example.

The kernels compute exactly what the torch code computes, up to float rounding (the tests
compare them with the torch reference and with torch.func per-example gradients). Rows are
given in the staircase column order of a nesting mask (``grad_samplers.linear``): row r of
the layer sees the first ``lengths[r]`` columns, so its free entries are a contiguous run.
Kernels release the GIL; ``over_examples`` splits the examples between torch's intra-op
threads. The numba code is ``_numba_kernels``, imported on first use, compiled then and cached
on disk (numba's cache; in memory when no cache directory is writable). CPU only: on CUDA
the torch code runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from privflow.models.layers import LULinear

_MIN_EXAMPLES_PER_THREAD = 64


def usable(*tensors: Tensor) -> bool:
    """The kernels apply: every tensor on the CPU, float32 or float64, the same dtype."""
    dtype = tensors[0].dtype
    return all(t.device.type == "cpu" and t.dtype == dtype for t in tensors) and dtype in (torch.float32, torch.float64)


def _kernels() -> Any:
    """The numba module, imported on first use (numba's import costs a quarter second that a
    run which never clips per unit or sparsifies on the CPU need not pay)."""
    from privflow.privacy.dpsgd import _numba_kernels

    return _numba_kernels


def example_slices(n: int) -> list[slice]:
    """The n examples split between torch's intra-op threads, at least
    ``_MIN_EXAMPLES_PER_THREAD`` examples a thread."""
    threads = max(1, min(torch.get_num_threads(), n // _MIN_EXAMPLES_PER_THREAD))
    size = max(1, math.ceil(n / threads))
    return [slice(i, min(n, i + size)) for i in range(0, n, size)] or [slice(0, 0)]


def over(parts: int, run: Callable[[int], None]) -> None:
    """run(0), ..., run(parts - 1), on as many threads (the kernels release the GIL)."""
    if parts == 1:
        run(0)
        return
    list(_pool(parts).map(run, range(parts)))


def over_examples(n: int, run: Callable[[slice], None]) -> None:
    """run(sl) over ``example_slices(n)``, one thread each."""
    slices = example_slices(n)
    over(len(slices), lambda part: run(slices[part]))


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept for the process (a step calls the kernels per layer)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="privflow-kernels")


# a forked child (a process task runner) inherits the pools without their threads: new ones
os.register_at_fork(after_in_child=_pool.cache_clear)


def masked_row_stats(a: Tensor, g: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Row L1 norms and squared norms [n, rows] of G_n = sum_u g_{u,n} a_{u,n}^T restricted to
    each row's column prefix: a [n, calls, cols] (staircase column order; each example's
    block contiguous, so the column loop vectorises), g [calls, n, rows] (a view is read in
    place: stacking the calls last would cost more than the kernel saves), lengths [rows]
    (int64)."""
    a_np, g_np, len_np = a.contiguous().numpy(), g.numpy(), lengths.numpy()
    l1 = np.empty(g_np.shape[1:], dtype=a_np.dtype)
    sq = np.empty_like(l1)
    kernel = _kernels().masked(a_np.shape[1]).row_stats
    over_examples(a_np.shape[0], lambda sl: kernel(a_np[sl], g_np[:, sl], len_np, l1[sl], sq[sl]))
    return torch.from_numpy(l1), torch.from_numpy(sq)


def masked_free_rows(a: Tensor, g: Tensor, lengths: Tensor, order: Tensor, bias: bool = False) -> Tensor:
    """The free entries of G_n [n, sum lengths (+ rows)]: rows in ``order``, each its column
    prefix (same arguments as ``masked_row_stats``), then with ``bias`` the bias gradient
    sum_u g_{u,n} (one row of entries per example, in row order)."""
    a_np, g_np, len_np, ord_np = a.contiguous().numpy(), g.numpy(), lengths.numpy(), order.numpy()
    out = np.empty((a_np.shape[0], _free_count(len_np, g_np, bias)), dtype=a_np.dtype)
    kernel = _kernels().masked(a_np.shape[1]).free_rows
    over_examples(a_np.shape[0], lambda sl: kernel(a_np[sl], g_np[:, sl], len_np, ord_np, bias, out[sl]))
    return torch.from_numpy(out)


def sparsify_clip_sum_(v: Tensor, tau: Tensor, gamma: Tensor, clip: float) -> Tensor:
    """sum_i clip_C(T(v_i)) [m] over the rows of v [n, m], which are overwritten with T(v_i):
    ``sparsify.sparsify_clipped_sum`` after its threshold, in one pass per row. tau [n] as
    ``sparsify.threshold`` selects it (numpy's selection: faster than numba's on the many
    ties of a gradient's zeros), gamma [n] already clamped to (0, 1]; the clip factor is
    ``_base.factor``'s min(1, C / norm)."""
    v_np = v.numpy()
    tau_np = tau.reshape(-1).to(v.dtype).contiguous().numpy()
    gamma_np = gamma.reshape(-1).contiguous().numpy()
    kernel = _kernels().sparsify_clip_sum
    return _summed(v_np.shape, v_np.dtype, lambda sl, out: kernel(v_np[sl], tau_np[sl], gamma_np[sl], float(clip), out))


def masked_sq_norms(a: Sequence[Tensor], g: Sequence[Tensor], cols: Tensor | None, lengths: Tensor) -> Tensor:
    """Squared norms [n] of G_n = sum_u g_{u,n} a_{u,n}^T on the rows' prefixes, by the Gram
    trick along the staircase: per example, the calls' Gram matrix of the first k columns for
    every k, then each row's g_r^T Gram g_r at its prefix length (about J (J + 1) / 2 (in + out)
    products an example, where forming G_n costs J (free entries)). a, g: each call's
    activations [n, in] and output gradients [n, out], read where they lie (stacking them
    cost more than the kernel); cols [in]: the staircase column order (None: as is)."""
    a_np, g_np = _arrays(a), _arrays(g)
    n_in = a_np[0].shape[1]
    cols_np = np.arange(n_in, dtype=np.int64) if cols is None else cols.to(torch.int64).numpy()
    len_np = lengths.to(torch.int64).numpy()
    out = np.empty(a_np[0].shape[0], dtype=a_np[0].dtype)
    kernel = _kernels().masked(len(a_np)).sq_norms
    over_examples(
        out.shape[0],
        lambda sl: kernel(_rows(a_np, sl), _rows(g_np, sl), cols_np, len_np, out[sl]),
    )
    return torch.from_numpy(out)


def masked_entries(a: Tensor, g: Tensor, rows: Tensor, ks: Tensor, bias_rows: Tensor) -> Tensor:
    """Entries [n, S + B] of G_n (same a, g as ``masked_row_stats``): the weight entries at rows
    ``rows`` and prefix positions ``ks`` [S], then the bias entries of rows ``bias_rows`` [B]
    (torch's index_select on a last dimension costs several times more)."""
    a_np, g_np = a.contiguous().numpy(), g.numpy()
    r_np, k_np, b_np = (t.to(torch.int64).contiguous().numpy() for t in (rows, ks, bias_rows))
    out = np.empty((a_np.shape[0], r_np.shape[0] + b_np.shape[0]), dtype=a_np.dtype)
    kernel = _kernels().masked(a_np.shape[1]).entries
    over_examples(a_np.shape[0], lambda sl: kernel(a_np[sl], g_np[:, sl], r_np, k_np, b_np, out[sl]))
    return torch.from_numpy(out)


def masked_sparsify_sum(
    a: Tensor, g: Tensor, lengths: Tensor, order: Tensor, bias: bool, tau: Tensor, gamma: Tensor, clip: float
) -> Tensor:
    """sum_i clip_C(T(v_i)) [m] over the examples' free entries v_i (``masked_free_rows``'s,
    same arguments), never storing them: each example's entries are formed in a buffer that
    stays in cache, sparsified, clipped and added. tau [n] must come before (from entries
    at sampled positions, ``sparsify.threshold``); gamma as in ``sparsify_clip_sum_``."""
    a_np, g_np, len_np, ord_np = a.contiguous().numpy(), g.numpy(), lengths.numpy(), order.numpy()
    tau_np = tau.reshape(-1).to(a.dtype).contiguous().numpy()
    gamma_np = gamma.reshape(-1).contiguous().numpy()
    m = _free_count(len_np, g_np, bias)
    kernel = _kernels().masked(a_np.shape[1]).sparsify_sum
    return _summed(
        (a_np.shape[0], m),
        a_np.dtype,
        lambda sl, out: kernel(a_np[sl], g_np[:, sl], len_np, ord_np, bias, tau_np[sl], gamma_np[sl], float(clip), out),
    )


def _free_count(lengths: np.ndarray, g: np.ndarray, bias: bool) -> int:
    """Free entries per example: every row's prefix (``order`` is a permutation of the rows),
    then one bias entry per row."""
    return int(lengths.sum()) + (g.shape[2] if bias else 0)


def _summed(shape: tuple[int, ...], dtype: np.dtype, run: Callable[[slice, np.ndarray], None]) -> Tensor:
    """A sum [m] over n examples (shape (n, m)): run(sl, out) adds examples sl into out, one
    accumulator per thread, added at the end."""
    n, m = shape
    slices = example_slices(n)
    out = np.zeros((len(slices), m), dtype=dtype)
    over(len(slices), lambda part: run(slices[part], out[part]))
    return torch.from_numpy(out.sum(0) if len(slices) > 1 else out[0])


def lu_sq_norms(x: Sequence[Tensor], g: Sequence[Tensor], gld: Sequence[Tensor | None], layer: LULinear) -> Tensor:
    """Squared norms [n, 4] of an LULinear's per-example gradients (lower, upper, log_diag,
    bias; ``grad_samplers.lu_linear``'s eq. 3) summed over its calls, in one pass per
    example: h = P^T g, U x and L^T h are formed in a small buffer and the triangles' norms
    taken by running Gram sums (the torch code needs some forty small operations per layer,
    most of the time of a layer of this size). x, g: each call's inputs and output gradients
    [n, d]; gld: each call's dL/dlogdet [n] (None: it does not reach the loss); L and U are
    built from the layer's parameters inside the kernel."""
    x_np, g_np = _arrays(x), _arrays(g)
    n, dtype = g_np[0].shape[0], g_np[0].dtype
    ld_np = tuple(np.zeros(n, dtype=dtype) if t is None else np.ascontiguousarray(t.reshape(n).numpy()) for t in gld)
    lower, upper, log_diag = (p.detach().to(g[0].dtype).numpy() for p in (layer.lower, layer.upper, layer.log_diag))
    perm = layer.inv_perm.numpy()
    out = np.empty((n, 4), dtype=dtype)
    kernel = _kernels().lu_sq_norms(len(x_np))
    over_examples(
        n,
        lambda sl: kernel(_rows(x_np, sl), _rows(g_np, sl), _rows(ld_np, sl), lower, upper, log_diag, perm, out[sl]),
    )
    return torch.from_numpy(out)


def _arrays(ts: Sequence[Tensor]) -> tuple[np.ndarray, ...]:
    """Each call's tensor as a C-contiguous array (a view where it already is one): a
    homogeneous tuple, which the kernels index by call."""
    return tuple(np.ascontiguousarray(t.numpy()) for t in ts)


def _rows(arrays: tuple[np.ndarray, ...], sl: slice) -> tuple[np.ndarray, ...]:
    """The examples ``sl`` of every call's array."""
    return tuple(t[sl] for t in arrays)
