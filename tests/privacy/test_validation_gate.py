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
