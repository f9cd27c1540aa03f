"""The sampling path (no autograd): the flows' fast inverses against the autograd reference.

Under ``torch.no_grad`` / ``inference_mode`` DP-HFlow inverts its shared MADE incrementally and
its spline through a packed table (models/made.py, models/spline.py); the plain path, taken
when gradients are enabled, runs the MADE d times and the reference spline. Both must be the
inverse of the forward pass, and agree with each other up to rounding.
"""

from __future__ import annotations

import pytest
import torch

from privflow.models import build_flow
from privflow.models.dphflow import SAMPLE_CHUNK, ConditionalSplineAutoregressive
from privflow.models.maf import MaskedAffineAutoregressive
from tests.models.conftest import perturb

# d, hidden, hidden_layers, bins, activation, perturbation: off the identity, yet well conditioned (a
# much larger perturbation makes bins of slope ~min_derivative whose inverse no float path recovers)
SPLINES = [
    (1, 8, 2, 4, "relu", 0.5),
    (4, 16, 2, 5, "relu", 0.3),
    (6, 12, 1, 8, "tanh", 0.3),
    (7, 20, 3, 3, "elu", 0.3),
    (15, 64, 2, 8, "relu", 0.15),
]


def _spline(
    d: int, hidden: int, layers: int, bins: int, activation: str, std: float
) -> ConditionalSplineAutoregressive:
    tr = ConditionalSplineAutoregressive(d, blocks=3, hidden=hidden, bins=bins, bound=3.0, hidden_layers=layers)
    if activation != "relu":
        acts = {"tanh": torch.nn.Tanh, "elu": torch.nn.ELU}
        tr.made.net = torch.nn.Sequential(
            *[acts[activation]() if isinstance(m, torch.nn.ReLU) else m for m in tr.made.net]
        )
    tr = tr.double()
    perturb(tr, std, seed=d)
    return tr


@pytest.mark.parametrize("d,hidden,layers,bins,activation,std", SPLINES)
@pytest.mark.parametrize("block", [0, 2])
def test_spline_sampling_inverse_matches_the_reference(d, hidden, layers, bins, activation, std, block):
    tr = _spline(d, hidden, layers, bins, activation, std)
    g = torch.Generator().manual_seed(block)
    x = torch.randn(257, d, generator=g, dtype=torch.float64) * 2.0  # some beyond the bound: identity tails
    x[:3] = torch.tensor([-3.0, 3.0, 0.0], dtype=torch.float64)[:, None]  # the bound and a knot-free point
    z, _ = tr(x, block)
    reference = tr.inverse(z, block)  # gradients enabled: the plain path
    with torch.no_grad():
        fast = tr.inverse(z, block)
    with torch.inference_mode():
        torch.testing.assert_close(tr.inverse(z, block), fast, atol=0, rtol=0)
    torch.testing.assert_close(fast, x, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(fast, reference, atol=1e-9, rtol=1e-9)


def test_spline_sampling_inverse_in_float32():
    tr = _spline(15, 64, 2, 8, "relu", 0.15).float()
    x = torch.randn(4096, 15, generator=torch.Generator().manual_seed(3), dtype=torch.float32) * 1.5
    with torch.no_grad():
        z, _ = tr(x, 1)
        fast = tr.inverse(z, 1)
    torch.testing.assert_close(fast, x, atol=2e-4, rtol=2e-4)


def test_spline_sampling_inverse_of_zero_rows():
    tr = _spline(4, 16, 2, 5, "relu", 0.3)
    with torch.no_grad():
        assert tr.inverse(torch.zeros(0, 4, dtype=torch.float64), 0).shape == (0, 4)


FLOWS = [
    ("dphflow", {"linear": "lu"}),
    ("dphflow", {"linear": "lowrank", "rank": 2}),
    ("dphflow", {"linear": "none"}),
    ("dphflow", {"prior": "mog", "mog_components": 3}),
    ("maf", {}),
]


@pytest.mark.parametrize("name,kw", FLOWS, ids=[f"{n}-{'-'.join(map(str, kw.values()))}" for n, kw in FLOWS])
def test_flow_sampling_inverse_matches_the_reference(name, kw):
    torch.manual_seed(0)
    m = build_flow(name, [None, 3, None, None, 2, None], blocks=3, hidden=16, **kw).double()
    perturb(m, 0.15, seed=1)
    v = torch.rand(300, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.9 + 0.05
    z, _ = m.transform(v)
    z = z.detach()
    reference = m.inverse_transform(z)
    with torch.inference_mode():
        fast = m.inverse_transform(z)
    torch.testing.assert_close(fast, v, atol=1e-8, rtol=0)
    torch.testing.assert_close(fast, reference, atol=1e-8, rtol=0)


def test_flow_sampling_inverse_in_chunks():
    """More rows than one pass of the sampling inverse holds (models.dphflow.SAMPLE_CHUNK): the
    chunks and the shorter last one invert like one pass would."""
    torch.manual_seed(0)
    m = build_flow("dphflow", [None, None, 4], blocks=2, hidden=8).double()
    perturb(m, 0.15, seed=4)
    v = torch.rand(SAMPLE_CHUNK + 37, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 0.9 + 0.05
    z = m.transform(v)[0].detach()
    with torch.inference_mode():
        fast = m.inverse_transform(z)
        torch.testing.assert_close(fast[-37:], m.inverse_transform(z[-37:]), atol=1e-12, rtol=0)
    torch.testing.assert_close(fast, v, atol=1e-8, rtol=0)


@pytest.mark.parametrize("d,hidden,layers", [(1, 8, 2), (5, 16, 1), (6, 12, 3)])
def test_affine_sampling_inverse_matches_the_reference(d, hidden, layers):
    tr = MaskedAffineAutoregressive(d, hidden, hidden_layers=layers).double()
    perturb(tr, 0.3, seed=d)
    x = torch.randn(200, d, generator=torch.Generator().manual_seed(d), dtype=torch.float64) * 2.0
    z, _ = tr(x)
    reference = tr.inverse(z)
    with torch.inference_mode():
        fast = tr.inverse(z)
    torch.testing.assert_close(fast, x, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(fast, reference, atol=1e-9, rtol=1e-9)
