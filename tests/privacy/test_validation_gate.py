"""The validation gate's public limit and decision (privacy/mechanisms/validation_gate.py)."""

from __future__ import annotations

import math

import pytest

from privflow.privacy.mechanisms import validation_gate as vg

pytestmark = pytest.mark.gate_odds  # the gate's own odds, not the suite's (tests/conftest.py)


def test_limit_is_the_policy_rows_when_noise_allows() -> None:
    event = vg.gate_event(1.0)  # b = 1: floor = ln(500) ~ 6.2 rows
    assert vg.threshold(320.0, event) == 320.0


def test_limit_is_raised_to_the_noise_floor() -> None:
    event = vg.gate_event(0.02)  # b = 50
    floor = 50 * math.log(1 / (2 * vg.FALSE_STOP))
    assert vg.threshold(20.0, event) == pytest.approx(floor)
    # a clean table exceeds the floor with probability exactly FALSE_STOP (Laplace tail)
    assert 0.5 * math.exp(-floor / 50) == pytest.approx(vg.FALSE_STOP)


def test_gate_stops_far_above_and_passes_far_below() -> None:
    event = vg.gate_event(1.0)
    assert vg.gate(10_000, 100.0, event).stop
    assert not vg.gate(0, 100.0, event).stop


def test_decision_describes_the_dp_count_not_the_exact_one() -> None:
    d = vg.gate(37, 10.0, vg.gate_event(0.5))
    text = d.describe()
    assert "DP count" in text and f"{max(0.0, d.noisy_failing):.0f}" in text


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        vg.gate_event(0.0)
    with pytest.raises(ValueError):
        vg.gate(-1, 1.0, vg.gate_event(1.0))
    with pytest.raises(ValueError):
        vg.threshold(1.0, vg.gate_event(1.0), false_stop=0.7)


def test_too_few_passing_rows_stop_at_the_floor_and_say_so_in_dp_figures() -> None:
    event = vg.gate_event(1.0)
    d = vg.gate(0, 100.0, event, passing_rows=3, floor=320.0)  # a handful of rows where thousands are expected
    assert d.stop and d.too_few
    text = d.describe()
    assert f"{max(0.0, d.noisy_passing):.0f} rows pass" in text and "minimum of 320" in text
    assert not vg.gate(0, 100.0, event, passing_rows=2_000, floor=320.0).stop
    assert not vg.gate(0, 100.0, event, passing_rows=0).stop  # no floor: nothing to stop on


def test_failing_and_passing_counts_are_one_release_of_l1_sensitivity_one() -> None:
    """The pair gets independent Laplace(b) noise per coordinate: b = 1/epsilon on each."""
    import numpy as np

    event = vg.gate_event(0.5)
    draws = np.array([(d.noisy_failing, d.noisy_passing) for d in (vg.gate(10, 1e9, event, 50) for _ in range(4000))])
    noise = draws - np.array([10.0, 50.0])
    assert np.abs(noise).mean(axis=0) == pytest.approx([2.0, 2.0], rel=0.08)  # E|Laplace(b)| = b = 2
    assert abs(np.corrcoef(noise.T)[0, 1]) < 0.06
