"""Rational-quadratic spline: bijection, derivative against autograd, identity tails, no NaN."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privflow.models.spline import rational_quadratic_spline as rqs


def _params(n: int, bins: int, seed: int, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, bins, generator=g) * scale,
        torch.randn(n, bins, generator=g) * scale,
        torch.randn(n, bins - 1, generator=g) * scale,
    )


@pytest.mark.parametrize("bins", [2, 5, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_inverse_and_derivative(bins, seed):
    bound = 3.0
    x = torch.linspace(-bound - 1.5, bound + 1.5, 301)
    w, h, d = _params(x.shape[0], bins, seed)
    x = x.clone().requires_grad_(True)
    y, logdet = rqs(x, w, h, d, bound=bound)
    (dydx,) = torch.autograd.grad(y.sum(), x)  # elementwise map: the Jacobian is diagonal
    torch.testing.assert_close(logdet, torch.log(dydx), atol=1e-9, rtol=1e-9)
    x_back, inv_logdet = rqs(y.detach(), w, h, d, inverse=True, bound=bound)
    torch.testing.assert_close(x_back, x.detach(), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(inv_logdet, -logdet.detach(), atol=1e-9, rtol=1e-9)
    outside = x.detach().abs() > bound
    torch.testing.assert_close(y.detach()[outside], x.detach()[outside])  # linear tails
    assert torch.all(logdet.detach()[outside] == 0)


def test_monotone_and_maps_interval_onto_itself():
    x = torch.linspace(-4, 4, 2001)
    w, h, d = _params(1, 6, 5, scale=3.0)
    y, _ = rqs(x, w.expand(2001, 6), h.expand(2001, 6), d.expand(2001, 5), bound=4.0)
    assert torch.all(torch.diff(y) > 0)
    torch.testing.assert_close(y[[0, -1]], torch.tensor([-4.0, 4.0]))


def test_zero_parameters_give_identity():
    x = torch.linspace(-5, 5, 101)
    zeros = torch.zeros(101, 8)
    y, logdet = rqs(x, zeros, zeros, torch.zeros(101, 7), bound=4.0)
    torch.testing.assert_close(y, x, atol=1e-12, rtol=0)
    torch.testing.assert_close(logdet, torch.zeros(101), atol=1e-12, rtol=0)


@settings(max_examples=60, deadline=None)
@given(st.floats(-1e8, 1e8, allow_nan=False), st.integers(0, 10_000), st.floats(0.1, 8.0))
def test_inverse_never_nan(z, seed, scale):
    w, h, d = _params(1, 8, seed, scale=scale)
    zt = torch.tensor([z], dtype=torch.float32)
    x, ld = rqs(zt, w.float(), h.float(), d.float(), inverse=True, bound=4.0)
    assert torch.isfinite(x).all() and torch.isfinite(ld).all()
    if abs(z) <= 4.0:
        y, _ = rqs(x, w.float(), h.float(), d.float(), bound=4.0)
        assert abs(float(y) - z) < 1e-3
