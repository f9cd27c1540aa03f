"""Custom layers: bijection, log-det against autograd Jacobians, masks and device moves."""

from __future__ import annotations

import pytest
import torch

from privflow.models.layers import ActNorm, BlockEmbedding, LowRankLinear, LULinear, MaskedLinear
from tests.models.conftest import jacobian_logdets, perturb


def _bijectors():
    return [
        ("actnorm", ActNorm(4)),
        ("lu", LULinear(4, seed=3)),
        ("lu1", LULinear(1, seed=0)),
        ("lowrank1", LowRankLinear(4, rank=1)),
        ("lowrank2", LowRankLinear(5, rank=2, seed=1)),
        ("lowrank3", LowRankLinear(3, rank=3, seed=2)),
    ]


@pytest.mark.parametrize("name,layer", _bijectors(), ids=[n for n, _ in _bijectors()])
@pytest.mark.parametrize("seed", [0, 1])
def test_bijector_inverse_and_logdet(name, layer, seed):
    layer = layer.double()
    perturb(layer, 0.4, seed)
    d = next(layer.parameters()).shape[-1]
    x = torch.randn(6, d, generator=torch.Generator().manual_seed(seed + 10))
    z, logdet = layer(x)
    assert logdet.shape == (6,)
    torch.testing.assert_close(layer.inverse(z), x, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(logdet, jacobian_logdets(layer, x), atol=1e-10, rtol=1e-10)


def test_lu_matches_dense_weight_and_identity_start():
    layer = LULinear(5, seed=7).double()
    x = torch.randn(3, 5)
    # At initialisation W = P exactly: a pure permutation.
    torch.testing.assert_close(layer(x)[0], x[:, layer.perm])
    perturb(layer, 0.5)
    w = layer.weight()
    torch.testing.assert_close(layer(x)[0], x @ w.T + layer.bias)
    torch.testing.assert_close(layer(x)[1][0], torch.linalg.slogdet(w)[1])


def test_lowrank_closed_form_matches_slogdet():
    layer = LowRankLinear(6, rank=1).double()
    torch.testing.assert_close(layer.weight(), torch.eye(6))  # A = 0 at the start
    perturb(layer, 0.5, seed=4)
    torch.testing.assert_close(layer.log_abs_det(), torch.linalg.slogdet(layer.weight())[1])


def test_masked_linear_applies_mask_and_masks_gradient():
    mask = (torch.rand(4, 3, generator=torch.Generator().manual_seed(0)) > 0.5).double()
    layer = MaskedLinear(3, 4, mask).double()
    x = torch.randn(5, 3)
    torch.testing.assert_close(layer(x), x @ (layer.weight * mask).T + layer.bias)
    layer(x).sum().backward()
    assert torch.all(layer.weight.grad[mask == 0] == 0)
    assert torch.any(layer.weight.grad[mask == 1] != 0)


def test_plain_tensors_follow_to_and_no_buffers():
    mask = torch.ones(2, 3)
    layers = [MaskedLinear(3, 2, mask), LULinear(3), LowRankLinear(3), ActNorm(3), BlockEmbedding(2, 3)]
    for layer in layers:
        assert list(layer.buffers()) == []
    ml = layers[0].to(torch.float64)
    assert ml.mask.dtype == torch.float64 and ml.weight.dtype == torch.float64
    lu = layers[1].to(torch.float64)
    assert lu.perm.dtype == torch.long  # integer constants keep their dtype
    # opacus' functorch fallback moves a copy to "meta": the constant stays usable.
    meta = MaskedLinear(3, 2, mask).to("meta")
    assert meta.weight.device.type == "meta" and meta.mask.device.type == "cpu"


def test_masked_linear_rejects_wrong_mask_shape():
    with pytest.raises(ValueError):
        MaskedLinear(3, 2, torch.ones(3, 2))


def test_block_embedding_call_forms():
    emb = BlockEmbedding(3, 4).double()
    a = emb(1, 5)
    b = emb(torch.full((5,), 1, dtype=torch.long))
    assert a.shape == (5, 4)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a[0], emb.weight[1])
    b.sum().backward()
    assert torch.all(emb.weight.grad[[0, 2]] == 0) and torch.all(emb.weight.grad[1] == 5)
    with pytest.raises(ValueError):
        emb(1)
