"""The one-run audit's epsilon lower bound (Steinke, Nasr & Jagielski 2023) and its pieces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privflow.privacy.audit import epsilon_lower_bound, guesses, inclusion_coins, mutate, p_value
from privflow.privacy.dpsgd.dp_sgd import TrainSettings


def test_chance_level_gives_zero() -> None:
    assert epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 200, 0, 1e-5) == 0.0


def test_p_value_at_eps_zero_is_a_fair_binomial_tail() -> None:
    assert p_value(100, 20, 15, 0.0, 0.0) == pytest.approx(stats.binom.sf(14, 20, 0.5))


def test_matches_direct_binomial_computation_without_delta() -> None:
    # all r correct, delta = 0: P[Bin(r, q) >= r] = q^r = 0.05 -> eps = log(q / (1 - q))
    q = 0.05 ** (1 / 100)
    assert epsilon_lower_bound(1000, 100, 100, 0.0) == pytest.approx(math.log(q / (1 - q)), rel=1e-6)
    eps = epsilon_lower_bound(1000, 100, 90, 0.0)
    qe = 1 / (1 + math.exp(-eps))
    assert stats.binom.sf(89, 100, qe) == pytest.approx(0.05, rel=1e-4)


def _reference_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Steinke, Nasr & Jagielski's ``p_value_DP_audit`` (their Appendix D), term by term."""
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    beta = stats.binom.sf(v - 1, r, q)
    alpha, total = 0.0, 0.0
    for i in range(1, v + 1):
        total += stats.binom.pmf(v - i, r, q)
        if total > i * alpha:
            alpha = total / i
    return min(beta + alpha * delta * 2 * m, 1.0)


@pytest.mark.parametrize(
    ("m", "r", "v", "epsilon", "delta"),
    [(1000, 200, 150, 0.8, 1e-5), (1000, 200, 190, 2.0, 1e-3), (50, 50, 0, 1.0, 1e-5), (300, 40, 40, 0.1, 0.2)],
)
def test_p_value_is_the_papers_term_by_term(m: int, r: int, v: int, epsilon: float, delta: float) -> None:
    assert p_value(m, r, v, epsilon, delta) == pytest.approx(_reference_p_value(m, r, v, epsilon, delta), rel=1e-12)


def test_monotone_in_correct_guesses_and_delta_only_lowers() -> None:
    bounds = [epsilon_lower_bound(1000, 200, v, 1e-5) for v in range(100, 201, 10)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:], strict=False)) and bounds[-1] > bounds[0]
    assert epsilon_lower_bound(1000, 200, 190, 1e-3) <= epsilon_lower_bound(1000, 200, 190, 0.0)


def test_guesses_and_coins() -> None:
    included = np.array([True, False, True, False])
    assert guesses(np.array([3.0, 0.0, 2.0, 1.0]), included, 1, 1) == (2, 2)
    assert guesses(np.array([0.0, 3.0, 2.0, 1.0]), included, 1, 1) == (2, 0)
    coins = inclusion_coins(4000)
    assert coins.dtype == bool and 0.45 < coins.mean() < 0.55


def test_mutations_adjust_the_settings() -> None:
    s = TrainSettings(sample_rate=0.1, steps=5, noise_multiplier=2.0, max_grad_norm=1.0)
    assert mutate(s, "none") is s
    assert mutate(s, "noise/10").noise_multiplier == pytest.approx(0.2)
    nc = mutate(s, "no-clip")
    assert nc.max_grad_norm * nc.noise_multiplier == pytest.approx(2.0) and nc.max_grad_norm > 1e5
    with pytest.raises(ValueError):
        mutate(s, "bogus")


def test_more_canaries_than_masked_out_weights_is_a_user_error_naming_the_most() -> None:
    from privflow.core.errors import ConfigError
    from privflow.models import build_flow
    from privflow.privacy.audit import canary_slots

    model = build_flow("maf", [None, None], blocks=1, hidden=8)  # two numeric columns: few masked-out weights
    with pytest.raises(ConfigError, match=r"pass --canaries \d+ or fewer") as exc:
        canary_slots(model, 10**6)
    room = int(str(exc.value).split("--canaries ")[1].split()[0])
    assert len(canary_slots(model, room)) == room  # the number it names fits
