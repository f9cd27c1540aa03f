"""Mechanisms: the noise has the law and scale each file claims, and one row moves the
noiseless statistic by no more than the stated sensitivity (add/remove adjacency)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privflow.privacy import noise
from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.accounting.events import GaussianEvent, LaplaceEvent, PureDPEvent, RepeatedEvent
from privflow.privacy.mechanisms import dp_mog, dp_stats
from privflow.privacy.mechanisms.dp_mog import (
    MoGParams,
    dp_em_mog,
    dp_mog_event,
    em_sensitivity,
    em_statistics,
    init_mog,
)
from privflow.privacy.mechanisms.dp_stats import (
    dp_mean_std,
    dp_stats_event,
    mean_std_from_statistics,
    mean_std_sensitivity,
    mean_std_statistics,
    release_mean_std_statistics,
)
from privflow.privacy.mechanisms.gaussian import gaussian_event, gaussian_mechanism
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism
from privflow.privacy.mechanisms.report_noisy_max import (
    clipped_loglik_scores,
    relative_loglik_scores,
    report_noisy_max,
    rnm_event,
)
from tests.stats_checks import FALSE_ALARM

DELTA = 1e-5


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def neighbours(x: np.ndarray, extra_rows: np.ndarray) -> list[np.ndarray]:
    """x with one row removed (each of a few), and x with one extra row appended (each given)."""
    out = [np.delete(x, i, axis=0) for i in (0, len(x) // 2, len(x) - 1)]
    out += [np.vstack([x, row[None]]) for row in extra_rows]
    return out


def adversarial_rows(d: int, clip: float, generator: np.random.Generator) -> np.ndarray:
    """Corners of the box, far outside it, NaN, and random rows."""
    corners = np.array([np.full(d, clip), np.full(d, -clip), np.where(np.arange(d) % 2, clip, -clip)])
    wild = np.array([np.full(d, 1e6), np.full(d, -np.inf), np.full(d, np.nan), np.zeros(d)])
    return np.vstack([corners, wild, generator.normal(0, 3 * clip, size=(20, d))])


# ---------------------------------------------------------------------------- Gaussian, Laplace


@pytest.mark.real_noise
def test_gaussian_noise_law_and_scale() -> None:
    value = np.full(40_000, 3.0)
    out = gaussian_mechanism(value, l2_sensitivity=2.0, noise_multiplier=1.5)
    noise = out - value
    assert stats.kstest(noise, stats.norm(scale=3.0).cdf).pvalue > FALSE_ALARM
    assert stats.kstest(noise, stats.norm(scale=3.3).cdf).pvalue < 1e-6  # a 10% wrong scale is caught
    assert out.shape == value.shape
    again = gaussian_mechanism(value, 2.0, 1.5)
    assert not np.array_equal(out, again)  # fresh entropy per call


def test_gaussian_event_matches_exact_epsilon() -> None:
    from privflow.privacy.accounting.calibration import epsilon_for_gaussian

    assert gaussian_event(5.0) == GaussianEvent(5.0)
    assert PLDAccountant().epsilon([gaussian_event(5.0)], DELTA) == pytest.approx(
        epsilon_for_gaussian(5.0, DELTA), rel=1e-4
    )


def _opendp_nm_for_rho(rho: float) -> float:
    """The Gaussian multiplier whose zCDP is rho: sigma / Delta = 1 / sqrt(2 rho)."""
    return 1.0 / math.sqrt(2.0 * rho)


@pytest.mark.parametrize("sens,nm", [(1.0, 1.0), (1 / 3, 1.7), (math.sqrt(1 + 2 * 7), 0.37), (30.0, 12.5)])
def test_gaussian_event_is_no_stronger_than_opendp_certifies(sens: float, nm: float) -> None:
    """OpenDP's zCDP map of the stated sensitivity, for the measurement the mechanism samples
    from, is at most the event's rho; so the event's PLD epsilon is at least that of the
    Gaussian OpenDP certifies."""
    meas = noise.gaussian_measurement(sens, nm)
    rho = meas.map(sens)
    assert rho <= 1.0 / (2 * nm * nm)
    assert rho == pytest.approx(1.0 / (2 * nm * nm), rel=1e-9)  # and no slack wasted
    certified = _opendp_nm_for_rho(rho)
    assert certified >= nm
    acc = PLDAccountant()
    assert acc.epsilon([gaussian_event(nm)], DELTA) >= acc.epsilon([GaussianEvent(certified)], DELTA) - 1e-9
    # a measurement with too little noise would be caught by the same comparison
    import opendp.prelude as dp

    weak = dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float), scale=0.9 * nm * sens
    )
    assert weak.map(sens) > 1.0 / (2 * nm * nm)


@pytest.mark.parametrize("sens,nm", [(1.0, 1.0), (1 / 3, 1.7), (30.0, 1 / 0.37), (1.0, 1 / 0.05)])
def test_laplace_event_is_no_stronger_than_opendp_certifies(sens: float, nm: float) -> None:
    meas = noise.laplace_measurement(sens, nm)
    eps = meas.map(sens)
    assert eps <= 1.0 / nm
    assert eps == pytest.approx(1.0 / nm, rel=1e-9)
    assert PLDAccountant().epsilon([laplace_event(nm)], DELTA) >= eps - 1e-3  # PLD of pure eps at small delta


@pytest.mark.real_noise
def test_laplace_noise_law_scale_and_loss_bound() -> None:
    value = np.zeros(50_000)  # a 10% wrong scale then fails the KS test at p < 1e-12
    nm, sens = 2.0, 0.5
    out = laplace_mechanism(value, l1_sensitivity=sens, noise_multiplier=nm)
    b = nm * sens
    assert stats.kstest(out, stats.laplace(scale=b).cdf).pvalue > FALSE_ALARM
    assert stats.kstest(out, stats.laplace(scale=1.1 * b).cdf).pvalue < 1e-6
    # Privacy loss at every sampled output between neighbouring values |v - v'| = sens: <= 1/nm.
    loss = np.abs(stats.laplace(scale=b).logpdf(out) - stats.laplace(loc=sens, scale=b).logpdf(out))
    assert loss.max() <= 1.0 / nm + 1e-12
    assert loss.max() > 0.99 / nm  # and the bound is attained: the event is not over-claimed
    assert laplace_event(nm) == LaplaceEvent(nm)
    assert PLDAccountant().epsilon([laplace_event(nm)], DELTA) == pytest.approx(1 / nm, rel=1e-3)


@pytest.mark.real_noise
def test_validation_gate_call_without_rng_uses_the_exact_laplace() -> None:
    """The gate's call shape laplace_mechanism(np.array([x]), 1.0, nm): count + Laplace(nm)."""
    from privflow.privacy.mechanisms.validation_gate import gate, gate_event

    event = gate_event(0.5)
    draws = np.array([gate(10, 1e9, event).noisy_failing for _ in range(3000)])
    assert stats.kstest(draws - 10.0, stats.laplace(scale=2.0).cdf).pvalue > FALSE_ALARM
    assert noise.laplace_measurement(1.0, event.noise_multiplier).map(1.0) <= 0.5


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_mechanisms_reject_bad_scales(bad: float) -> None:
    with pytest.raises(ValueError):
        gaussian_mechanism(np.zeros(2), 1.0, bad)
    with pytest.raises(ValueError):
        laplace_mechanism(np.zeros(2), bad, 1.0)


def test_mechanisms_reject_non_finite_values() -> None:
    """OpenDP passes NaN through silently; the wrappers refuse it (a statistic must be bounded)."""
    for mech in (gaussian_mechanism, laplace_mechanism):
        with pytest.raises(ValueError):
            mech(np.array([1.0, np.nan]), 1.0, 1.0)
        with pytest.raises(ValueError):
            mech(np.array([np.inf]), 1.0, 1.0)
    assert gaussian_mechanism(np.zeros((2, 3)), 1.0, 1.0).shape == (2, 3)
    assert laplace_mechanism(np.zeros(0), 1.0, 1.0).shape == (0,)


# ---------------------------------------------------------------------------- Report-Noisy-Max


def exp_noise_rnm_probs(scores: np.ndarray, scale: float) -> np.ndarray:
    """P(argmax_i s_i + E_i = j) for i.i.d. E_i ~ Exponential(mean = scale), by quadrature."""
    from scipy import integrate

    s = np.asarray(scores, dtype=float)
    out = []
    for j in range(s.size):
        others = np.delete(s, j)

        def f(t: float, j: int = j, others: np.ndarray = others) -> float:
            # Exponential(loc, scale) density at t >= loc = s[j] times the others' CDFs, written
            # out (scipy.stats' frozen distributions cost ~100 us per evaluation inside quad)
            cdf = -np.expm1(-np.maximum(t - others, 0.0) / scale)
            return math.exp(-(t - s[j]) / scale) / scale * float(np.prod(cdf))

        out.append(integrate.quad(f, s[j], s.max() + 60 * scale, limit=200)[0])
    p = np.array(out)
    assert p.sum() == pytest.approx(1.0, abs=1e-6)
    return p


def test_rnm_picks_max_at_large_epsilon() -> None:
    scores = np.array([0.0, 1.0, 5.0, 2.0, 4.0])
    picks = [report_noisy_max(scores, sensitivity=1.0, epsilon=100.0)[0] for _ in range(2000)]
    assert np.mean(np.array(picks) == 2) > 0.99


@pytest.mark.real_noise
def test_rnm_is_uniform_at_tiny_epsilon() -> None:
    scores = np.array([0.0, 10.0, 50.0, 20.0, 40.0])
    picks = [report_noisy_max(scores, sensitivity=1.0, epsilon=1e-6)[0] for _ in range(5000)]
    counts = np.bincount(picks, minlength=5)
    assert stats.chisquare(counts).pvalue > FALSE_ALARM


@pytest.mark.real_noise
def test_rnm_distribution_is_exponential_noise_at_scale_2_sens_over_eps() -> None:
    """General scores: exponential noise of scale 2*sens/eps (permute-and-flip's law)."""
    scores, sens, eps = np.array([0.0, 1.0, 2.0, 3.0]), 0.5, 0.5
    n = 20_000
    counts = np.bincount([report_noisy_max(scores, sens, eps)[0] for _ in range(n)], minlength=4)
    assert stats.chisquare(counts, n * exp_noise_rnm_probs(scores, 2 * sens / eps)).pvalue > FALSE_ALARM
    wrong = exp_noise_rnm_probs(scores, sens / eps)  # the monotone scale would be caught
    assert stats.chisquare(counts, n * wrong).pvalue < 1e-6


@pytest.mark.real_noise
def test_rnm_monotone_uses_scale_sens_over_eps() -> None:
    scores, sens, eps = np.array([0.0, 1.0, 2.0, 3.0]), 0.5, 0.5
    n = 20_000
    counts = np.bincount([report_noisy_max(scores, sens, eps, monotone=True)[0] for _ in range(n)], minlength=4)
    assert stats.chisquare(counts, n * exp_noise_rnm_probs(scores, sens / eps)).pvalue > FALSE_ALARM
    general = exp_noise_rnm_probs(scores, 2 * sens / eps)
    assert stats.chisquare(counts, n * general).pvalue < 1e-6


@pytest.mark.parametrize("monotone", [False, True])
@pytest.mark.parametrize("sens,eps", [(1.0, 1.0), (30.0, 0.1), (1 / 3, 0.37)])
def test_rnm_event_is_no_stronger_than_opendp_certifies(sens: float, eps: float, monotone: bool) -> None:
    """Each pick's OpenDP map (pure epsilon) is at most the event's per-pick epsilon."""
    meas = noise.noisy_max_measurement(sens, eps, monotone)
    certified = meas.map(sens)
    assert certified <= eps and certified == pytest.approx(eps, rel=1e-9)
    event = rnm_event(eps, 1)
    assert PLDAccountant().epsilon([event], DELTA) >= certified - 1e-3


def test_rnm_top_k_peels_k_opendp_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """k picks are k OpenDP noisy-max measurements on the remaining candidates: the event's
    k repetitions of one pick's epsilon is what is spent."""
    from privflow.privacy.mechanisms import report_noisy_max as rnm_module

    calls: list[int] = []
    real = rnm_module.exact_noisy_max

    def spy(scores, sensitivity, epsilon, monotone):  # noqa: ANN001, ANN202
        calls.append(len(scores))
        assert noise.noisy_max_measurement(sensitivity, epsilon, monotone).map(sensitivity) <= epsilon
        return real(scores, sensitivity, epsilon, monotone)

    monkeypatch.setattr(rnm_module, "exact_noisy_max", spy)
    picks = report_noisy_max(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), 1.0, 0.3, k=3)
    assert len(picks) == 3 == len(set(picks)) and calls == [5, 4, 3]
    assert rnm_event(0.3, 3) == RepeatedEvent(PureDPEvent(0.3), 3)


@pytest.mark.real_noise
def test_rnm_top_k_distinct_and_equal_to_sequential_picks() -> None:
    scores, sens, eps = np.array([0.0, 1.0, 2.0, 3.0]), 1.0, 2.0
    for k in (1, 2, 4):
        picks = report_noisy_max(scores, sens, eps, k=k)
        assert len(picks) == k == len(set(picks))
    # Ordered pairs (first, second) against two sequential exponential-noise picks.
    scale = 2 * sens / eps
    first = exp_noise_rnm_probs(scores, scale)
    expected = {}
    for i in range(4):
        rest = [j for j in range(4) if j != i]
        second = exp_noise_rnm_probs(scores[rest], scale)
        for pos, j in enumerate(rest):
            expected[(i, j)] = first[i] * second[pos]
    n = 20_000
    observed: dict[tuple[int, int], int] = {key: 0 for key in expected}
    for _ in range(n):
        a, b = report_noisy_max(scores, sens, eps, k=2)
        observed[(a, b)] += 1
    keys = sorted(expected)
    assert stats.chisquare([observed[key] for key in keys], [n * expected[key] for key in keys]).pvalue > FALSE_ALARM


def test_rnm_event_is_k_picks_of_epsilon() -> None:
    event = rnm_event(0.1, k=3)
    assert event == RepeatedEvent(PureDPEvent(0.1), 3)
    assert 0.0 < PLDAccountant().epsilon([event], DELTA) <= 0.3 + 1e-6
    with pytest.raises(ValueError):
        report_noisy_max(np.array([1.0, 2.0]), 1.0, 1.0, k=3)
    with pytest.raises(ValueError):
        report_noisy_max(np.array([1.0, np.nan]), 1.0, 1.0)


def test_clipped_loglik_scores_sensitivity_under_add_remove() -> None:
    g = rng(7)
    low, high = -20.0, 10.0
    loglik = g.normal(-5, 8, size=(6, 300))
    scores, sens = clipped_loglik_scores(loglik, low, high)
    assert sens == high - low
    assert scores == pytest.approx((np.clip(loglik, low, high) - low).sum(axis=1))
    columns = [g.normal(-5, 30, size=6) for _ in range(20)]
    columns += [np.full(6, np.inf), np.full(6, -np.inf), np.full(6, np.nan), np.array([1e9, -1e9, 0, np.nan, 5, -50])]
    for col in columns:  # add one row
        added, _ = clipped_loglik_scores(np.hstack([loglik, col[:, None]]), low, high)
        shift = added - scores
        assert np.all(shift >= 0) and np.all(shift <= sens + 1e-9)
    for i in (0, 150, 299):  # remove one row
        removed, _ = clipped_loglik_scores(np.delete(loglik, i, axis=1), low, high)
        shift = scores - removed
        assert np.all(shift >= -1e-9) and np.all(shift <= sens + 1e-9)
    # The bound is attained: a row at `high` in every checkpoint moves every score by exactly sens.
    added, _ = clipped_loglik_scores(np.hstack([loglik, np.full((6, 1), high)]), low, high)
    assert added - scores == pytest.approx(np.full(6, sens))


def test_relative_loglik_scores_sensitivity_under_add_remove() -> None:
    g = rng(17)
    clip = 0.75
    loglik = g.normal(-5, 8, size=(5, 1)) + g.normal(0, 0.6, size=(5, 400))
    scores, sens = relative_loglik_scores(loglik, clip)
    assert sens == clip
    ref = np.median(loglik, axis=0)
    assert scores == pytest.approx(np.clip(loglik - ref, -clip, clip).sum(axis=1))
    columns = [g.normal(-5, 30, size=5) for _ in range(20)]
    columns += [np.full(5, np.inf), np.full(5, np.nan), np.array([1e9, -1e9, 0, np.nan, 5]), np.array([0, 0, 9, -9, 0])]
    for col in columns:  # add one row: every score moves by at most clip, either way
        added, _ = relative_loglik_scores(np.hstack([loglik, col[:, None]]), clip)
        assert np.all(np.abs(added - scores) <= sens + 1e-9)
    for i in (0, 200, 399):  # remove one row
        removed, _ = relative_loglik_scores(np.delete(loglik, i, axis=1), clip)
        assert np.all(np.abs(scores - removed) <= sens + 1e-9)
    # The bound is attained in both directions, so the scores are not monotone.
    added, _ = relative_loglik_scores(np.hstack([loglik, np.array([[9.0], [-9.0], [0.0], [0.0], [0.0]])]), clip)
    assert (added - scores)[:2] == pytest.approx([clip, -clip])


def test_relative_loglik_scores_by_chunks_of_rows_equal_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scores are summed over chunks of rows (bounded memory on large selection splits):
    chunks that split the rows anywhere, NaN and infinite rows included, give the same sums."""
    from privflow.privacy.mechanisms import report_noisy_max

    g = rng(19)
    loglik = g.normal(-5, 3, size=(4, 1)) + g.normal(0, 0.8, size=(4, 101))
    loglik[1, 7], loglik[:, 50], loglik[2, 99] = np.nan, np.nan, -np.inf
    whole, _ = relative_loglik_scores(loglik, 0.5)
    for chunk in (1, 7, 100):
        monkeypatch.setattr(report_noisy_max, "_SCORE_CHUNK_ROWS", chunk)
        assert relative_loglik_scores(loglik, 0.5)[0] == pytest.approx(whole, abs=1e-12)


def test_relative_scores_separate_checkpoints_that_absolute_scores_cannot() -> None:
    """Two checkpoints 0.05 nats/row apart on 3,000 rows, selection epsilon 0.03: the relative
    score (sensitivity 1) picks the better one far more often than the absolute one (30)."""
    g = rng(18)
    base = g.normal(-8, 4, size=3000)
    loglik = np.stack([base, base + 0.05 + g.normal(0, 0.1, size=3000)])
    rel, rel_sens = relative_loglik_scores(loglik, 1.0)
    ab, ab_sens = clipped_loglik_scores(loglik, -20.0, 10.0)
    wins_rel = sum(report_noisy_max(rel, rel_sens, 0.03) == [1] for _ in range(200))
    wins_abs = sum(report_noisy_max(ab, ab_sens, 0.03, monotone=True) == [1] for _ in range(200))
    assert wins_rel >= 170 and wins_abs <= 150


# ---------------------------------------------------------------------------- DP mean / std


def test_mean_std_statistics_sensitivity_is_honest_and_tight() -> None:
    g = rng(8)
    d, clip = 5, 2.0
    x = g.normal(0, 1.5, size=(200, d))
    base = mean_std_statistics(x, clip)
    bound = mean_std_sensitivity(d)
    shifts = [np.linalg.norm(mean_std_statistics(y, clip) - base) for y in neighbours(x, adversarial_rows(d, clip, g))]
    assert max(shifts) <= bound + 1e-9
    assert max(shifts) == pytest.approx(bound)  # a corner row attains it


def test_dp_mean_std_noise_law_and_scale() -> None:
    g = rng(9)
    d, clip, nm = 3, 2.0, 1.3
    x = g.normal(0.5, 1.0, size=(500, d))
    clean = mean_std_statistics(x, clip)
    releases = np.array([release_mean_std_statistics(x, clip, nm) for _ in range(4000)])
    residual = releases - clean
    scale = nm * mean_std_sensitivity(d)
    assert residual.std(axis=0) == pytest.approx(np.full(1 + 2 * d, scale), rel=0.05)
    assert stats.kstest(residual.ravel(), stats.norm(scale=scale).cdf).pvalue > FALSE_ALARM
    assert np.abs(residual.mean(axis=0)).max() < 5 * scale / math.sqrt(4000)


def test_dp_mean_std_is_accurate_at_low_noise_and_fresh() -> None:
    g = rng(10)
    clip = 3.0
    x = np.column_stack([g.normal(1.0, 0.5, 20_000), g.normal(-0.5, 2.0, 20_000)])
    mean, std = dp_mean_std(x, clip, noise_multiplier=0.5)
    c = np.clip(x, -clip, clip)
    assert mean == pytest.approx(c.mean(axis=0), abs=0.01)
    assert std == pytest.approx(c.std(axis=0), abs=0.01)
    again = dp_mean_std(x, clip, noise_multiplier=0.5)
    assert not np.array_equal(mean, again[0])  # no seed can replay the noise


def test_dp_mean_std_post_processing_guards() -> None:
    g = rng(12)
    clip = 2.0
    x = g.normal(0, 1, size=(5, 4))  # five rows under enormous noise
    for _seed in range(50):
        mean, std = dp_mean_std(x, clip, noise_multiplier=1e4)
        assert np.all(np.isfinite(mean)) and np.all(np.abs(mean) <= clip)
        assert np.all(std >= 1e-2 * clip - 1e-12) and np.all(std <= clip + 1e-12)
    mean, std = mean_std_from_statistics(np.array([-5.0, 1.0, 1.0]), clip)  # negative noisy count
    assert np.isfinite(mean).all() and np.isfinite(std).all()


def test_shrinkage_leaves_a_large_tables_release_and_replaces_a_noise_only_one() -> None:
    """The released moments are shrunk to the public prior by their own noise: a negligible change
    at 32,000 rows, the prior itself when the noise dwarfs a few hundred rows (the start model was
    one row at the bounds there)."""
    rng = np.random.default_rng(0)
    clip, prior, sigma = 7.0, float(np.pi / np.sqrt(3.0)), 50.0
    d = 4
    big = mean_std_statistics(rng.normal(1.0, 2.0, size=(32_000, d)), clip)
    raw = mean_std_from_statistics(big, clip, 0.5)
    shrunk = mean_std_from_statistics(big, clip, 0.5, noise_multiplier=sigma, prior_std=prior)
    assert np.allclose(shrunk[0], raw[0], rtol=2e-2) and np.allclose(shrunk[1], raw[1], rtol=5e-2)
    se = clip * sigma * mean_std_sensitivity(d) / 32_000  # the noise on the released mean
    assert np.allclose(shrunk[0], raw[0] * prior**2 / (prior**2 + se**2))  # the stated weight
    # a small table whose noisy count and sums put the mean at the clip: then the floor std
    small = np.array([3.0, *[40.0] * d, *[0.0] * d])  # a noisy count of 3 against sums of 40
    raw = mean_std_from_statistics(small, clip, 0.5)
    assert np.allclose(np.abs(raw[0]), clip) and np.allclose(raw[1], 0.5)
    mean, std = mean_std_from_statistics(small, clip, 0.5, noise_multiplier=sigma, prior_std=prior)
    assert np.all(np.abs(mean) < 0.05) and np.allclose(std, prior, rtol=1e-2)


def test_dp_stats_event_and_calibration() -> None:
    sigma = dp_stats.noise_for_epsilon(0.1, DELTA)
    assert dp_stats_event(sigma) == GaussianEvent(sigma)
    assert PLDAccountant().epsilon([dp_stats_event(sigma)], DELTA) == pytest.approx(0.1, rel=1e-3)


# ---------------------------------------------------------------------------- DP-MoG (DP-EM)


def random_params(k: int, d: int, clip: float, g: np.random.Generator) -> MoGParams:
    w = g.dirichlet(np.ones(k))
    return MoGParams(w, g.uniform(-clip, clip, size=(k, d)), g.uniform(0.05, clip, size=(k, d)))


def test_em_statistics_sensitivity_is_honest_and_tight() -> None:
    g = rng(13)
    k, d, clip = 4, 3, 2.0
    x = g.normal(0, 1.5, size=(150, d))
    bound = em_sensitivity(d)
    worst = 0.0
    for _ in range(5):
        params = random_params(k, d, clip, g)
        base = em_statistics(x, params, clip)
        for y in neighbours(x, adversarial_rows(d, clip, g)):
            worst = max(worst, float(np.linalg.norm(em_statistics(y, params, clip) - base)))
    assert worst <= bound + 1e-9
    # Tight: one component owns a corner row completely.
    owner = MoGParams(np.array([0.5, 0.5]), np.array([np.full(d, clip), np.full(d, -clip)]), np.full((2, d), 0.1))
    shift = em_statistics(np.vstack([x, np.full((1, d), clip)]), owner, clip) - em_statistics(x, owner, clip)
    assert np.linalg.norm(shift) == pytest.approx(bound, rel=1e-6)


def test_dp_em_noise_law_and_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every release inside dp_em_mog adds N(0, (nm * sqrt(1+2d))^2) to the exact statistics."""
    calls: list[tuple[np.ndarray, np.ndarray, float, float]] = []
    real = dp_mog.gaussian_mechanism

    def spy(value, l2_sensitivity, noise_multiplier):  # noqa: ANN001, ANN202
        out = real(value, l2_sensitivity, noise_multiplier)
        calls.append((np.array(value), out, l2_sensitivity, noise_multiplier))
        return out

    monkeypatch.setattr(dp_mog, "gaussian_mechanism", spy)
    g = rng(14)
    k, d, clip, nm, iters = 5, 3, 2.0, 0.7, 150
    x = g.normal(0, 1, size=(400, d))
    dp_em_mog(x, k, iters, clip, nm, init_seed=15)
    assert len(calls) == iters
    assert all(s == em_sensitivity(d) and m == nm for _, _, s, m in calls)
    residual = np.concatenate([(out - clean).ravel() for clean, out, _, _ in calls])
    scale = nm * em_sensitivity(d)
    assert residual.std() == pytest.approx(scale, rel=0.03)
    assert stats.kstest(residual, stats.norm(scale=scale).cdf).pvalue > FALSE_ALARM


def test_dp_em_recovers_two_clusters_at_low_noise() -> None:
    g = rng(16)
    n = 6000
    x = np.vstack([g.normal([-2, 1], [0.5, 0.3], size=(n, 2)), g.normal([2, -1], [0.7, 0.4], size=(n, 2))])
    params = dp_em_mog(x, 2, 25, 4.0, noise_multiplier=1.0, init_seed=17)
    order = np.argsort(params.means[:, 0])
    assert params.means[order] == pytest.approx(np.array([[-2, 1], [2, -1]]), abs=0.05)
    assert params.stds[order] == pytest.approx(np.array([[0.5, 0.3], [0.7, 0.4]]), abs=0.05)
    assert params.weights == pytest.approx([0.5, 0.5], abs=0.02)


def test_dp_em_post_processing_guards_and_public_init() -> None:
    g = rng(18)
    k, d, clip = 4, 3, 2.0
    x = g.normal(0, 1, size=(30, d))
    for seed in range(10):
        p = dp_em_mog(x, k, 5, clip, noise_multiplier=1e3, init_seed=seed)
        assert p.weights.sum() == pytest.approx(1.0) and np.all(p.weights >= 1e-2 / k / 2)
        assert np.all(np.abs(p.means) <= clip) and np.all(np.isfinite(p.stds))
        assert np.all(p.stds >= 0.05 * clip - 1e-12) and np.all(p.stds <= clip + 1e-12)
    # The starting point depends on the seed alone (no argument carries data).
    a, b = init_mog(k, d, clip, rng(3)), init_mog(k, d, clip, rng(3))
    assert np.array_equal(a.means, b.means) and np.all(np.abs(a.means) <= clip)
    # the noise is not replayable from the (public) init seed
    assert not np.array_equal(
        dp_em_mog(x, k, 3, clip, 0.5, init_seed=5).means, dp_em_mog(x, k, 3, clip, 0.5, init_seed=5).means
    )


def test_dp_mog_event_and_calibration() -> None:
    iters = 10
    sigma = dp_mog.noise_for_epsilon(0.2, DELTA, iters)
    assert dp_mog_event(sigma, iters) == RepeatedEvent(GaussianEvent(sigma), iters)
    assert PLDAccountant().epsilon([dp_mog_event(sigma, iters)], DELTA) == pytest.approx(0.2, rel=0.01)


@pytest.mark.parametrize("d", [1, 4, 20])
def test_dp_stats_and_dp_mog_events_are_no_stronger_than_opendp_certifies(d: int) -> None:
    """Both release a vector of L2 sensitivity sqrt(1 + 2d) through the Gaussian measurement."""
    nm_stats = dp_stats.noise_for_epsilon(0.3, DELTA)
    rho = noise.gaussian_measurement(mean_std_sensitivity(d), nm_stats).map(mean_std_sensitivity(d))
    assert rho <= 1.0 / (2 * dp_stats_event(nm_stats).noise_multiplier ** 2)
    iters = 7
    nm_mog = dp_mog.noise_for_epsilon(0.3, DELTA, iters)
    per_iter = noise.gaussian_measurement(em_sensitivity(d), nm_mog).map(em_sensitivity(d))
    event = dp_mog_event(nm_mog, iters)
    assert per_iter <= 1.0 / (2 * event.event.noise_multiplier**2)
    # T releases compose in zCDP to T * rho; the event's PLD epsilon is at least that Gaussian's
    total = GaussianEvent(1.0 / math.sqrt(2 * iters * per_iter))
    assert PLDAccountant().epsilon([event], DELTA) >= PLDAccountant().epsilon([total], DELTA) - 1e-3


# ---------------------------------------------------------------------------- leave-one-out


def test_dp_em_releases_move_within_sensitivity_leave_one_out() -> None:
    """The statistics released at every DP-EM iteration (fixed previous parameters) move by at most
    sqrt(1 + 2d) when one row is removed or an extreme one added."""
    g = rng(21)
    k, d, clip = 3, 4, 1.5
    x = g.normal(0, 1, size=(120, d))
    params = init_mog(k, d, clip, rng(1))
    bound = em_sensitivity(d)
    base = em_statistics(x, params, clip)
    shifts = [
        np.linalg.norm(em_statistics(y, params, clip) - base) for y in neighbours(x, adversarial_rows(d, clip, g))
    ]
    assert max(shifts) <= bound + 1e-9 and max(shifts) > 0.5


def test_validation_gate_count_moves_by_at_most_one(tmp_path) -> None:  # noqa: ANN001
    """The count the gate releases (rows failing any row check, from privflow.data.validation) changes
    by at most 1 -- its stated L1 sensitivity -- when a row is removed or a bad row added."""
    import polars as pl

    from privflow.data.schema import Schema
    from privflow.data.validation import validate

    schema = Schema.model_validate(
        {
            "dataset": {"name": "toy"},
            "columns": [
                {"name": "age", "type": "integer", "bounds": [18, 90]},
                {"name": "color", "type": "categorical", "categories": ["red", "green", "blue"]},
            ],
        }
    )
    ages = ["20", "30", "200", "40", "x", "55", "17", "60"]  # three bad ages
    colors = ["red", "green", "blue", "purple", "red", "green", "blue", "red"]  # one bad color (same row as a good age)
    df = pl.DataFrame({"age": ages, "color": colors})

    def count(frame: pl.DataFrame) -> tuple[int, int]:
        seen: list[tuple[int, int]] = []

        def gate(failing: int, passing: int) -> bool:
            seen.append((failing, passing))
            return False

        validate(frame, schema, "quarantine", tmp_path / "q.csv", gate)
        assert len(seen) == 1
        return seen[0]

    base = count(df)
    assert base == (4, 4)
    extra = pl.DataFrame({"age": ["1000"], "color": ["nope"]})  # fails two checks, counts once
    good = pl.DataFrame({"age": ["33"], "color": ["red"]})
    variants = [df.slice(0, i).vstack(df.slice(i + 1)) for i in range(len(df))] + [df.vstack(extra), df.vstack(good)]
    # the released pair (failing, passing) moves by at most 1 in L1: its stated sensitivity
    changes = [abs(f - base[0]) + abs(p - base[1]) for f, p in map(count, variants)]
    assert max(changes) == 1


def test_dp_em_sums_its_statistics_over_chunks_of_rows(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """DP-EM reads rows a chunk at a time (rows on disk in a streamed run): with the noise made
    negligible, any chunking, and rows given as a file, fit the mixture fitted on the whole array."""
    from privflow.data.chunked import DiskRows
    from privflow.privacy.mechanisms import dp_mog

    g = rng(23)
    x = np.concatenate([g.normal(-2, 0.5, size=(300, 2)), g.normal(1.5, 0.7, size=(200, 2))])
    whole = dp_em_mog(x, 2, 6, 4.0, noise_multiplier=1e-9, init_seed=3)
    on_disk = DiskRows(tmp_path / "z.f32", 2)
    on_disk.append(x)
    for chunk in (1, 7, 499):
        monkeypatch.setattr(dp_mog, "EM_CHUNK_ROWS", chunk)
        for rows in (x, on_disk):
            p = dp_em_mog(rows, 2, 6, 4.0, noise_multiplier=1e-9, init_seed=3)
            tol = 1e-9 if rows is x else 1e-5  # the file holds float32
            np.testing.assert_allclose(p.means, whole.means, atol=tol)
            np.testing.assert_allclose(p.stds, whole.stds, atol=tol)
            np.testing.assert_allclose(p.weights, whole.weights, atol=tol)
