"""The thresholded histogram (privacy/mechanisms/dp_histogram.py) against an independent reference:
the kept-set probability of a value of count c against the continuous Laplace's closed form, a
count of 1 kept with probability at most delta; its event composed by the ledger; and the DP
bounds' grid (privacy/mechanisms/dp_bounds.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privflow.privacy.accounting.accountant import PLDAccountant, PRVAccountant
from privflow.privacy.accounting.events import ApproxDPEvent, LaplaceEvent, PureDPEvent, event_from_dict, event_to_dict
from privflow.privacy.ledger import compose_epsilon, describe_event
from privflow.privacy.mechanisms.dp_bounds import (
    FALSE_CELL,
    DPBounds,
    QuantileBounds,
    nice_bounds,
    number_edges,
    round_out,
)
from privflow.privacy.mechanisms.dp_histogram import PublicHistogram, ThresholdedHistogram, keep_probability

KEYS = 20_000  # independent keys per release: the kept share is a Binomial(KEYS, p) / KEYS


def _reference(c: float, epsilon: float, delta: float) -> float:
    """P(c + L > T), L ~ Laplace(1/epsilon), T = 1 + ln(1/delta)/epsilon, from the Laplace CDF."""
    t = 1.0 + math.log(1.0 / delta) / epsilon
    x = (t - c) * epsilon  # in units of the scale
    cdf = 1.0 - 0.5 * math.exp(-x) if x >= 0 else 0.5 * math.exp(x)
    return 1.0 - cdf


@pytest.mark.parametrize("count", [1, 3, 5, 8])
def test_kept_share_matches_the_closed_form(count: int) -> None:
    eps, delta = 1.0, 0.05  # T = 1 + ln 20 = 4.0: counts on both sides of it
    p = _reference(count, eps, delta)
    assert keep_probability(count, eps, delta) == pytest.approx(p, rel=1e-12)
    kept = ThresholdedHistogram(eps, delta).release({i: count for i in range(KEYS)})
    share = len(kept) / KEYS
    assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / KEYS) + 2e-3, (count, share, p)


def test_a_value_of_count_one_is_kept_with_probability_at_most_delta() -> None:
    delta = 0.01
    kept = ThresholdedHistogram(0.5, delta).release({i: 1 for i in range(KEYS)})
    share = len(kept) / KEYS
    assert share <= delta + 5 * math.sqrt(delta / KEYS)
    assert share == pytest.approx(delta / 2, abs=5 * math.sqrt(delta / KEYS))  # the continuous tail: delta / 2


def test_public_keys_are_released_always_and_noise_is_fresh() -> None:
    h = ThresholdedHistogram(2.0, 1e-6)
    out = h.release({"a": 500, "rare": 1}, public=[None])
    assert None in out and "a" in out and "rare" not in out
    assert abs(out["a"] - 500) < 20 and abs(out[None]) < 20
    assert h.release({"a": 500})["a"] != h.release({"a": 500})["a"]


def test_settings_are_refused_out_of_range() -> None:
    for eps, delta in [(0.0, 1e-6), (math.inf, 1e-6), (1.0, 0.0), (1.0, 0.5)]:
        with pytest.raises(ValueError):
            ThresholdedHistogram(eps, delta)


def test_the_event_composes_in_the_ledger_and_round_trips() -> None:
    event = ThresholdedHistogram(0.5, 1e-7).event()
    assert event == ApproxDPEvent(0.5, 1e-7)
    assert event_from_dict(event_to_dict(event)) == event
    assert describe_event(event) == "approx_dp(eps=0.5, delta=1e-07)"
    # alone: its epsilon at any delta above its own; never more than the basic sum when composed
    assert compose_epsilon([event], 1e-5) == pytest.approx(0.5, abs=1e-3)
    ten = compose_epsilon([event] * 10, 1e-5)
    assert ten <= 5.0 + 1e-6
    assert PRVAccountant().epsilon([event] * 10, 1e-5) == pytest.approx(
        PLDAccountant().epsilon([event] * 10, 1e-5), rel=0.05
    )
    # below the events' own delta no finite epsilon holds
    assert compose_epsilon([ApproxDPEvent(0.5, 1e-3)], 1e-4) > 50 or math.isinf(
        compose_epsilon([ApproxDPEvent(0.5, 1e-3)], 1e-4)
    )


def test_bounds_find_the_data_and_no_empty_cell() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(50, 10, 5000)
    b = DPBounds(1.0, "number")
    rel = b.release(x, 0)
    assert rel.found and rel.low <= 20 and rel.high >= 100  # the cells [20, 50) and [50, 100)
    low, high = nice_bounds(rel.low, rel.high)  # type: ignore[arg-type]
    assert low <= x.min() and high >= x.max()
    # an empty column: every cell passes with probability at most FALSE_CELL
    found = sum(b.release(np.array([]), 0).found for _ in range(200))
    assert found <= 200 * FALSE_CELL + 5 * math.sqrt(200 * FALSE_CELL)


def test_nice_bounds_round_outward_and_keep_amounts_non_negative() -> None:
    assert nice_bounds(10, 100, integer=True) == (0, 110)
    assert nice_bounds(0, 0.001) == (0.0, 0.002)
    assert nice_bounds(-5, 5) == (-10.0, 10.0)
    assert nice_bounds(0.05, 1) == (0.0, 1.1)
    edges = number_edges()
    assert edges[0] == -1e9 and edges[-1] == 1e9 and 0.0 in edges and np.all(np.diff(edges) > 0)


def test_the_public_histogram_event_is_its_epsilon_at_any_sensitivity() -> None:
    for sens in (1.0, 3.0):
        h = PublicHistogram(0.2, sens)
        assert h.scale == pytest.approx(sens / 0.2)
        assert h.event() == LaplaceEvent(5.0)  # epsilon 0.2: the noise scales with the sensitivity
    out = PublicHistogram(1e6).release(np.array([3.0, 0.0, 7.0]))
    assert np.allclose(out, [3.0, 0.0, 7.0], atol=1e-3)
    with pytest.raises(ValueError):
        PublicHistogram(1.0).release(np.array([-1.0]))


def test_quantile_bounds_event_candidates_and_round_out() -> None:
    qb = QuantileBounds(0.4, 100.0, "nonnegative")
    assert qb.event() == PureDPEvent(0.8)
    lows, low_prior, highs, high_prior = qb.candidates()
    assert lows[0] == 0.0 and lows[-1] == pytest.approx(100.0) and np.all(low_prior == 0)
    assert highs[-1] == pytest.approx(1e4) and high_prior[-1] < high_prior[-2] < 0  # a cost per step past the scale
    both = QuantileBounds(0.4, 100.0, "both").candidates()
    assert both[0][0] == pytest.approx(-1e4) and both[2][0] == pytest.approx(-100.0)
    assert round_out(0.37, 58.3) == (0.0, 59.0) and round_out(-3.2, 7.9, integer=True) == (-4.0, 8.0)
    x = np.random.default_rng(4).lognormal(3, 0.8, 3000)
    rel = QuantileBounds(500.0, 100.0, "nonnegative").release(x)  # a large epsilon: near the quantiles
    assert np.mean((x >= rel.low) & (x <= rel.high)) >= 0.98


@pytest.mark.parametrize(("rows", "delta"), [(2.0, 1e-6), (590.0, 1e-8), (1e5, 0.01)])
def test_the_epsilon_to_pass_puts_the_threshold_at_those_rows(rows: float, delta: float) -> None:
    """`epsilon_to_pass` inverts the threshold: at that epsilon it is exactly `rows`."""
    eps = ThresholdedHistogram(1.0, delta).epsilon_to_pass(rows)
    assert ThresholdedHistogram(eps, delta).threshold == pytest.approx(rows)
    with pytest.raises(ValueError, match="exceed 1"):
        ThresholdedHistogram(1.0, delta).epsilon_to_pass(1.0)
