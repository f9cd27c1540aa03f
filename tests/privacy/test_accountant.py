"""One contract, run against every accountant (PLD, RDP, PRV), with independent references.

Reference values: dp-accounting 0.6.0 (../shared/design/STACK.md table, delta = 1e-5) and
opacus' own RDP and PRV accountants computed here. The exact analytic-Gaussian formula
(privacy/accounting/calibration.py, Balle & Wang 2018) is a third, closed-form reference.
"""

from __future__ import annotations

import functools
import math

import pytest

from privflow.privacy.accounting.accountant import (
    ACCOUNTANTS,
    Accountant,
    PLDAccountant,
)
from privflow.privacy.accounting.calibration import epsilon_for_gaussian, gaussian_delta, gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    PoissonGaussianEvent,
    PureDPEvent,
    RepeatedEvent,
    events_from_json,
    events_to_json,
)

DELTA = 1e-5
DPSGD = PoissonGaussianEvent(sample_rate=0.01, noise_multiplier=1.0, steps=1000)

# STACK.md: dp-accounting 0.6.0 at delta = 1e-5 (given to 3-4 significant digits).
KNOWN = {
    "laplace": ([LaplaceEvent(2.0)], {"pld": 0.500, "rdp": 0.503}),
    "gaussian": ([GaussianEvent(5.0)], {"pld": 0.7255, "rdp": 0.7945}),
    "dpsgd": ([DPSGD], {"pld": 1.828, "rdp": 2.1014}),
    "all_three": ([DPSGD, LaplaceEvent(2.0), GaussianEvent(5.0)], {"pld": 2.405, "rdp": 2.662}),
}
SLOW_CASES = {"dpsgd", "all_three"}  # PRV on 1000 sampled steps takes seconds on this box

# PRV's declared absolute epsilon error (PRVAccountant(eps_error=0.005)).
SLACK = {"pld": 1e-9, "rdp": 1e-9, "prv": 0.005}


@functools.cache
def _eps(name: str, events_json: str, delta: float = DELTA) -> float:
    return ACCOUNTANTS[name]().epsilon(events_from_json(events_json), delta)


def eps(name: str, events: list[Event], delta: float = DELTA) -> float:
    return _eps(name, events_to_json(events), delta)


@pytest.fixture(params=sorted(ACCOUNTANTS))
def name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def opacus_reference() -> dict[str, float]:
    """opacus' RDP and PRV accountants on DP-SGD q=1/64, sigma=1, 100 steps (STACK.md: 1.557, 1.131)."""
    from opacus.accountants import PRVAccountant as OpacusPRV
    from opacus.accountants import RDPAccountant as OpacusRDP

    out = {}
    for key, cls in (("rdp", OpacusRDP), ("prv", OpacusPRV)):
        acc = cls()
        acc.history = [(1.0, 1.0 / 64, 100)]
        out[key] = float(acc.get_epsilon(delta=DELTA))
    return out


class TestAccountantContract:
    """Every accountant answers the same questions, within its own stated accuracy."""

    @pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in KNOWN])
    def test_known_values(self, name: str, case: str) -> None:
        events, expected = KNOWN[case]
        got = eps(name, events)
        if name == "prv":  # no table row: PRV must agree with PLD within 1%
            assert got == pytest.approx(expected["pld"], rel=0.01)
        else:
            assert got == pytest.approx(expected[name], rel=1.5e-3)

    @pytest.mark.slow
    def test_opacus_reference(self, name: str, opacus_reference: dict[str, float]) -> None:
        assert opacus_reference["rdp"] == pytest.approx(1.557, abs=1e-3)
        got = eps(name, [PoissonGaussianEvent(1.0 / 64, 1.0, 100)])
        if name == "rdp":
            # Same RDP curve, two code bases (dp-accounting vs opacus): agree to 1e-4.
            assert got == pytest.approx(opacus_reference["rdp"], abs=1e-4)
        else:
            # Tight accountants: below RDP, and within opacus' PRV error band (eps_error 0.01).
            assert got < opacus_reference["rdp"]
            assert abs(got - opacus_reference["prv"]) <= 0.02

    @pytest.mark.parametrize(
        "events",
        [
            [GaussianEvent(5.0)],
            [LaplaceEvent(2.0), GaussianEvent(2.0)],
            [RepeatedEvent(GaussianEvent(8.0), 10), PureDPEvent(0.1)],
            [PoissonGaussianEvent(0.05, 1.2, 40), LaplaceEvent(4.0)],
        ],
        ids=["gauss", "lap+gauss", "repeated+pure", "sampled+lap"],
    )
    def test_not_looser_than_rdp(self, name: str, events: list[Event]) -> None:
        assert eps(name, events) <= eps("rdp", events) + SLACK[name]

    def test_composition_is_monotone(self, name: str) -> None:
        chain = [GaussianEvent(6.0), PureDPEvent(0.05), LaplaceEvent(10.0), RepeatedEvent(GaussianEvent(20.0), 3)]
        values = [eps(name, chain[: i + 1]) for i in range(len(chain))]
        for before, after in zip(values, values[1:], strict=False):
            assert after >= before - SLACK[name]
        assert values[-1] > values[0]

    def test_non_private_event_is_infinite(self, name: str) -> None:
        acc: Accountant = ACCOUNTANTS[name]()
        assert acc.epsilon([NonPrivateEvent("fit a scaler on private rows")], DELTA) == math.inf
        assert acc.epsilon([GaussianEvent(5.0), RepeatedEvent(NonPrivateEvent("x"), 1)], DELTA) == math.inf

    def test_empty_and_zero_step_cost_nothing(self, name: str) -> None:
        acc: Accountant = ACCOUNTANTS[name]()
        assert acc.epsilon([], DELTA) == 0.0
        assert acc.epsilon([PoissonGaussianEvent(0.1, 1.0, 0)], DELTA) == 0.0

    def test_json_round_trip_same_epsilon(self, name: str) -> None:
        events = [GaussianEvent(4.0), RepeatedEvent(PureDPEvent(0.02), 3), LaplaceEvent(20.0)]
        back = events_from_json(events_to_json(events))
        assert back == events
        acc: Accountant = ACCOUNTANTS[name]()
        assert acc.epsilon(back, DELTA) == acc.epsilon(events, DELTA)

    @pytest.mark.parametrize("target", [1.0, 3.0])
    def test_calibrated_gaussian_lands_on_target(self, name: str, target: float) -> None:
        sigma = gaussian_noise_for_epsilon(target, DELTA)
        got = eps(name, [GaussianEvent(sigma)])
        if name == "rdp":
            # RDP is a looser upper bound: never below the exact epsilon, and not absurdly above.
            assert target - 1e-9 <= got <= 1.2 * target
        else:
            assert got == pytest.approx(target, rel=0.01)
            assert got <= target + SLACK[name]


@pytest.mark.parametrize("target", [0.03, 0.1, 0.5, 1.0, 3.0, 8.0])
def test_calibration_is_exact_and_just_under_target(target: float) -> None:
    sigma = gaussian_noise_for_epsilon(target, DELTA)
    achieved = epsilon_for_gaussian(sigma, DELTA)
    assert 0.99 * target <= achieved <= target * (1 + 1e-9)
    assert gaussian_delta(target, sigma) <= DELTA
    assert gaussian_delta(target, sigma * (1 - 1e-6)) > DELTA  # the smallest such multiplier
    # Independent reference: the PLD accountant on the same event.
    assert PLDAccountant().epsilon([GaussianEvent(sigma)], DELTA) == pytest.approx(target, rel=1e-4)
    if target < 1:  # tighter than the classical bound sigma = sqrt(2 ln(1.25/delta)) / epsilon
        assert sigma < math.sqrt(2 * math.log(1.25 / DELTA)) / target


def test_epsilon_for_gaussian_matches_table() -> None:
    assert epsilon_for_gaussian(5.0, DELTA) == pytest.approx(0.7255, abs=1e-4)
    assert epsilon_for_gaussian(1e6, DELTA) == 0.0


def test_pld_refuses_a_pure_epsilon_it_cannot_represent() -> None:
    """exp(epsilon) overflows past ~709: a clear PLDTooLarge, never an OverflowError."""
    from privflow.privacy.accounting.accountant import PLDAccountant, PLDTooLarge
    from privflow.privacy.accounting.events import PureDPEvent

    with pytest.raises(PLDTooLarge):
        PLDAccountant().epsilon([PureDPEvent(1000.0)], 1e-5)


def test_large_dp_sgd_plds_are_not_kept_among_the_small_ones() -> None:
    """An epsilon curve asks for one self-composed DP-SGD PLD per checkpoint (MBs each): at most
    `_poisson_pld`'s 4 stay cached, none in the 32-entry cache of small ones."""
    from privflow.privacy.accounting import accountant

    accountant._COMPOSED.clear()  # the remembered epsilons would skip the compositions
    accountant._small_pld.cache_clear()
    accountant._poisson_pld.cache_clear()
    pld = PLDAccountant()
    for steps in range(10, 130, 10):
        pld.epsilon([GaussianEvent(5.0), PoissonGaussianEvent(0.01, 1.0, steps)], 1e-5)
    assert accountant._small_pld.cache_info().currsize == 1  # the Gaussian only
    assert accountant._poisson_pld.cache_info().currsize == 4


def test_an_epsilon_curve_builds_one_dp_sgd_step_and_composes_it_per_checkpoint() -> None:
    """The single subsampled-Gaussian step (the costly part) is built once per (q, sigma) and
    self-composed for each step count; the figures equal those of a step built afresh."""
    from dp_accounting.pld import privacy_loss_distribution as reference

    from privflow.privacy.accounting import accountant

    accountant._COMPOSED.clear()
    accountant._one_step_pld.cache_clear()
    accountant._poisson_pld.cache_clear()
    curve = [PLDAccountant().epsilon([PoissonGaussianEvent(0.02, 1.1, t)], 1e-5) for t in (50, 100, 200)]
    assert accountant._one_step_pld.cache_info().misses == 1
    for t, eps in zip((50, 100, 200), curve, strict=True):
        one = reference.from_gaussian_mechanism(1.1, sampling_prob=0.02, value_discretization_interval=1e-4)
        assert eps == pytest.approx(one.self_compose(t).get_epsilon_for_delta(1e-5), rel=1e-12)
