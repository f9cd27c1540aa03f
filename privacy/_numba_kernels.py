"""The numba code behind ``cpu_kernels`` (imported by it on first use; see there for what the
kernels compute and why).

Kernels for layers called J times are built per J by ``masked``: J is a closure constant of
the compiled code, so the loop over calls unrolls inside the loop over columns, each entry
of G_n is summed in registers and the column loop vectorises (half the time of a runtime J).
Numba keys its disk cache by the closure's values, which must therefore be plain numbers:
the shared row helpers are module globals, inlined where they are called.

Fast math is limited to reassociation and contraction (which vectorise the reductions):
no assumption that values are finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

import numba
import numpy as np

_OPTIONS: dict[str, Any] = {"nogil": True, "fastmath": {"reassoc", "contract", "nsz"}}


def _jit(fn: Callable[..., Any], **extra: Any) -> Callable[..., Any]:
    """numba.njit with ``_OPTIONS``, cached on disk when a cache directory can be written (in
    memory, compiled once per process, when none can)."""
    try:
        return numba.njit(cache=True, **_OPTIONS, **extra)(fn)
    except RuntimeError:  # numba finds no writable cache location
        return numba.njit(**_OPTIONS, **extra)(fn)


def _sparsify_row(row, t, gamma, clip, scale, out):  # type: ignore[no-untyped-def]
    """T_{t,gamma} in place on one example's entries, then out += clip_C(T(row)). ``scale`` is
    a one-entry scratch array: the clip factor rounded to the entries' dtype."""
    low = t * gamma
    s2 = np.zeros(1, dtype=row.dtype)[0]
    for k in range(row.shape[0]):
        x = row[k]
        mag = abs(x)
        big = mag if mag > t else t
        w = math.copysign(big * (mag >= low), x)
        row[k] = w
        s2 += w * w
    norm = math.sqrt(s2)
    scale[0] = clip / norm if norm > clip else 1.0
    f = scale[0]
    for k in range(row.shape[0]):
        out[k] += f * row[k]


def _fill(a, g, lengths, order, bias, i, calls, c, o):  # type: ignore[no-untyped-def]
    """o <- example i's free entries: rows in ``order``, each its prefix, then the bias
    sum_u g_u (rows in their own order). ``c``: scratch for a row's output gradients."""
    zero = np.zeros(1, dtype=a.dtype)[0]
    pos = 0
    for r in order:
        length = lengths[r]
        out = o[pos : pos + length]
        for u in range(calls):
            c[u] = g[u, i, r]  # a local, not re-read from g inside the column loop
        for k in range(length):
            v = zero
            for u in range(calls):
                v += c[u] * a[i, u, k]
            out[k] = v
        pos += length
    if bias:
        for r in range(g.shape[2]):
            v = zero
            for u in range(calls):
                v += g[u, i, r]
            o[pos + r] = v


sparsify_row = _jit(_sparsify_row, inline="always")
fill = _jit(_fill, inline="always")


def _sparsify_clip_sum(v, tau, gamma, clip, out):  # type: ignore[no-untyped-def]
    scale = np.empty(1, dtype=v.dtype)
    for i in range(v.shape[0]):
        sparsify_row(v[i], tau[i], gamma[i], clip, scale, out)


sparsify_clip_sum = _jit(_sparsify_clip_sum)


class MaskedKernels(NamedTuple):
    """The kernels for layers called a given number of times (arguments: the ``cpu_kernels``
    functions that call them)."""

    row_stats: Callable[..., Any]
    free_rows: Callable[..., Any]
    sparsify_sum: Callable[..., Any]
    entries: Callable[..., Any]
    sq_norms: Callable[..., Any]


@cache
def masked(calls: int) -> MaskedKernels:
    """The kernels for layers called ``calls`` times."""

    def row_stats(a, g, lengths, l1, sq):  # type: ignore[no-untyped-def]
        zero = np.zeros(1, dtype=a.dtype)[0]
        c = np.empty(calls, dtype=a.dtype)
        for i in range(a.shape[0]):
            for r in range(g.shape[2]):
                for u in range(calls):
                    c[u] = g[u, i, r]
                s1 = zero
                s2 = zero
                for k in range(lengths[r]):
                    v = zero
                    for u in range(calls):
                        v += c[u] * a[i, u, k]
                    s1 += abs(v)
                    s2 += v * v
                l1[i, r] = s1
                sq[i, r] = s2

    def free_rows(a, g, lengths, order, bias, out):  # type: ignore[no-untyped-def]
        c = np.empty(calls, dtype=a.dtype)
        for i in range(a.shape[0]):
            fill(a, g, lengths, order, bias, i, calls, c, out[i])

    def sparsify_sum(a, g, lengths, order, bias, tau, gamma, clip, out):  # type: ignore[no-untyped-def]
        c = np.empty(calls, dtype=a.dtype)
        row = np.empty(out.shape[0], dtype=a.dtype)  # one example's entries: stays in cache
        scale = np.empty(1, dtype=a.dtype)
        for i in range(a.shape[0]):
            fill(a, g, lengths, order, bias, i, calls, c, row)
            sparsify_row(row, tau[i], gamma[i], clip, scale, out)

    def entries(a, g, rows, ks, bias_rows, out):  # type: ignore[no-untyped-def]
        zero = np.zeros(1, dtype=a.dtype)[0]
        for i in range(a.shape[0]):
            for j in range(rows.shape[0]):
                v = zero
                for u in range(calls):
                    v += g[u, i, rows[j]] * a[i, u, ks[j]]
                out[i, j] = v
            for j in range(bias_rows.shape[0]):
                v = zero
                for u in range(calls):
                    v += g[u, i, bias_rows[j]]
                out[i, rows.shape[0] + j] = v

    def sq_norms(a, g, by_length, lengths, out):  # type: ignore[no-untyped-def]
        zero = np.zeros(1, dtype=a.dtype)[0]
        gram = np.empty((calls, calls), dtype=a.dtype)
        for i in range(a.shape[0]):
            gram[:] = zero
            total = zero
            j = 0
            for k in range(a.shape[2] + 1):
                while j < by_length.shape[0] and lengths[by_length[j]] == k:
                    r = by_length[j]  # rows seeing the first k columns: g_r^T gram g_r
                    for u in range(calls):
                        for v in range(calls):
                            total += g[u, i, r] * g[v, i, r] * gram[u, v]
                    j += 1
                if k < a.shape[2]:
                    for u in range(calls):
                        for v in range(calls):
                            gram[u, v] += a[i, u, k] * a[i, v, k]
            out[i] = max(total, zero)  # a sum of squares: rounding must not make it negative

    return MaskedKernels(*(_jit(f) for f in (row_stats, free_rows, sparsify_sum, entries, sq_norms)))
