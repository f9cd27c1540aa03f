"""Clipping strategies: every example's clipped gradient has total norm <= C (so noise
calibrated to C is right), the thresholds split C as DP-HFlow says, T_{tau,gamma} is
unbiased, and the fast path equals the materialising (opacus-hooks style) reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from privflow.privacy.dpsgd.clipping import (
    GradientMismatch,
    LayerInfo,
    clip_flat,
    clip_per_layer,
    clip_per_unit,
    clip_sparsify,
    clipped_gradient_sum,
    layer_thresholds,
    model_layers,
    row_stats,
    sparsify_k,
    stochastic_sparsify,
    threshold,
    threshold_positions,
    unit_thresholds,
)
from tests.privacy.test_grad_samplers import TinyFlow

torch.set_num_threads(1)
DT = torch.float64
SLACK = 1 + 1e-9  # float64 rounding of norm * (C / norm)
STRATEGIES = ["flat", "per_layer", "per_unit", "sparsify"]


def random_grads(seed: int, n: int = 16) -> tuple[list[list[Tensor]], list[LayerInfo]]:
    """Random per-example gradients for 2-3 networks of 1-3 layers with 1-3 parameters each,
    on wildly different scales (as Figure 2 of DP-HFlow shows across networks)."""
    g = torch.Generator().manual_seed(seed)
    grads, layers = [], []
    for net in range(int(torch.randint(2, 4, (1,), generator=g))):
        for lay in range(int(torch.randint(1, 4, (1,), generator=g))):
            params = []
            for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                shape = tuple(
                    int(s) for s in torch.randint(1, 6, (int(torch.randint(1, 3, (1,), generator=g)),), generator=g)
                )
                scale = 10 ** float(torch.empty(()).uniform_(-2, 2, generator=g))
                t = torch.randn((n,) + shape, generator=g, dtype=DT) * scale
                t[torch.rand(t.shape, generator=g) < 0.2] = 0.0  # some exact zeros
                params.append(t)
            params[0][0] = 0.0  # an example with a zero parameter gradient
            grads.append(params)
            fake = tuple(nn.Parameter(torch.zeros(p.shape[1:])) for p in params)
            layers.append(
                LayerInfo(f"n{net}.l{lay}", nn.Module(), fake, f"n{net}", tuple(p[0].numel() for p in params))
            )
    return grads, layers


def total_norms(grads: list[list[Tensor]]) -> Tensor:
    return torch.sqrt(sum(p.reshape(p.shape[0], -1).pow(2).sum(1) for layer in grads for p in layer))


def layer_norms(grads: list[list[Tensor]]) -> Tensor:
    return torch.stack([torch.sqrt(sum(p.reshape(p.shape[0], -1).pow(2).sum(1) for p in layer)) for layer in grads], 1)


def clip_with(
    strategy: str, grads: list[list[Tensor]], layers: list[LayerInfo], c: float, seed: int
) -> list[list[Tensor]]:
    thr = layer_thresholds(layers, c)
    if strategy == "flat":
        return clip_flat(grads, c)
    if strategy == "per_layer":
        return clip_per_layer(grads, thr)
    if strategy == "per_unit":
        return clip_per_unit(grads, thr)
    gen = torch.Generator().manual_seed(seed)
    gammas = [torch.rand(grads[0][0].shape[0], generator=gen, dtype=DT) for _ in grads]
    return clip_sparsify(grads, thr, 0.5, gammas)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_example_total_norm_at_most_c(strategy: str, seed: int) -> None:
    grads, layers = random_grads(seed)
    for c in (0.01, 1.0, 50.0):
        clipped = clip_with(strategy, grads, layers, c, seed)
        assert bool((total_norms(clipped) <= c * SLACK).all())
        if strategy != "flat":  # and each layer within its own threshold
            thr = torch.tensor(layer_thresholds(layers, c), dtype=DT)
            assert bool((layer_norms(clipped) <= thr * SLACK).all())


@pytest.mark.parametrize("seed", range(3))
def test_clipping_is_identity_below_threshold(seed: int) -> None:
    grads, layers = random_grads(seed)
    big = 1e9
    for strategy in ("flat", "per_layer"):
        for a, b in zip(clip_with(strategy, grads, layers, big, seed), grads, strict=False):
            for x, y in zip(a, b, strict=False):
                torch.testing.assert_close(x, y)
    # and flat clipping of a large gradient lands exactly on the sphere of radius C
    norms = total_norms(clip_flat(grads, 1e-3))
    big_ones = total_norms(grads) > 1e-3
    torch.testing.assert_close(norms[big_ones], torch.full_like(norms[big_ones], 1e-3))


@pytest.mark.parametrize("seed", range(4))
def test_per_unit_rows_within_their_thresholds(seed: int) -> None:
    grads, layers = random_grads(seed)
    thr = layer_thresholds(layers, 1.0)
    clipped = clip_per_unit(grads, thr)
    for layer, cl, t in zip(grads, clipped, thr, strict=False):
        l1 = torch.cat([row_stats(g)[0] for g in layer], 1)
        unit_thr = unit_thresholds(l1, t)
        # paper formula: C_l[i] = C_l sqrt(||G_i||_1 / sum_j ||G_j||_1), sum_i C_l[i]^2 = C_l^2
        live = l1.sum(1) > 0  # an all-zero layer gradient has nothing to split
        expect = t * torch.sqrt(l1[live] / l1[live].sum(1, keepdim=True))
        torch.testing.assert_close(unit_thr[live], expect)
        torch.testing.assert_close(unit_thr[live].pow(2).sum(1), torch.full((int(live.sum()),), t * t, dtype=DT))
        sq = torch.cat([row_stats(g)[1] for g in cl], 1)
        assert bool((sq.sqrt() <= unit_thr * SLACK + 1e-300).all())


def test_thresholds_split_between_networks_then_layers() -> None:
    _, layers = random_grads(3)
    c = 2.5
    thr = layer_thresholds(layers, c)
    assert math.isclose(sum(t * t for t in thr), c * c, rel_tol=1e-12)
    nets = sorted({layer.network for layer in layers})
    for net in nets:
        members = [(layer, t) for layer, t in zip(layers, thr, strict=False) if layer.network == net]
        assert math.isclose(sum(t * t for _, t in members), c * c / len(nets), rel_tol=1e-12)
        total = sum(layer.complexity for layer, _ in members)
        for layer, t in members:
            assert math.isclose(t * t, c * c / len(nets) * layer.complexity / total, rel_tol=1e-12)


def test_model_layers_networks_and_structural_sizes() -> None:
    model = TinyFlow()
    layers = {layer.name: layer for layer in model_layers(model)}
    assert set(layers) == {"act", "emb", "made.0", "made.1", "lus.0", "lus.1", "lus.2", "low", "head"}
    assert layers["made.1"].network == "made" and layers["lus.2"].network == "lus"
    d = 4
    assert layers["lus.0"].complexity == d * (d - 1) + 2 * d  # two strict triangles + diag + bias
    m = model.made[0]
    assert layers["made.0"].complexity == int(m.mask.sum()) + m.out_features


def test_sparsify_operator_cases() -> None:
    v = torch.tensor([[5.0, -4.0, 3.0, -2.0, 1.0, 0.5, 0.0]], dtype=DT)
    k = 3  # tau = 3
    out = stochastic_sparsify(v, k, torch.tensor([0.5], dtype=DT))  # tau * gamma = 1.5
    torch.testing.assert_close(out, torch.tensor([[5.0, -4.0, 3.0, -3.0, 0.0, 0.0, 0.0]], dtype=DT))
    out = stochastic_sparsify(v, k, torch.tensor([0.1], dtype=DT))  # tau * gamma = 0.3
    torch.testing.assert_close(out, torch.tensor([[5.0, -4.0, 3.0, -3.0, 3.0, 3.0, 0.0]], dtype=DT))
    assert sparsify_k(10, 0.5) == 5 and sparsify_k(3, 0.9) == 1
    with pytest.raises(ValueError):
        sparsify_k(10, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, DT])
def test_kth_largest_matches_a_sort(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """tau of stochastic sparsification: the k-th largest |entry| per row, with rows of many
    exact zeros (fewer positive entries than k gives 0), ties, and k from 1 to m."""
    from privflow.privacy.dpsgd.clipping import sparsify
    from privflow.privacy.dpsgd.clipping.sparsify import kth_largest

    g = torch.Generator().manual_seed(0)
    n, m = 12, 30
    a = torch.rand(n, m, generator=g, dtype=dtype)
    a[torch.rand(n, m, generator=g) < 0.5] = 0.0  # exact zeros
    a[0] = 0.0  # a row with no positive entry
    a[1, :10] = 0.25  # ties
    a[2] = 1.0  # all equal
    ref = torch.sort(a, dim=1, descending=True).values
    for short in (m + 1, 1):  # short rows: one vectorised partition; long rows: row by row
        monkeypatch.setattr(sparsify, "_SHORT_ROW", short)
        for k in (1, 2, 7, 15, 16, 29, m):
            torch.testing.assert_close(kth_largest(a, k), ref[:, k - 1 : k], atol=0, rtol=0)


def test_sparsify_is_unbiased() -> None:
    """E[T_{tau,gamma}(v)] = v, over gamma ~ U[0,1] (fixed seed, 5 standard errors)."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1, 40, generator=g, dtype=DT) * torch.logspace(-2, 1, 40, dtype=DT)
    draws = 40000
    gamma = torch.rand(draws, generator=g, dtype=DT)
    t = stochastic_sparsify(v.expand(draws, -1), 10, gamma)
    mean, se = t.mean(0), t.std(0) / math.sqrt(draws)
    assert bool(((mean - v[0]).abs() <= 5 * se + 1e-12).all())
    assert bool((t.ne(0).sum(1) < 40).any())  # it does sparsify


def test_sampled_tau_is_the_same_rank_share_among_the_positions() -> None:
    """tau from positions: the round(k S / m)-th largest of the entries there (S positions);
    all positions give the exact k-th largest; rows up to EXACT_ROW get no positions."""
    from privflow.privacy.dpsgd.clipping.sparsify import EXACT_ROW, THRESHOLD_SAMPLE, kth_largest

    g = torch.Generator().manual_seed(0)
    a = torch.rand(5, 100, generator=g, dtype=DT)
    pos = torch.tensor([3, 17, 40, 41, 99, 0, 58, 77])
    for k in (1, 30, 50, 100):
        want = torch.sort(a[:, pos], dim=1, descending=True).values[:, [max(1, round(k * 8 / 100)) - 1]]
        torch.testing.assert_close(threshold(a, k, pos), want, atol=0, rtol=0)
        torch.testing.assert_close(threshold(a, k, torch.randperm(100, generator=g)), kth_largest(a, k))
    assert threshold_positions(EXACT_ROW, g, torch.device("cpu")) is None
    p = threshold_positions(EXACT_ROW + 1, g, torch.device("cpu"))
    assert p is not None and p.numel() == THRESHOLD_SAMPLE == p.unique().numel()
    assert int(p.min()) >= 0 and int(p.max()) <= EXACT_ROW


def test_sampled_tau_keeps_about_one_minus_s_and_stays_unbiased() -> None:
    """On long rows (heavy-tailed, a third exact zeros) the share of entries at least tau is
    1 - s within 4 standard errors of the S-position estimate, and T with the estimated tau is
    still unbiased (5 standard errors over gamma)."""
    from privflow.privacy.dpsgd.clipping.sparsify import THRESHOLD_SAMPLE

    g = torch.Generator().manual_seed(1)
    m, s = 20000, 0.5
    v = torch.randn(64, m, generator=g, dtype=DT) ** 3 * (torch.rand(64, m, generator=g) > 1 / 3)
    k = sparsify_k(m, s)
    kept = []
    for _ in range(10):
        pos = threshold_positions(m, g, torch.device("cpu"))
        assert pos is not None
        kept.append((v.abs() >= threshold(v.abs(), k, pos)).to(DT).mean(1))
    share = torch.cat(kept)
    assert abs(float(share.mean()) - (1 - s)) < 4 * math.sqrt(s * (1 - s) / THRESHOLD_SAMPLE / share.numel())
    assert float((share - (1 - s)).abs().max()) < 4 * math.sqrt(s * (1 - s) / THRESHOLD_SAMPLE) + 0.01
    row = (torch.randn(1, 2000, generator=g, dtype=DT).sign() * torch.logspace(-1, 1, 2000, dtype=DT))[
        :, torch.randperm(2000, generator=g)
    ]
    pos = threshold_positions(2000, g, torch.device("cpu"))
    draws = 20000
    t = stochastic_sparsify(row.expand(draws, -1), 1000, torch.rand(draws, generator=g, dtype=DT), pos)
    mean, se = t.mean(0), t.std(0) / math.sqrt(draws)
    assert bool(((mean - row[0]).abs() <= 5 * se + 1e-12).all())
    assert float(t.ne(0).to(DT).mean()) < 0.9  # it does sparsify


def sampled_tau(strategy: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`sparsify-sampled`: sparsify with tau estimated on every layer of more than 8 free
    entries, from 4 positions (the small test models' layers are all under the real limit)."""
    from privflow.privacy.dpsgd.clipping import sparsify

    if strategy != "sparsify-sampled":
        return strategy
    monkeypatch.setattr(sparsify, "EXACT_ROW", 8)
    monkeypatch.setattr(sparsify, "THRESHOLD_SAMPLE", 4)
    return "sparsify"


# ---------------------------------------------------------------- the engine on a model
@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch"])
@pytest.mark.parametrize("strategy", STRATEGIES + ["none", "sparsify-sampled"])
def test_fast_path_equals_reference(strategy: str, kernels: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path against the materialising reference, with the fused CPU kernels and
    without them (``torch``: the operations CUDA runs)."""
    from privflow.privacy.dpsgd import cpu_kernels

    if not kernels:
        monkeypatch.setattr(cpu_kernels, "usable", lambda *tensors: False)
    strategy = sampled_tau(strategy, monkeypatch)
    model = TinyFlow(d=4, hidden=8, blocks=3, seed=1).to(DT)
    x = torch.randn(9, 4, dtype=DT, generator=torch.Generator().manual_seed(2))
    kw = dict(clipping=strategy, max_grad_norm=0.7, sparsity=0.4)
    fast = clipped_gradient_sum(model, x, method="fast", generator=torch.Generator().manual_seed(3), check=True, **kw)
    ref = clipped_gradient_sum(model, x, method="hooks", generator=torch.Generator().manual_seed(3), **kw)
    for p in model.parameters():
        torch.testing.assert_close(fast.grads[p], ref.grads[p], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast.losses, -model.log_prob(x).detach())


@pytest.mark.parametrize("strategy", STRATEGIES + ["sparsify-sampled"])
def test_fast_path_in_many_chunks_equals_one_chunk(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Materialising per-example gradients a few examples at a time (the torch path, chunks
    of 16 entries: one example each) gives the sum of the unchunked reference."""
    from privflow.privacy.dpsgd import cpu_kernels
    from privflow.privacy.dpsgd.clipping import _fast
    from privflow.privacy.dpsgd.grad_samplers import linear

    strategy = sampled_tau(strategy, monkeypatch)
    model = TinyFlow(d=4, hidden=8, blocks=3, seed=1).to(DT)
    x = torch.randn(9, 4, dtype=DT, generator=torch.Generator().manual_seed(2))
    kw = dict(clipping=strategy, max_grad_norm=0.7, sparsity=0.4)
    ref = clipped_gradient_sum(model, x, method="hooks", generator=torch.Generator().manual_seed(3), **kw)
    monkeypatch.setattr(cpu_kernels, "usable", lambda *tensors: False)
    monkeypatch.setattr(_fast, "_CHUNK_ELEMENTS", 16)
    monkeypatch.setattr(linear, "_CHUNK_ELEMENTS", 16)
    largest = max(model_layers(model), key=lambda layer: sum(p.numel() for p in layer.params))
    assert len(_fast.chunks(len(x), largest)) == len(x)
    fast = clipped_gradient_sum(model, x, method="fast", generator=torch.Generator().manual_seed(3), check=True, **kw)
    for p in model.parameters():
        torch.testing.assert_close(fast.grads[p], ref.grads[p], atol=1e-6, rtol=1e-6)


def test_a_gpu_materialises_a_batch_in_few_chunks() -> None:
    """On the CPU a layer's per-example gradients are materialised in cache-sized chunks; on
    another device (a GPU; here the meta device) in chunks of ACCELERATOR_CHUNK_ELEMENTS, since
    each chunk costs kernel launches there: the 12,627-entry shared MADE at batch 4,096 in 2
    chunks, not 25."""
    from privflow.privacy.dpsgd.clipping._fast import chunks
    from privflow.privacy.dpsgd.clipping.structure import LayerInfo
    from privflow.privacy.dpsgd.grad_samplers._common import ACCELERATOR_CHUNK_ELEMENTS

    def layer(device: str) -> LayerInfo:
        lin = nn.Linear(12_626, 1, device=device)
        return LayerInfo("made", lin, (lin.weight, lin.bias), "made", (12_626, 1))

    assert len(chunks(4096, layer("cpu"))) == 25
    assert len(chunks(4096, layer("meta"))) == math.ceil(4096 / (ACCELERATOR_CHUNK_ELEMENTS // 12_627)) == 2
    assert chunks(4096, layer("meta"))[0] == slice(0, ACCELERATOR_CHUNK_ELEMENTS // 12_627)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_engine_bounds_each_example_by_c(strategy: str) -> None:
    """A batch of one example: the clipped sum IS that example's clipped gradient."""
    model = TinyFlow(d=4, hidden=8, blocks=3, seed=4).to(DT)
    x = 3 * torch.randn(6, 4, dtype=DT, generator=torch.Generator().manual_seed(5))
    c = 0.3
    for i in range(6):
        out = clipped_gradient_sum(
            model, x[i : i + 1], clipping=strategy, max_grad_norm=c, generator=torch.Generator().manual_seed(i)
        )
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in out.grads.values()))
        assert 0 < norm <= c * SLACK


def test_mismatch_detected_when_a_parameter_is_used_outside_forward() -> None:
    class Leaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3).to(DT)

        def log_prob(self, x: Tensor) -> Tensor:
            return -(self.lin(x) ** 2).sum(1) - (x @ self.lin.weight).sum(1)  # weight used directly

    model = Leaky()
    x = torch.randn(4, 3, dtype=DT)
    with pytest.raises(GradientMismatch):
        clipped_gradient_sum(model, x, clipping="flat", max_grad_norm=1.0, check=True)


@pytest.mark.parametrize(
    "name,options",
    [
        ("dphflow", {"linear": "lu"}),
        ("dphflow", {"linear": "lowrank", "rank": 2, "dequantization": "variational"}),
        ("maf", {}),
    ],
)
def test_project_flows_fast_equals_reference(name: str, options: dict) -> None:
    """The real models: per-example gradients add up to the batch gradient (check=True) and
    the fast path equals the reference for every strategy."""
    from privflow.models import build_flow

    cards = [None, 3, None, 5, 2]
    model = build_flow(name, cards, blocks=2, hidden=8, **options).to(DT)
    g = torch.Generator().manual_seed(0)
    x = torch.stack(
        [
            torch.rand(7, generator=g, dtype=DT) if c is None else torch.randint(0, c, (7,), generator=g).to(DT)
            for c in cards
        ],
        1,
    )
    for strategy in STRATEGIES:
        torch.manual_seed(1)  # the same dequantization noise for both methods
        fast = clipped_gradient_sum(
            model, x, clipping=strategy, max_grad_norm=0.5, check=True, generator=torch.Generator().manual_seed(2)
        )
        torch.manual_seed(1)
        ref = clipped_gradient_sum(
            model, x, clipping=strategy, max_grad_norm=0.5, method="hooks", generator=torch.Generator().manual_seed(2)
        )
        for p in model.parameters():
            torch.testing.assert_close(fast.grads[p], ref.grads[p], atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- non-finite examples
class NaNLossFlow(TinyFlow):
    """TinyFlow whose log_prob is NaN for rows with x[0] == 123 (finite inputs, finite grads)."""

    def log_prob(self, x: Tensor) -> Tensor:
        lp = super().log_prob(x)
        return lp + torch.where(x[:, 0] == 123.0, torch.full_like(lp, math.nan), torch.zeros_like(lp))


def _bad_batch() -> tuple[Tensor, Tensor]:
    clean = torch.randn(7, 4, dtype=DT, generator=torch.Generator().manual_seed(9))
    nan_row = torch.tensor([[0.1, math.nan, 0.2, 0.3]], dtype=DT)
    inf_row = torch.tensor([[math.inf, 0.5, -0.2, 0.3]], dtype=DT)
    nan_loss_row = torch.tensor([[123.0, 0.0, 0.1, 0.2]], dtype=DT)
    x = torch.cat([clean[:3], nan_row, clean[3:5], inf_row, nan_loss_row, clean[5:]])
    good = torch.tensor([True] * 3 + [False] + [True] * 2 + [False, False] + [True] * 2)
    return x, good


@pytest.mark.parametrize("method", ["fast", "hooks"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_nonfinite_examples_are_zeroed_and_counted(strategy: str, method: str) -> None:
    model = NaNLossFlow(d=4, hidden=8, blocks=2, seed=2).to(DT)
    x, good = _bad_batch()
    kw = dict(clipping=strategy, max_grad_norm=0.4, sparsity=0.4, method=method)
    res = clipped_gradient_sum(model, x, generator=torch.Generator().manual_seed(1), **kw)
    assert res.nonfinite_examples == 3 and torch.equal(res.nonfinite, ~good)
    assert all(bool(torch.isfinite(g).all()) for g in res.grads.values())
    clean = clipped_gradient_sum(model, x[good], generator=torch.Generator().manual_seed(1), **kw)
    assert clean.nonfinite_examples == 0
    for p in model.parameters():
        torch.testing.assert_close(res.grads[p], clean.grads[p], atol=1e-10, rtol=1e-10)
    assert res.losses.shape == (10,) and bool(torch.isfinite(res.losses[good]).all())


class _PoisonGrad(torch.autograd.Function):
    """Identity forward; backward gives NaN for the flagged rows (a finite loss whose gradient is not)."""

    @staticmethod
    def forward(ctx: object, lp: Tensor, rows: Tensor) -> Tensor:  # type: ignore[override]
        ctx.rows = rows  # type: ignore[attr-defined]
        return lp.clone()

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return torch.where(ctx.rows, torch.full_like(grad, math.nan), grad), None  # type: ignore[attr-defined]


class NaNGradFlow(TinyFlow):
    """TinyFlow whose loss is finite everywhere but whose gradient is NaN for rows with x[0] == 77:
    every recorded output gradient of those rows is NaN."""

    def log_prob(self, x: Tensor) -> Tensor:
        return _PoisonGrad.apply(super().log_prob(x), x[:, 0] == 77.0)


@pytest.mark.parametrize("method", ["fast", "hooks"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_examples_with_a_finite_loss_and_a_nonfinite_gradient_are_zeroed(strategy: str, method: str) -> None:
    """Losses are screened on every step, recorded tensors only when the sum is not finite:
    a row whose loss is finite but whose output gradients are NaN is still found and left out."""
    model = NaNGradFlow(d=4, hidden=8, blocks=2, seed=2).to(DT)
    x = torch.randn(8, 4, dtype=DT, generator=torch.Generator().manual_seed(4))
    x[2, 0] = x[5, 0] = 77.0
    good = torch.ones(8, dtype=torch.bool)
    good[2] = good[5] = False
    kw = dict(clipping=strategy, max_grad_norm=0.4, sparsity=0.4, method=method)
    res = clipped_gradient_sum(model, x, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(res.nonfinite, ~good) and bool(torch.isfinite(res.losses).all())
    clean = clipped_gradient_sum(model, x[good], generator=torch.Generator().manual_seed(1), **kw)
    for p in model.parameters():
        torch.testing.assert_close(res.grads[p], clean.grads[p], atol=1e-10, rtol=1e-10)


def test_nonfinite_sum_equals_microbatch_clipped_sum() -> None:
    """Flat clipping: the clean rows' clipped sum, from one-row microbatches (unclipped
    per-example gradients clipped here by hand), equals the engine's sum on the bad batch."""
    model = NaNLossFlow(d=4, hidden=8, blocks=2, seed=3).to(DT)
    x, good = _bad_batch()
    c = 0.4
    res = clipped_gradient_sum(model, x, clipping="flat", max_grad_norm=c)
    expect = {p: torch.zeros_like(p) for p in model.parameters()}
    for i in good.nonzero().squeeze(1).tolist():
        model.zero_grad()
        (-model.log_prob(x[i : i + 1]).sum()).backward()
        grads = {p: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()}
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
        for p, g in grads.items():
            expect[p] += g * min(1.0, c / norm)
    for p in model.parameters():
        torch.testing.assert_close(res.grads[p], expect[p], atol=1e-9, rtol=1e-7)


def test_all_nonfinite_batch_gives_zero_sum() -> None:
    model = TinyFlow(d=4, hidden=8, blocks=2, seed=1).to(DT)
    x = torch.full((3, 4), math.nan, dtype=DT)
    res = clipped_gradient_sum(model, x, clipping="per_layer", max_grad_norm=1.0)
    assert res.nonfinite_examples == 3
    assert all(bool((g == 0).all()) for g in res.grads.values())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_training_step_with_bad_rows_keeps_parameters_finite(strategy: str) -> None:
    from privflow.privacy.dpsgd.dp_sgd import TrainSettings, train

    model = NaNLossFlow(d=4, hidden=8, blocks=2, seed=4)
    x, good = _bad_batch()
    s = TrainSettings(
        sample_rate=1.0,
        steps=2,
        noise_multiplier=0.5,
        max_grad_norm=1.0,
        clipping=strategy,
        expected_batch_size=10.0,
        lr=1e-2,
        noise_seed=3,
    )
    res = train(model, x.float(), s)
    assert res.nonfinite_examples == 2 * 3
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert all(math.isfinite(v) for v in res.losses)


# ---------------------------------------------------------------- against torch.func per-example gradients
def _func_per_example_grads(model: nn.Module, x: Tensor, noise: Tensor | None) -> dict[str, Tensor]:
    """Per-example gradients of -log_prob(x_i) by torch.func (vmap of grad over one-row batches):
    an independent reference that shares no code with the engine or the grad samplers."""
    from torch.func import functional_call, grad, vmap

    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}

    def loss(p: dict[str, Tensor], xi: Tensor, ni: Tensor | None) -> Tensor:
        args = (xi[None],) if ni is None else (xi[None], ni[None])
        return -functional_call(model, p, args, {}).sum()  # forward() is log_prob

    if noise is None:
        return vmap(grad(lambda p, xi: loss(p, xi, None)), in_dims=(None, 0))(params, x)
    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, noise)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("strategy", STRATEGIES + ["sparsify-sampled"])
def test_dphflow_fast_path_equals_torch_func_per_example_clipping(
    strategy: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default DP-HFlow architecture (shared MADE called once per block, LU flows,
    actnorm, embedding): the fast clipped sum equals clipping torch.func per-example gradients
    by the strategy's definition and summing them, to 1e-6 in float64. On CUDA the fast path
    runs on the GPU against the same reference computed on the CPU. `sparsify-sampled`: every
    layer of more than 8 free entries estimates tau from positions (on the same draws)."""
    from privflow.models import build_flow
    from privflow.privacy.dpsgd.clipping._fast import free_index
    from privflow.privacy.dpsgd.clipping._fast import gammas as draw_gammas
    from privflow.privacy.dpsgd.clipping._fast import positions as draw_positions

    strategy = sampled_tau(strategy, monkeypatch)
    from privflow.privacy.noise import dequantization_noise

    cards = [None, 3, None, 5, 2, None]
    model = build_flow("dphflow", cards, blocks=3, hidden=16).to(DT)
    with torch.no_grad():  # leave the identity start, so every layer's gradient is non-trivial
        g0 = torch.Generator().manual_seed(11)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g0, dtype=DT))
    g = torch.Generator().manual_seed(0)
    n = 11
    x = torch.stack(
        [
            torch.rand(n, generator=g, dtype=DT) if c is None else torch.randint(0, c, (n,), generator=g).to(DT)
            for c in cards
        ],
        1,
    )
    noise = dequantization_noise(model, n, x, torch.Generator().manual_seed(5))
    per = _func_per_example_grads(model, x, noise)
    layers = model_layers(model)
    names = {p: k for k, p in model.named_parameters()}
    grads = [[per[names[p]] for p in layer.params] for layer in layers]
    c = 0.6
    thr = layer_thresholds(layers, c)
    if strategy == "flat":
        clipped = clip_flat(grads, c)
    elif strategy == "per_layer":
        clipped = clip_per_layer(grads, thr)
    elif strategy == "per_unit":
        clipped = clip_per_unit(grads, thr)
    else:
        gen = torch.Generator(device=device).manual_seed(3)
        gs = [g.cpu() for g in draw_gammas(n, len(layers), gen, device, DT)]
        pos = [None if p is None else p.cpu() for p in draw_positions(layers, gen, torch.device(device))]
        index = [
            [None if (i := free_index(layer).get(p)) is None else i.cpu() for p in layer.params] for layer in layers
        ]
        clipped = clip_sparsify(grads, thr, 0.5, gs, pos, index)
    assert bool((total_norms(clipped) <= c * SLACK).all())
    model.to(device)  # the same Parameter objects: `layers` still names them
    fast = clipped_gradient_sum(
        model,
        x.to(device),
        clipping=strategy,
        max_grad_norm=c,
        sparsity=0.5,
        noise=noise.to(device),
        generator=torch.Generator(device=device).manual_seed(3),
        check=True,
        layers=layers,
    )
    assert fast.nonfinite_examples == 0
    for layer, cl in zip(layers, clipped, strict=False):
        for p, gp in zip(layer.params, cl, strict=False):
            assert fast.grads[p].device.type == device
            torch.testing.assert_close(fast.grads[p].cpu(), gp.sum(0), atol=1e-6, rtol=1e-6)


def test_finite_screen_tells_overflow_from_non_finite_entries() -> None:
    """The engine screens recorded tensors and clipped sums by one sum each; finite entries
    whose float32 sum overflows are still finite, an inf or a NaN entry is not."""
    from privflow.privacy.dpsgd.clipping.engine import _all_finite

    big = torch.full((4, 3), 3e38, dtype=torch.float32)  # finite entries, the sum overflows
    assert _all_finite([big, torch.zeros(2)])
    assert _all_finite([])
    for bad in (math.inf, -math.inf, math.nan):
        t = torch.zeros(4, 3)
        t[2, 1] = bad
        assert not _all_finite([torch.ones(3), t])
