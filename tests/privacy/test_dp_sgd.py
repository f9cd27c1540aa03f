"""The DP-SGD trainer: Poisson sampling, noise scale and normalisation by the PUBLIC
expected batch size, noise-only steps, checkpoints, the privacy event, determinism."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from privflow.privacy.accounting.events import PoissonGaussianEvent
from privflow.privacy.dpsgd.clipping import clipped_gradient_sum
from privflow.privacy.dpsgd.dp_sgd import (
    TrainResult,
    TrainSettings,
    checkpoint_steps,
    distinct_uniform,
    dp_sgd_event,
    noisy_gradients,
    poisson_sample,
    train,
)
from tests.privacy.test_grad_samplers import TinyFlow

torch.set_num_threads(1)


def data(n: int = 300, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g) * torch.tensor([1.0, 2.0, 0.5, 1.0]) + 1.0


def settings(**kw: object) -> TrainSettings:
    base = dict(
        sample_rate=0.2,
        steps=7,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        checkpoint_every=3,
        expected_batch_size=60.0,
        lr=1e-2,
    )
    base.update(kw)
    return TrainSettings(**base)  # type: ignore[arg-type]


def test_poisson_sampling_is_independent_bernoulli() -> None:
    g = torch.Generator().manual_seed(0)
    n, q, reps = 1000, 0.05, 400
    sizes = torch.tensor([float(len(poisson_sample(n, q, g))) for _ in range(reps)])
    # Binomial(n, q): mean nq = 50, variance nq(1-q) = 47.5
    assert abs(float(sizes.mean()) - n * q) < 5 * math.sqrt(n * q * (1 - q) / reps)
    assert 0.75 < float(sizes.var()) / (n * q * (1 - q)) < 1.3
    counts = torch.zeros(n)
    for _ in range(reps):
        rows = poisson_sample(n, q, g)
        assert torch.equal(rows, rows.unique())  # sorted, no row twice
        counts[rows] += 1
    # every row has the same rate: the counts are Binomial(reps, q) row by row (chi-square, n dof)
    chi2 = float(((counts - reps * q) ** 2).sum()) / (reps * q * (1 - q))
    assert abs(chi2 - n) < 5 * math.sqrt(2 * n)


@pytest.mark.parametrize("q", [0.2, 0.3])  # the batch-sized draw and the n coins (q >= 0.25)
def test_poisson_sample_has_the_law_of_independent_coins(q: float) -> None:
    """Every subset S of n rows comes out with probability q^|S| (1 - q)^(n - |S|), the law of
    n independent coins: a chi-square test over all 2^n subsets."""
    g = torch.Generator().manual_seed(1)
    n, reps = 5, 40_000
    seen = torch.zeros(2**n)
    weights = 2 ** torch.arange(n)
    for _ in range(reps):
        seen[int(weights[poisson_sample(n, q, g)].sum())] += 1
    sizes = torch.tensor([bin(s).count("1") for s in range(2**n)], dtype=torch.float64)
    expected = reps * q**sizes * (1 - q) ** (n - sizes)
    chi2 = float(((seen - expected) ** 2 / expected).sum())
    dof = 2**n - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof)


def test_poisson_sample_costs_the_batch_not_the_table() -> None:
    """A billion rows at q = 1e-6: n coins would need 4 GB; the batch-sized draw a few kB."""
    import resource

    g = torch.Generator().manual_seed(2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows = poisson_sample(10**9, 1e-6, g)
    assert 850 < len(rows) < 1150 and int(rows.max()) < 10**9 and torch.equal(rows, rows.unique())
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # kB
    assert len(poisson_sample(0, 0.5, g)) == 0 and len(poisson_sample(10, 0.0, g)) == 0
    assert torch.equal(poisson_sample(7, 1.0, g), torch.arange(7))


def test_distinct_uniform_is_a_uniform_subset() -> None:
    g = torch.Generator().manual_seed(3)
    n, k, reps = 6, 2, 30_000
    pairs = torch.zeros(n, n)
    for _ in range(reps):
        a, b = distinct_uniform(n, k, g).tolist()
        assert a < b
        pairs[a, b] += 1
    expected = reps / math.comb(n, k)  # 15 pairs, equally likely
    observed = pairs[torch.triu(torch.ones(n, n, dtype=torch.bool), 1)]
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 14 + 5 * math.sqrt(28)
    with pytest.raises(ValueError):
        distinct_uniform(3, 4, g)


def test_noise_std_is_sigma_c_over_public_batch_size() -> None:
    s = settings(noise_multiplier=1.7, max_grad_norm=0.3, expected_batch_size=40.0)
    g = torch.Generator().manual_seed(0)
    sums = [torch.zeros(100_000), torch.ones(50, 2000)]
    a, b = noisy_gradients(sums, s, g)
    assert a.shape == sums[0].shape and b.shape == sums[1].shape
    assert torch.equal(sums[1], torch.ones(50, 2000))  # the clipped sums themselves are left as they were
    out = torch.cat([a, b.reshape(-1) - 1.0 / 40.0])  # every parameter's own noise, none shared
    assert abs(float(out.std()) / (1.7 * 0.3 / 40.0) - 1) < 0.01
    assert abs(float(out.mean())) < 5 * 1.7 * 0.3 / 40.0 / math.sqrt(200_000)
    assert abs(float(torch.corrcoef(torch.stack([a[:50_000], a[50_000:]]))[0, 1])) < 0.02
    assert noisy_gradients([], s, g) == []


def test_one_sgd_step_is_clipped_sum_over_expected_batch_size() -> None:
    """q = 1, negligible noise, SGD lr = 1: the update is -(sum of clipped grads) / B, with
    B the public constant (not the 50 rows of the batch)."""
    x = data(50)
    model = TinyFlow(seed=3)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ref_model = TinyFlow(seed=3)
    expect = clipped_gradient_sum(ref_model, x, clipping="per_layer", max_grad_norm=0.5, method="hooks")
    s = settings(
        sample_rate=1.0,
        steps=1,
        noise_multiplier=1e-9,
        max_grad_norm=0.5,
        clipping="per_layer",
        optimizer="sgd",
        lr=1.0,
        expected_batch_size=37.0,
    )
    train(model, x, s)
    names = dict(ref_model.named_parameters())
    for k, p in model.named_parameters():
        torch.testing.assert_close(start[k] - p.detach(), expect.grads[names[k]] / 37.0, atol=1e-5, rtol=1e-4)


def test_empty_batches_take_noise_only_steps() -> None:
    model = TinyFlow(seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    s = settings(
        sample_rate=1e-9,
        steps=3,
        noise_multiplier=2.0,
        max_grad_norm=0.5,
        optimizer="sgd",
        lr=1.0,
        expected_batch_size=10.0,
    )
    res = train(model, data(20), s)
    assert res.steps == 3 and all(math.isnan(v) for v in res.losses)
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=False)])
    # three independent N(0, (sigma C / B)^2) steps: std sqrt(3) * 0.1
    assert abs(float(delta.std()) / (math.sqrt(3) * 2.0 * 0.5 / 10.0) - 1) < 0.15


def test_train_result_checkpoints_event_and_callback() -> None:
    model = TinyFlow(seed=2)
    seen: list[tuple[int, float]] = []
    s = settings(steps=7, checkpoint_every=3, clipping="per_unit")
    res = train(model, data(), s, on_step=lambda step, loss: seen.append((step, loss)))
    assert isinstance(res, TrainResult) and res.steps == 7 and len(res.losses) == 7
    assert [step for step, _ in seen] == list(range(1, 8)) and [v for _, v in seen] == res.losses
    assert [step for step, _ in res.checkpoints] == [3, 6, 7]
    assert res.event == PoissonGaussianEvent(0.2, 1.0, 7) == dp_sgd_event(s)
    last = res.checkpoints[-1][1]
    assert set(last) == set(model.state_dict())
    for k, v in model.state_dict().items():
        assert last[k].device.type == "cpu"
        torch.testing.assert_close(last[k], v.detach().cpu())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # checkpoints are copies
    k0 = next(iter(model.state_dict()))
    assert not torch.equal(last[k0], model.state_dict()[k0])
    assert not torch.equal(res.checkpoints[0][1][k0], last[k0])


def test_non_private_baseline_has_no_event_and_learns() -> None:
    x = data(400)
    model = TinyFlow(seed=0, hidden=16)
    res = train(model, x, settings(private=False, steps=80, sample_rate=0.25, lr=1e-2))
    assert res.event is None
    assert sum(res.losses[-10:]) / 10 < sum(res.losses[:10]) / 10 - 1.0


@pytest.mark.parametrize("clipping", ["flat", "per_layer", "per_unit", "sparsify"])
def test_private_training_learns_with_small_noise(clipping: str) -> None:
    x = data(400)
    model = TinyFlow(seed=0, hidden=16)
    s = settings(
        steps=60,
        sample_rate=0.25,
        noise_multiplier=0.3,
        max_grad_norm=5.0,
        clipping=clipping,
        expected_batch_size=100.0,
        lr=2e-2,
    )
    res = train(model, x, s)
    assert all(math.isfinite(v) for v in res.losses)
    assert sum(res.losses[-10:]) / 10 < sum(res.losses[:10]) / 10 - 0.5


def test_deterministic_for_a_noise_seed_and_global_rng_untouched() -> None:
    x = data()
    model = TinyFlow(seed=5)  # (its constructor seeds the global RNG)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = train(model, x, settings(clipping="sparsify", seed=11, noise_seed=11))
    assert torch.equal(torch.get_rng_state(), state)
    b = train(TinyFlow(seed=5), x, settings(clipping="sparsify", seed=11, noise_seed=11))
    c = train(TinyFlow(seed=5), x, settings(clipping="sparsify", seed=11, noise_seed=12))
    assert a.losses == b.losses and a.losses != c.losses
    for (sa, da), (sb, db) in zip(a.checkpoints, b.checkpoints, strict=False):
        assert sa == sb and all(torch.equal(da[k], db[k]) for k in da)


def test_noise_is_not_derived_from_the_public_seed() -> None:
    """Same config seed, no noise seed: the noise comes from OS entropy, so runs differ.
    A noise stream that followed the (public) config seed could be regenerated and removed."""
    x = data()
    a = train(TinyFlow(seed=5), x, settings(seed=11))
    b = train(TinyFlow(seed=5), x, settings(seed=11))
    last_a, last_b = a.checkpoints[-1][1], b.checkpoints[-1][1]
    assert any(not torch.equal(last_a[k], last_b[k]) for k in last_a)


def test_checkpoint_steps_keep_evenly_spaced_states_and_the_last() -> None:
    assert checkpoint_steps(7, 3) == [3, 6, 7] and checkpoint_steps(6, 3) == [3, 6]
    assert checkpoint_steps(0, 3) == [] and checkpoint_steps(2, 50) == [2]
    every = checkpoint_steps(6300, 50)
    assert len(every) == 126 and checkpoint_steps(6300, 50, keep=200) == every
    kept = checkpoint_steps(6300, 50, keep=16)
    assert len(kept) == 16 and kept[-1] == 6300 and kept == sorted(kept) and set(kept) <= set(every)
    gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
    assert max(gaps) - min(gaps) <= 50  # evenly spaced up to rounding
    assert checkpoint_steps(6300, 50, keep=1) == [6300]


def test_the_trainer_holds_only_the_kept_checkpoints() -> None:
    res = train(TinyFlow(seed=2), data(), settings(steps=20, checkpoint_every=2, max_checkpoints=4))
    assert [step for step, _ in res.checkpoints] == checkpoint_steps(20, 2, keep=4) == [2, 8, 14, 20]


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        settings(sample_rate=0.0)
    with pytest.raises(ValueError):
        settings(noise_multiplier=0.0)
    with pytest.raises(ValueError):
        settings(clipping="global")
    with pytest.raises(ValueError):
        settings(max_checkpoints=0)
    settings(noise_multiplier=0.0, private=False)  # allowed for the baseline


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("clipping", ["flat", "per_layer", "per_unit", "sparsify"])
def test_trains_on_cuda(clipping: str) -> None:
    model = TinyFlow(seed=0)
    res = train(model, data(), settings(device="cuda", clipping=clipping))
    assert res.steps == 7 and all(v.device.type == "cpu" for v in res.checkpoints[-1][1].values())
    assert next(model.parameters()).device.type == "cuda"
    assert all(math.isfinite(v) for v in res.losses)
    assert any(not torch.equal(v, res.checkpoints[0][1][k]) for k, v in res.checkpoints[-1][1].items())


def test_seeds_are_independent_and_the_public_seed_feeds_nothing() -> None:
    from privflow.privacy.noise import independent_seeds

    seeds = independent_seeds(5, 11)
    assert seeds == independent_seeds(5, 11) and len(set(seeds)) == 5
    assert all(0 <= s < 2**63 for s in seeds)
    assert max(seeds) - min(seeds) > 1000  # not s, s+1, s+2
    assert len(set(independent_seeds(5))) == 5 and independent_seeds(5) != independent_seeds(5)
    x = data()
    a = train(TinyFlow(seed=5), x, settings(seed=1, noise_seed=7))
    b = train(TinyFlow(seed=5), x, settings(seed=2, noise_seed=7))
    assert a.losses == b.losses


def test_dequantization_noise_comes_from_an_explicit_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with categorical columns: every dequantization draw during training is made from
    an explicit generator passed by the trainer, and the global RNG is restored."""
    from privflow.models import build_flow

    torch.manual_seed(0)
    model = build_flow("dphflow", [None, 3, None, 4], blocks=1, hidden=8)
    g = torch.Generator().manual_seed(0)
    x = torch.stack(
        [
            torch.rand(120, generator=g),
            torch.randint(0, 3, (120,), generator=g).float(),
            torch.rand(120, generator=g),
            torch.randint(0, 4, (120,), generator=g).float(),
        ],
        1,
    )
    deq = model.dequantizer
    real = deq.noise
    gens: list[object] = []

    def spy(n, like, generator=None):  # noqa: ANN001, ANN202
        gens.append(generator)
        return real(n, like, generator)

    monkeypatch.setattr(deq, "noise", spy)
    state = torch.get_rng_state()
    res = train(model, x, settings(steps=3, sample_rate=0.3, noise_seed=4))
    assert torch.equal(torch.get_rng_state(), state)
    assert len(gens) >= 3 and all(isinstance(gen, torch.Generator) for gen in gens)
    assert len({id(gen) for gen in gens}) == 1  # one dequantization stream for the run
    assert res.nonfinite_examples == 0 and all(math.isfinite(v) for v in res.losses)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_the_users_error() -> None:
    """The trainer called from Python (not through the CLI's pre-flight) refuses CUDA it cannot
    use with the user-error class, before any step."""
    from privflow.core.errors import DeviceUnavailable

    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        train(TinyFlow(seed=0), data(), settings(device="cuda"))
