"""MADE autoregressive property and the autoregressive transforms built on it."""

from __future__ import annotations

import pytest
import torch

from privflow.models.dphflow import ConditionalSplineAutoregressive
from privflow.models.made import MADE
from privflow.models.maf import MaskedAffineAutoregressive
from tests.models.conftest import jacobian_logdets, perturb


@pytest.mark.parametrize("d,hidden,layers", [(1, 8, 2), (2, 4, 1), (5, 16, 2), (7, 12, 3)])
@pytest.mark.parametrize("context", [0, 3])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_made_autoregressive(d, hidden, layers, context, activation):
    made = MADE(d, hidden, 3, context_features=context, hidden_layers=layers, activation=activation).double()
    perturb(made, 0.5)
    c = torch.randn(1, context) if context else None
    for x in torch.randn(4, d):
        jac = torch.autograd.functional.jacobian(lambda v: made(v[None], c)[0], x)  # [d, 3, d]
        dep = (jac.abs() > 0).any(1)  # dep[i, j]: output block i depends on x_j
        assert not torch.any(torch.triu(dep)), "output i may only see x_<i"
        if activation == "tanh":  # no dead units: every allowed pair is connected (hidden >= d - 1)
            assert torch.equal(dep, torch.tril(torch.ones(d, d, dtype=torch.bool), -1))
            if context:
                jc = torch.autograd.functional.jacobian(lambda v, x=x: made(x[None], v[None])[0], c[0])
                assert torch.all((jc.abs() > 0).any(-1).any(-1)), "context reaches every output block"


def test_made_zero_init_output():
    made = MADE(4, 8, 5).double()
    assert torch.all(made(torch.randn(3, 4)) == 0)


def _transforms():
    return [
        ("affine", MaskedAffineAutoregressive(4, 16), None),
        ("affine1", MaskedAffineAutoregressive(1, 8), None),
        ("spline", ConditionalSplineAutoregressive(4, blocks=3, hidden=16, bins=5, bound=3.0), 2),
        ("spline1", ConditionalSplineAutoregressive(1, blocks=2, hidden=8, bins=4, bound=3.0), 1),
    ]


@pytest.mark.parametrize("name,tr,block", _transforms(), ids=[t[0] for t in _transforms()])
def test_autoregressive_transform(name, tr, block):
    tr = tr.double()
    perturb(tr, 0.4, seed=1)
    d = tr.d
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(2)) * 2.0
    f = (lambda v: tr(v)) if block is None else (lambda v: tr(v, block))
    z, logdet = f(x)
    inv = tr.inverse(z) if block is None else tr.inverse(z, block)
    torch.testing.assert_close(inv, x, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(logdet, jacobian_logdets(f, x), atol=1e-9, rtol=1e-9)
    jac = torch.autograd.functional.jacobian(lambda v: f(v[None])[0][0], x[0])
    assert not torch.any(torch.triu(jac, 1) != 0), "Jacobian is lower triangular"


def test_shared_made_differs_by_block():
    tr = ConditionalSplineAutoregressive(3, blocks=2, hidden=8, bins=4).double()
    perturb(tr, 0.5)
    x = torch.randn(4, 3)
    assert not torch.allclose(tr(x, 0)[0], tr(x, 1)[0])
