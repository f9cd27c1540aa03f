"""The bound valid for adaptively chosen runs (privacy/ledger/filter.py) and the budget verdict
that enforces it beside the PLD composition (privacy/ledger/compose.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from privflow.core.errors import BudgetExceeded
from privflow.privacy.accounting.calibration import epsilon_for_gaussian, gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import (
    ApproxDPEvent,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    PoissonGaussianEvent,
    PureDPEvent,
    RepeatedEvent,
)
from privflow.privacy.ledger import Ledger, budget_verdict, compose_epsilon, headroom_epsilon
from privflow.privacy.ledger.filter import (
    APPROX_DELTA_SHARE,
    FIRST_RUN_DELTA_SHARE,
    ORDERS,
    RENYI_DELTA_SHARE,
    adaptive_epsilon,
    filter_epsilon,
    first_run_epsilon,
    pure_dp_rdp,
    rdp_curve,
)

DELTA = 1e-5


def gaussian(epsilon: float) -> GaussianEvent:
    """One Gaussian release calibrated to (epsilon, DELTA)."""
    return GaussianEvent(gaussian_noise_for_epsilon(epsilon, DELTA))


def closed_form(n: int, sigma: float, delta: float) -> float:
    """n Gaussian releases of multiplier sigma through the filter, computed by hand: the Rényi
    divergence alpha / (2 sigma^2) each (Mironov 2017), summed, converted at delta_R / k per order
    (Canonne, Kamath & Steinke 2020, Prop. 12), the smallest over the grid."""
    k, delta_r = len(ORDERS), RENYI_DELTA_SHARE * delta
    best = math.inf
    for a in ORDERS:
        rdp = n * a / (2 * sigma**2)
        best = min(best, rdp + math.log1p(-1 / a) + (math.log(k / delta_r) - math.log(a)) / (a - 1))
    return best


def test_the_delta_split_is_whole_and_the_grid_public() -> None:
    assert APPROX_DELTA_SHARE + FIRST_RUN_DELTA_SHARE + RENYI_DELTA_SHARE == pytest.approx(1.0)
    assert min(ORDERS) > 1 and list(ORDERS) == sorted(set(ORDERS))


@pytest.mark.parametrize(("n", "epsilon"), [(2, 0.5), (3, 0.5), (5, 1.0), (40, 0.1)])
def test_gaussian_runs_match_the_closed_form(n: int, epsilon: float) -> None:
    event = gaussian(epsilon)
    runs = [[event]] * n
    expected = closed_form(n, event.noise_multiplier, DELTA)
    assert adaptive_epsilon(runs, DELTA) == pytest.approx(expected, rel=1e-9)
    assert filter_epsilon(runs, DELTA) == pytest.approx(expected, rel=1e-9)
    # the same events grouped otherwise: the filter counts mechanisms, not runs
    assert adaptive_epsilon([[event] * (n - 1), [event]], DELTA) == pytest.approx(expected, rel=1e-9)


def test_the_conversion_is_dp_accountings_at_delta_r_over_k() -> None:
    """An independent implementation of the same conversion: dp-accounting's `compute_epsilon`
    at delta_R / k, on the summed curve of a mixed run (DP-SGD, Gaussian, Laplace, pure DP)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    events = [
        PoissonGaussianEvent(0.01, 1.1, 2000),
        GaussianEvent(8.0),
        LaplaceEvent(40.0),
        RepeatedEvent(PureDPEvent(0.02), 3),
    ]
    curve, approx = rdp_curve(events)
    assert approx == 0.0
    expected, _ = rdp.compute_epsilon(list(ORDERS), list(curve), RENYI_DELTA_SHARE * DELTA / len(ORDERS))
    assert filter_epsilon([events[:2], events[2:]], DELTA) == pytest.approx(expected, rel=1e-9)


def test_the_curves_of_laplace_and_pure_dp_by_hand() -> None:
    a = np.asarray(ORDERS)
    b = 4.0  # Laplace of scale 4 (epsilon 0.25): Mironov 2017, Prop. 6
    by_hand = np.log(a / (2 * a - 1) * np.exp((a - 1) / b) + (a - 1) / (2 * a - 1) * np.exp(-a / b)) / (a - 1)
    assert rdp_curve([LaplaceEvent(b)])[0] == pytest.approx(by_hand, rel=1e-9)
    # pure DP: randomized response, never above epsilon nor alpha * eps^2 / 2, and tight at large orders
    for eps in (0.01, 0.5, 3.0):
        curve = pure_dp_rdp(eps)
        assert (curve <= eps + 1e-12).all() and (curve <= a * eps**2 / 2 + 1e-12).all()
        assert curve[-1] == pytest.approx(eps, rel=0.02 if eps > 0.1 else 1.0)
    p = math.exp(0.5) / (1 + math.exp(0.5))
    at2 = math.log(p**2 / (1 - p) + (1 - p) ** 2 / p)  # order 2 by hand
    assert pure_dp_rdp(0.5)[ORDERS.index(2.0)] == pytest.approx(at2, rel=1e-12)


@pytest.mark.parametrize(
    "runs",
    [
        [[gaussian(1.0)], [gaussian(1.0)]],
        [[PoissonGaussianEvent(0.02, 1.0, 1000)], [PoissonGaussianEvent(0.02, 1.0, 1000), PureDPEvent(0.05)]],
        [[LaplaceEvent(20.0), gaussian(0.3)], [RepeatedEvent(PureDPEvent(0.1), 5)], [gaussian(0.2)]],
        [[gaussian(2.0)]],
        [[PureDPEvent(1.0)]],
    ],
)
def test_the_adaptive_bound_is_never_below_the_pld_figure(runs) -> None:
    pld = compose_epsilon([e for run in runs for e in run], DELTA)
    assert adaptive_epsilon(runs, DELTA) >= pld - 1e-6


def test_edges_nothing_spent_not_private_and_approx_deltas() -> None:
    assert adaptive_epsilon([], DELTA) == 0.0 == adaptive_epsilon([[], [PoissonGaussianEvent(0.1, 1.0, 0)]], DELTA)
    assert adaptive_epsilon([[gaussian(0.5)], [NonPrivateEvent("no noise")]], DELTA) == math.inf
    # (epsilon, delta) events: their deltas have a fixed share of the budget's delta, and no more
    within = RepeatedEvent(ApproxDPEvent(0.05, APPROX_DELTA_SHARE * DELTA / 10), 10)
    beyond = RepeatedEvent(ApproxDPEvent(0.05, APPROX_DELTA_SHARE * DELTA / 10), 11)
    assert math.isfinite(adaptive_epsilon([[within], [gaussian(0.5)]], DELTA))
    assert adaptive_epsilon([[beyond], [gaussian(0.5)]], DELTA) == math.inf
    with pytest.raises(ValueError):
        adaptive_epsilon([[gaussian(0.5)]], 0.0)


def test_a_first_run_alone_is_bounded_by_its_own_pld_at_its_share_of_delta() -> None:
    """The first run's parameters precede any release: while it is alone its own PLD at
    FIRST_RUN_DELTA_SHARE * delta bounds it (smaller than the filter for one release); a second
    run brings the filter over both."""
    run = [PoissonGaussianEvent(0.01, 1.0, 1500), GaussianEvent(6.0), LaplaceEvent(50.0)]
    from privflow.privacy.accounting.accountant import PLDAccountant

    alone = PLDAccountant().epsilon(run, FIRST_RUN_DELTA_SHARE * DELTA)
    assert first_run_epsilon(run, DELTA) == pytest.approx(alone)
    assert adaptive_epsilon([run], DELTA) == pytest.approx(min(alone, filter_epsilon([run], DELTA)))
    assert adaptive_epsilon([run], DELTA) < filter_epsilon([run], DELTA)
    second = [GaussianEvent(30.0)]
    assert adaptive_epsilon([run, second], DELTA) == pytest.approx(filter_epsilon([run, second], DELTA))
    # a lone Gaussian: its exact analytic epsilon at that delta
    g = gaussian(1.0)
    assert first_run_epsilon([g], DELTA) == pytest.approx(epsilon_for_gaussian(g.noise_multiplier, DELTA / 4))


def test_the_verdict_refuses_when_only_the_adaptive_bound_passes_the_budget() -> None:
    runs = [[gaussian(0.5)], [gaussian(0.5)]]
    new = [gaussian(0.5)]
    pld = compose_epsilon([e for run in runs for e in run] + new, DELTA)
    adaptive = adaptive_epsilon([*runs, new], DELTA)
    assert pld == pytest.approx(0.9114, abs=1e-3) and adaptive == pytest.approx(1.1978, abs=1e-3)
    with pytest.raises(BudgetExceeded) as info:
        budget_verdict("census", 1.0, DELTA, runs, new, "Run 'third'")
    msg = str(info.value)
    assert f"{pld:.4g} (PLD)" in msg and f"{adaptive:.4g} by the bound valid for adaptively chosen runs" in msg
    assert "the adaptive bound passes it, the PLD total does not" in msg
    assert "2 earlier run(s)" in msg and "refused before reading any row" in msg
    # the same runs under a budget both figures fit
    requested, total = budget_verdict("census", 1.2, DELTA, runs, new, "Run 'third'")
    assert requested == pytest.approx(0.5, abs=1e-4) and total == pytest.approx(pld)
    with pytest.raises(BudgetExceeded, match="both figures pass it"):
        budget_verdict("census", 1.0, DELTA, [[gaussian(0.5)]], [gaussian(0.9)], "Run 'x'")


@pytest.mark.parametrize("budget", [2.0, 4.0])
def test_the_headroom_fits_both_bounds_and_a_step_above_does_not(budget: float) -> None:
    earlier = [gaussian(0.3), PoissonGaussianEvent(0.01, 1.2, 800), PureDPEvent(0.05)]
    headroom = headroom_epsilon(earlier, budget, DELTA)
    assert 0 < headroom < budget

    def figures(e: float) -> tuple[float, float]:
        return (
            compose_epsilon([*earlier, gaussian(e)], DELTA),
            adaptive_epsilon([earlier, [gaussian(e)]], DELTA),
        )

    assert max(figures(headroom)) <= budget * (1 + 1e-9)
    assert max(figures(headroom + 2e-5 * budget)) > budget
    budget_verdict("d", budget, DELTA, [earlier], [gaussian(headroom)], "Run 'next'")  # accepted
    with pytest.raises(BudgetExceeded):
        budget_verdict("d", budget, DELTA, [earlier], [gaussian(headroom + 2e-5 * budget)], "Run 'next'")
    # a fresh budget: the first run's own rule (PLD at its share of delta), and a step above refused
    fresh = headroom_epsilon([], budget, DELTA)
    budget_verdict("d", budget, DELTA, [], [gaussian(fresh)], "Run 'first'")
    with pytest.raises(BudgetExceeded):
        budget_verdict("d", budget, DELTA, [], [gaussian(fresh + 2e-5 * budget)], "Run 'first'")


def test_runs_the_pld_figure_fits_are_refused_by_the_adaptive_bound(tmp_path: Path) -> None:
    """The issue's shape: reruns on one dataset whose PLD total stays within the budget while the
    bound valid for adaptively chosen runs passes it; the refused run records nothing, and the
    summary prints both figures."""
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.ensure_dataset("census", 1.1, DELTA, None)
    run = [gaussian(0.5)]
    for run_id in ("first", "rerun-1"):
        ledger.reserve("census", run_id, run)
        ledger.settle(run_id, run)
    assert compose_epsilon(run * 3, DELTA) < 1.1 < adaptive_epsilon([run] * 3, DELTA)
    with pytest.raises(BudgetExceeded, match="the adaptive bound passes it"):
        ledger.check("census", run)
    with pytest.raises(BudgetExceeded):
        ledger.reserve("census", "rerun-2", run)
    assert [r.run_id for r in ledger.runs("census")] == ["first", "rerun-1"]
    text = " ".join(ledger.describe("census").split())
    assert f"spent epsilon={compose_epsilon(run * 2, DELTA):.4f} (PLD)" in text
    assert f"adaptive bound epsilon={adaptive_epsilon([run] * 2, DELTA):.4f}" in text
    # privacy rule 10: the reservations' times to the day only
    created = ledger.runs("census")[0].created
    assert created[:10] in text and created[11:16] not in text and not re.search(r"\d{2}:\d{2}", text)


def test_three_runs_at_half_an_epsilon_each() -> None:
    """The figures docs/privacy.md quotes: three Gaussian runs at epsilon 0.5 (delta 1e-5)."""
    run = [gaussian(0.5)]
    assert compose_epsilon(run * 3, DELTA) == pytest.approx(0.9114, abs=1e-4)
    assert adaptive_epsilon([run] * 3, DELTA) == pytest.approx(1.1978, abs=1e-4)
    assert sum(compose_epsilon(run, DELTA) for _ in range(3)) == pytest.approx(1.5, abs=1e-4)  # basic composition


def test_a_draft_past_the_approx_share_is_refused_naming_delta_not_epsilon() -> None:
    """Drafts' (epsilon, delta) releases share a fixed part of delta (APPROX_DELTA_SHARE): one that
    would pass it is refused at any epsilon, and the refusal says so and how much delta is left;
    at the draft's default delta (2% of the budget's) twelve drafts fit."""
    from privflow.tasks.draft import DELTA_SHARE

    delta = 1e-5
    draft = [ApproxDPEvent(0.01, DELTA_SHARE * delta)]
    fits = int(APPROX_DELTA_SHARE / DELTA_SHARE + 1e-9)
    assert fits >= 12
    budget_verdict("d", 10.0, delta, [draft] * (fits - 1), draft, "This draft")  # the last one that fits
    with pytest.raises(BudgetExceeded, match=r"whatever the epsilon") as refused:
        budget_verdict("d", 10.0, delta, [draft] * fits, draft, "This draft")
    assert "--delta" in str(refused.value) and "can ask for" not in str(refused.value)
