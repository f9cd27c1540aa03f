"""Fused CPU kernels (numba) for the per-example work that torch can only do in many passes.

Two parts of the DP step need entries of per-example gradients, not just their norms:
per-unit clipping's row L1 norms of a layer called several times (the MADE shared by the
DP-HFlow blocks) and stochastic sparsification's operator T (DP-HFlow, "Fine-grained
Gradient Clipping"). In torch both materialise G_n = sum_u g_{u,n} a_{u,n}^T with a batched
product whose inner dimension is the number of calls (4), then take abs, compare, maximum,
multiply, copysign and norm, each a pass over every entry (benchmarks/results/dp_step.md:
most of the per-unit and sparsified steps). Here each row of G_n is formed once in a small
buffer that stays in L1 cache and reduced or transformed in the same loop.

The kernels compute exactly what the torch code computes, up to float rounding (the tests
compare them with the torch reference and with torch.func per-example gradients). Rows are
given in the staircase column order of a nesting mask (``grad_samplers.linear``): row r of
the layer sees the first ``lengths[r]`` columns, so its free entries are a contiguous run.
Kernels release the GIL; ``over_examples`` splits the examples between torch's intra-op
threads. Compiled on first use and cached on disk (numba's cache; in memory when no cache
directory is writable). CPU only: on CUDA the torch code runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

_MIN_EXAMPLES_PER_THREAD = 64


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """numba njit without fast-math's no-NaN / no-inf assumptions (only reassociation and
    contraction, which vectorise the reductions), cached on disk when a cache directory can
    be written."""
    import numba

    options: dict[str, Any] = {"nogil": True, "fastmath": {"reassoc", "contract", "nsz"}}
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # numba finds no writable cache location: compile per process
        return numba.njit(**options)(fn)


def usable(*tensors: Tensor) -> bool:
    """The kernels apply: every tensor on the CPU, float32 or float64, the same dtype."""
    dtype = tensors[0].dtype
    return all(t.device.type == "cpu" and t.dtype == dtype for t in tensors) and dtype in (torch.float32, torch.float64)


def _masked_row_stats(a, g, lengths, l1, sq):  # type: ignore[no-untyped-def]
    n, calls, cols = a.shape
    rows = g.shape[1]
    tmp = np.empty(cols, dtype=a.dtype)
    zero = np.zeros(1, dtype=a.dtype)[0]
    for i in range(n):
        for r in range(rows):
            length = lengths[r]
            c = g[i, r, 0]
            for k in range(length):
                tmp[k] = c * a[i, 0, k]
            for u in range(1, calls):
                c = g[i, r, u]
                for k in range(length):
                    tmp[k] += c * a[i, u, k]
            s1 = zero
            s2 = zero
            for k in range(length):
                v = tmp[k]
                s1 += abs(v)
                s2 += v * v
            l1[i, r] = s1
            sq[i, r] = s2


def _masked_free_rows(a, g, lengths, order, out):  # type: ignore[no-untyped-def]
    n, calls, _ = a.shape
    for i in range(n):
        pos = 0
        for r in order:
            length = lengths[r]
            o = out[i, pos : pos + length]
            c = g[i, r, 0]
            for k in range(length):
                o[k] = c * a[i, 0, k]
            for u in range(1, calls):
                c = g[i, r, u]
                for k in range(length):
                    o[k] += c * a[i, u, k]
            pos += length


def _sparsify_rows(v, tau, gamma, sq):  # type: ignore[no-untyped-def]
    n, m = v.shape
    zero = np.zeros(1, dtype=v.dtype)[0]
    for i in range(n):
        t = tau[i]
        low = t * gamma[i]
        row = v[i]
        s2 = zero
        for k in range(m):
            x = row[k]
            mag = abs(x)
            big = mag if mag > t else t
            w = math.copysign(big * (mag >= low), x)
            row[k] = w
            s2 += w * w
        sq[i] = s2


@cache
def _compiled(name: str) -> Callable[..., Any]:
    return _jit({"row_stats": _masked_row_stats, "free_rows": _masked_free_rows, "sparsify": _sparsify_rows}[name])


def over_examples(n: int, run: Callable[[slice], None]) -> None:
    """run(sl) over slices of the n examples: on torch's intra-op thread count, at least
    ``_MIN_EXAMPLES_PER_THREAD`` examples a thread (the kernels release the GIL)."""
    threads = max(1, min(torch.get_num_threads(), n // _MIN_EXAMPLES_PER_THREAD))
    if threads == 1:
        run(slice(0, n))
        return
    size = math.ceil(n / threads)
    list(_pool(threads).map(run, [slice(i, min(n, i + size)) for i in range(0, n, size)]))


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept for the process (a step calls the kernels per layer)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="privflow-kernels")


def masked_row_stats(a: Tensor, g: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Row L1 norms and squared norms [n, rows] of G_n = sum_u g_{u,n} a_{u,n}^T restricted to
    each row's column prefix: a [n, calls, cols] (staircase column order), g [n, rows, calls],
    lengths [rows] (int64)."""
    a_np, g_np, len_np = a.contiguous().numpy(), g.contiguous().numpy(), lengths.numpy()
    l1 = np.empty(g_np.shape[:2], dtype=a_np.dtype)
    sq = np.empty_like(l1)
    kernel = _compiled("row_stats")
    over_examples(a_np.shape[0], lambda sl: kernel(a_np[sl], g_np[sl], len_np, l1[sl], sq[sl]))
    return torch.from_numpy(l1), torch.from_numpy(sq)


def masked_free_rows(a: Tensor, g: Tensor, lengths: Tensor, order: Tensor, extra: int = 0) -> Tensor:
    """The free entries of G_n [n, sum lengths + extra]: rows in ``order``, each its column
    prefix (same arguments as ``masked_row_stats``), then ``extra`` columns left for the
    caller to fill (a bias: no second copy to join them)."""
    a_np, g_np, len_np, ord_np = a.contiguous().numpy(), g.contiguous().numpy(), lengths.numpy(), order.numpy()
    out = np.empty((a_np.shape[0], int(len_np[ord_np].sum()) + extra), dtype=a_np.dtype)
    kernel = _compiled("free_rows")
    over_examples(a_np.shape[0], lambda sl: kernel(a_np[sl], g_np[sl], len_np, ord_np, out[sl]))
    return torch.from_numpy(out)


def sparsify_rows_(v: Tensor, tau: Tensor, gamma: Tensor) -> Tensor:
    """T_{tau,gamma} in place on each row of v [n, m] (tau, gamma [n]; gamma already clamped
    to (0, 1]), returning the squared norms [n] of the results: ``sparsify.stochastic_sparsify``
    and its norm in one pass."""
    v_np = v.numpy()
    tau_np = tau.reshape(-1).contiguous().numpy()
    gamma_np = gamma.reshape(-1).contiguous().numpy()
    sq = np.empty(v_np.shape[0], dtype=v_np.dtype)
    kernel = _compiled("sparsify")
    over_examples(v_np.shape[0], lambda sl: kernel(v_np[sl], tau_np[sl], gamma_np[sl], sq[sl]))
    return torch.from_numpy(sq)
