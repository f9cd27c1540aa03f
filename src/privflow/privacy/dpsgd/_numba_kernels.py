"""The numba code behind ``cpu_kernels`` (imported by it on first use; see there for what the
kernels compute and why).

Kernels for layers called J times are built per J by ``masked``: J is a closure constant of
the compiled code, so the loop over calls unrolls inside the loop over columns, each entry
of G_n is summed in registers and the column loop vectorises (faster than a runtime J).
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
    pairs = calls * (calls + 1) // 2

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

    def sq_norms(a, g, cols, lengths, out):  # type: ignore[no-untyped-def]
        # a, g: tuples of the calls' [n, in] / [n, out] arrays (read in place, never stacked);
        # cols: the staircase column order. Per example, a table of the calls' Gram matrix of
        # the first k columns for every k (pairs u <= v: it is symmetric), then per pair one
        # pass over the rows, contiguous in g, each row reading its prefix's entry.
        zero = np.zeros(1, dtype=out.dtype)[0]
        tab = np.empty((pairs, cols.shape[0] + 1), dtype=out.dtype)
        col = np.empty(calls, dtype=out.dtype)
        for i in range(out.shape[0]):
            tab[:, 0] = zero
            for k in range(cols.shape[0]):
                for u in range(calls):
                    col[u] = a[u][i, cols[k]]
                p = 0
                for u in range(calls):
                    for v in range(u, calls):
                        tab[p, k + 1] = tab[p, k] + col[u] * col[v]
                        p += 1
            total = zero
            p = 0
            for u in range(calls):
                gu = g[u][i]
                for v in range(u, calls):
                    gv, tp = g[v][i], tab[p]
                    s = zero
                    for r in range(lengths.shape[0]):
                        s += gu[r] * gv[r] * tp[lengths[r]]
                    total += s if u == v else 2 * s
                    p += 1
            out[i] = max(total, zero)  # a sum of squares: rounding must not make it negative

    return MaskedKernels(*(_jit(f) for f in (row_stats, free_rows, sparsify_sum, entries, sq_norms)))


@cache
def lu_sq_norms(calls: int) -> Callable[..., Any]:
    """The LULinear squared-norm kernel for layers called ``calls`` times (``cpu_kernels.lu_sq_norms``)."""
    pairs = calls * (calls + 1) // 2

    def kernel(x, g, gld, lower_param, upper_param, log_diag, inv_perm, out):  # type: ignore[no-untyped-def]
        # x, g: tuples of the calls' [n, d]; gld: of their dL/dlogdet [n]; the layer's lower,
        # upper and log_diag parameters as they are; out [n, 4]: lower, upper, log_diag, bias.
        d = log_diag.shape[0]
        zero = np.zeros(1, dtype=out.dtype)[0]
        lower_t = np.zeros((d, d), dtype=out.dtype)  # L^T: unit diagonal, strict lower part of `lower`
        upper = np.zeros((d, d), dtype=out.dtype)  # U: diag(exp(log_diag)) + strict upper part of `upper`
        scale = np.empty(d, dtype=out.dtype)
        for r in range(d):
            scale[r] = math.exp(log_diag[r])
            upper[r, r] = scale[r]
            lower_t[r, r] = 1
            for j in range(r + 1, d):
                upper[r, j] = upper_param[r, j]
                lower_t[r, j] = lower_param[j, r]
        h = np.empty((calls, d), dtype=out.dtype)  # P^T g
        ux = np.empty((calls, d), dtype=out.dtype)  # U x
        k = np.empty((calls, d), dtype=out.dtype)  # L^T h
        gram = np.empty(pairs, dtype=out.dtype)
        for i in range(out.shape[0]):
            for u in range(calls):
                xu, gu, hu, uxu, ku = x[u][i], g[u][i], h[u], ux[u], k[u]
                for r in range(d):
                    hu[r] = gu[inv_perm[r]]
                for r in range(d):  # whole rows (zeros included): full loops vectorise, ragged ones do not
                    row = upper[r]
                    s = zero
                    for j in range(d):
                        s += row[j] * xu[j]
                    uxu[r] = s
                for j in range(d):
                    row = lower_t[j]
                    s = zero
                    for r in range(d):
                        s += row[r] * hu[r]
                    ku[j] = s
            # ||tril(sum_u h_u ux_u^T, -1)||^2: row r meets the Gram matrix of columns j < r
            gram[:] = zero
            low = zero
            for r in range(d):
                p = 0
                for u in range(calls):
                    for v in range(u, calls):
                        t = h[u, r] * h[v, r] * gram[p]
                        low += t if u == v else 2 * t
                        gram[p] += ux[u, r] * ux[v, r]
                        p += 1
            # ||triu(sum_u k_u x_u^T, 1)||^2: row r meets the Gram matrix of columns j > r
            gram[:] = zero
            up = zero
            for r in range(d - 1, -1, -1):
                p = 0
                for u in range(calls):
                    for v in range(u, calls):
                        t = k[u, r] * k[v, r] * gram[p]
                        up += t if u == v else 2 * t
                        gram[p] += x[u][i, r] * x[v][i, r]
                        p += 1
            diag = zero
            bias = zero
            for r in range(d):
                gd = zero
                gb = zero
                for u in range(calls):
                    gd += k[u, r] * x[u][i, r] * scale[r] + gld[u][i]
                    gb += g[u][i, r]
                diag += gd * gd
                bias += gb * gb
            out[i, 0] = max(low, zero)  # sums of squares: rounding must not make them negative
            out[i, 1] = max(up, zero)
            out[i, 2] = diag
            out[i, 3] = bias

    return _jit(kernel)
