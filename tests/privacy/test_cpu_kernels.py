"""The fused CPU kernels against the torch operations they replace (``privacy.dpsgd.cpu_kernels``)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch
from torch import Tensor

from privflow.privacy.dpsgd import cpu_kernels
from privflow.privacy.dpsgd.clipping._base import factor
from privflow.privacy.dpsgd.clipping.sparsify import stochastic_sparsify, threshold


def _inputs(n: int, calls: int, cols: int, rows: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """a [n, calls, cols], g [calls, n, rows] with some exact zeros, and row prefix lengths
    covering 0 and every column."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, calls, cols, generator=gen, dtype=dtype)
    g = torch.randn(calls, n, rows, generator=gen, dtype=dtype)
    g[:, :, ::5] = 0  # rows that get no gradient (a ReLU unit that is off)
    lengths = torch.randint(0, cols + 1, (rows,), generator=gen)
    lengths[0], lengths[-1] = 0, cols
    return a, g, lengths


def _dense(a: Tensor, g: Tensor, lengths: Tensor) -> Tensor:
    """G_n = sum_u g_u a_u^T [n, rows, cols], each row past its prefix zeroed."""
    full = torch.einsum("unr,nuk->nrk", g, a)
    keep = torch.arange(a.shape[2])[None, :] < lengths[:, None]
    return full * keep


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> object:
    """Run with 1 and 2 torch threads: with 2 the examples are split between two kernel calls."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("calls", [1, 4])
def test_row_stats_match_dense_rows(dtype: torch.dtype, calls: int, threads: int) -> None:
    a, g, lengths = _inputs(150, calls, 11, 9, dtype, seed=calls)
    l1, sq = cpu_kernels.masked_row_stats(a, g, lengths)
    dense = _dense(a, g, lengths)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(l1, dense.abs().sum(2), atol=tol, rtol=tol)
    torch.testing.assert_close(sq, dense.pow(2).sum(2), atol=tol, rtol=tol)
    assert l1.dtype == dtype and bool((l1[:, 0] == 0).all())  # an empty prefix has norm 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_free_rows_are_the_prefixes_in_the_given_order_then_the_bias(dtype: torch.dtype, threads: int) -> None:
    a, g, lengths = _inputs(130, 3, 8, 7, dtype, seed=5)
    order = torch.randperm(7, generator=torch.Generator().manual_seed(1))
    dense = _dense(a, g, lengths)
    want = torch.cat([dense[:, r, : int(lengths[r])] for r in order.tolist()], 1)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(cpu_kernels.masked_free_rows(a, g, lengths, order), want, atol=tol, rtol=tol)
    with_bias = cpu_kernels.masked_free_rows(a, g, lengths, order, bias=True)
    torch.testing.assert_close(with_bias, torch.cat([want, g.sum(0)], 1), atol=tol, rtol=tol)


@pytest.mark.parametrize("sampled", [False, True], ids=["exact-tau", "sampled-tau"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparsify_clip_sum_equals_the_torch_operator(dtype: torch.dtype, sampled: bool, threads: int) -> None:
    """Rows become T(v_i) exactly as ``stochastic_sparsify`` gives them (tau selected among all
    entries or among sampled positions), and the sum is sum_i clip_C(T(v_i))."""
    gen = torch.Generator().manual_seed(7)
    n, m, k, clip = 200, 40, 15, 1.5
    v = torch.randn(n, m, generator=gen, dtype=dtype)
    v[:, ::3] = 0  # exact zeros stay zero
    v[:7] = 0  # rows with no gradient: tau = 0
    v[7:50] *= 0.01  # rows under the clip norm
    gamma = torch.rand(n, generator=gen, dtype=dtype)
    gamma[:5] = 0.0  # clamped to the smallest positive float, as the operator does
    positions = torch.randperm(m, generator=gen)[:12] if sampled else None
    want = stochastic_sparsify(v, k, gamma, positions)
    want_sum = factor(torch.linalg.vector_norm(want, dim=1), clip) @ want
    got = v.clone()
    tau = threshold(v, k, positions)
    total = cpu_kernels.sparsify_clip_sum_(got, tau, gamma.clamp(min=torch.finfo(dtype).tiny, max=1.0), clip)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(total, want_sum, atol=1e-5, rtol=1e-5)
    assert bool((got[:, ::3] == 0).all()) and bool((got[:7] == 0).all())
    assert (
        float(torch.linalg.vector_norm(want, dim=1)[7:50].max())
        < clip
        < float(torch.linalg.vector_norm(want, dim=1).max())
    )


def test_usable_only_for_cpu_floats_of_one_dtype() -> None:
    x32, x64 = torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.float64)
    assert cpu_kernels.usable(x32, x32) and cpu_kernels.usable(x64)
    assert not cpu_kernels.usable(x32, x64)
    assert not cpu_kernels.usable(torch.zeros(2, 2, dtype=torch.float16))
    assert not cpu_kernels.usable(torch.zeros(2, 2, device="meta"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entries_at_positions_are_those_of_the_dense_gradient(dtype: torch.dtype, threads: int) -> None:
    a, g, lengths = _inputs(140, 3, 9, 6, dtype, seed=11)
    gen = torch.Generator().manual_seed(2)
    seen = (lengths > 0).nonzero().squeeze(1)  # rows with free entries
    rows = seen[torch.randint(0, seen.numel(), (20,), generator=gen)]
    ks = (torch.rand(20, generator=gen) * lengths[rows]).long()  # inside each row's prefix
    bias_rows = torch.tensor([5, 0, 3])
    got = cpu_kernels.masked_entries(a, g, rows, ks, bias_rows)
    dense = _dense(a, g, lengths)
    want = torch.cat([dense[:, rows, ks], g.sum(0)[:, bias_rows]], 1)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_sparsified_sum_equals_free_rows_then_sparsify(dtype: torch.dtype, threads: int) -> None:
    """One pass per example (nothing stored) gives what forming the free entries and then
    sparsifying, clipping and summing them gives."""
    a, g, lengths = _inputs(150, 4, 10, 8, dtype, seed=13)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(4))
    v = cpu_kernels.masked_free_rows(a, g, lengths, order, bias=True)
    gen = torch.Generator().manual_seed(5)
    tau = v.abs().median(1).values * torch.rand(150, generator=gen, dtype=dtype)
    gamma = torch.rand(150, generator=gen, dtype=dtype).clamp(min=torch.finfo(dtype).tiny)
    want = cpu_kernels.sparsify_clip_sum_(v.clone(), tau, gamma, 0.8)
    got = cpu_kernels.masked_sparsify_sum(a, g, lengths, order, True, tau, gamma, 0.8)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert float(torch.linalg.vector_norm(v, dim=1).max()) > 0.8  # some examples are clipped


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("calls", [1, 4])
@pytest.mark.parametrize("ordered", [False, True], ids=["columns-as-is", "staircase-order"])
def test_sq_norms_by_the_staircase_gram_match_dense(
    dtype: torch.dtype, calls: int, ordered: bool, threads: int
) -> None:
    """The calls' arrays are read where they lie, in their own column order: the staircase
    order ``cols`` is applied inside the kernel."""
    a, g, lengths = _inputs(160, calls, 12, 10, dtype, seed=17)
    cols = torch.randperm(12, generator=torch.Generator().manual_seed(3)) if ordered else None
    unordered = a if cols is None else torch.empty_like(a).index_copy_(2, cols, a)  # a[..., cols] is `a`
    per_call = [unordered[:, u].contiguous() for u in range(calls)]
    got = cpu_kernels.masked_sq_norms(per_call, list(g), cols, lengths)
    want = _dense(a, g, lengths).pow(2).sum((1, 2))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert bool((got >= 0).all())


def test_no_examples_give_empty_results() -> None:
    a, g, lengths = _inputs(0, 2, 5, 4, torch.float32, seed=1)
    every = torch.arange(4)
    l1, sq = cpu_kernels.masked_row_stats(a, g, lengths)
    assert l1.shape == sq.shape == (0, 4)
    assert cpu_kernels.masked_free_rows(a, g, lengths, every, bias=True).shape == (0, int(lengths.sum()) + 4)
    assert cpu_kernels.masked_sq_norms([a[:, 0], a[:, 1]], list(g), None, lengths).shape == (0,)
    empty = torch.zeros(0)
    total = cpu_kernels.masked_sparsify_sum(a, g, lengths, every, False, empty, empty, 1.0)
    assert total.shape == (int(lengths.sum()),) and bool((total == 0).all())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_runs_the_threaded_kernels(threads: int) -> None:
    """A pool made before a fork has no threads in the child; the child must get its own
    (else the kernels' work waits forever)."""
    a, g, lengths = _inputs(200, 2, 6, 5, torch.float32, seed=3)
    want = cpu_kernels.masked_row_stats(a, g, lengths)[1]  # makes the pool in the parent
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_child_sq, (a, g, lengths)).get(timeout=60)
    torch.testing.assert_close(got, want)


def _child_sq(a: Tensor, g: Tensor, lengths: Tensor) -> Tensor:
    return cpu_kernels.masked_row_stats(a, g, lengths)[1]


def test_kernels_compile_without_a_writable_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Numba refuses cache=True where no cache directory can be written (a read-only install
    without a user cache): the kernels are then compiled in memory instead of failing."""
    import numba

    from privflow.privacy.dpsgd import _numba_kernels

    real = numba.njit

    def no_cache(*args: object, **kwargs: object) -> object:
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", no_cache)
    add_one = _numba_kernels._jit(lambda x: x + 1)
    assert add_one(41) == 42


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("calls", [1, 3])
@pytest.mark.parametrize("logdet", [True, False], ids=["with-logdet", "no-logdet"])
def test_lu_sq_norms_match_the_materialised_gradients(
    dtype: torch.dtype, calls: int, logdet: bool, threads: int
) -> None:
    """The LULinear kernel's four squared norms against eq. (3)'s per-example gradients formed
    in full by the layer's grad sampler (summed over the calls)."""
    from privflow.models.layers import LULinear
    from privflow.privacy.dpsgd.grad_samplers.lu_linear import lu_linear_grad_sample

    gen = torch.Generator().manual_seed(calls)
    d, n = 7, 140
    layer = LULinear(d, seed=2).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=gen, dtype=dtype))
    x = [torch.randn(n, d, generator=gen, dtype=dtype) for _ in range(calls)]
    g = [torch.randn(n, d, generator=gen, dtype=dtype) for _ in range(calls)]
    gld = [torch.randn(n, generator=gen, dtype=dtype) if logdet else None for _ in range(calls)]
    want: dict[torch.nn.Parameter, Tensor] = {}
    for xu, gu, lu in zip(x, g, gld, strict=True):
        for p, v in lu_linear_grad_sample(layer, [xu], (gu, lu) if logdet else gu).items():
            want[p] = want[p] + v if p in want else v
    got = cpu_kernels.lu_sq_norms(x, g, gld, layer)
    tol = 1e-4 if dtype == torch.float32 else 1e-11
    for col, p in enumerate((layer.lower, layer.upper, layer.log_diag, layer.bias)):
        torch.testing.assert_close(got[:, col], want[p].reshape(n, -1).pow(2).sum(1), atol=tol, rtol=tol)
