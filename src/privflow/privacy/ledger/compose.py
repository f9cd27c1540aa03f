"""Composition for the privacy ledger: the tight (PLD) epsilon of a list of events, the epsilon
a next run can ask for, and the one budget verdict that reserving and checking share.

Functions of mechanism parameters only (public): no SQLite, no rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from privflow.core.errors import BudgetExceeded
from privflow.privacy.accounting.accountant import PLDAccountant, PLDTooLarge
from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import (
    ApproxDPEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    PoissonGaussianEvent,
    PureDPEvent,
    RepeatedEvent,
    flatten,
)
from privflow.privacy.accounting.plan import MAX_EPSILON

# Relative slack for floating-point noise only: a plan calibrated to land exactly on the
# budget may compose to budget * (1 + 1e-12) in the PLD's arithmetic.
REL_TOL = 1e-9


def merge_events(events: Sequence[Event]) -> list[Event]:
    """An equivalent, shorter list for the accountant: identical events merged into one repetition.

    DP-SGD runs with the same (q, sigma) add their steps. Composition is commutative, so
    the composed epsilon is unchanged; self-composition by repeated squaring is far cheaper
    than composing run after run.
    """
    counts: dict[Event, int] = {}
    for event, n in flatten(list(events)):
        if isinstance(event, PoissonGaussianEvent):
            key: Event = PoissonGaussianEvent(event.sample_rate, event.noise_multiplier, 1)
            n *= event.steps
        else:
            key = event
        counts[key] = counts.get(key, 0) + n
    out: list[Event] = []
    for event, n in counts.items():
        if n == 0:
            continue
        if isinstance(event, PoissonGaussianEvent):
            out.append(PoissonGaussianEvent(event.sample_rate, event.noise_multiplier, n))
        else:
            out.append(event if n == 1 else RepeatedEvent(event, n))
    return out


def compose_epsilon(events: Sequence[Event], delta: float) -> float:
    """The ledger's (and privflow's reported) epsilon: PLD composition at `delta`."""
    merged = merge_events(events)
    return PLDAccountant().epsilon(merged, delta) if merged else 0.0


# Bisection on the next run's epsilon stops once the bracket is this narrow (relative to the budget).
_HEADROOM_TOL = 1e-5


def headroom_epsilon(events: Sequence[Event], budget: float, delta: float) -> float:
    """The largest epsilon e (at `delta`) of ONE more mechanism whose privacy loss is a Gaussian
    calibrated to (e, delta) (`gaussian_noise_for_epsilon`) such that `events` composed with it
    stay within `budget` (the same test as the ledger's reservation). Composition is not
    subtraction: this is usually well above budget minus spent.

    A next run's events depend on its plan, which this module does not know; a run's stages
    compose close to one Gaussian at the run's epsilon, so this is what a next run can ask
    for, about; pre-flight checks the exact plan. The composed total grows with e, so e is
    found in a bracket [fits, does not fit] narrowed by the Illinois rule (regula falsi that
    halves a stale end's value): each probe builds a new Gaussian PLD, and this needs fewer
    probes than bisection. The lower end of the final bracket is returned (the side that
    fits). 0 when nothing more fits.
    """
    budget = float(budget)
    if not (math.isfinite(budget) and budget > 0):
        return 0.0
    limit = budget * (1 + REL_TOL)

    def excess(e: float) -> float:
        """The composition with a Gaussian at e, minus the limit: <= 0 where it fits."""
        if e <= 0:
            return compose_epsilon(events, delta) - limit
        try:
            return compose_epsilon([*events, GaussianEvent(gaussian_noise_for_epsilon(e, delta))], delta) - limit
        except PLDTooLarge:  # too little noise to account for: no run's plan could ask for it either
            return math.inf

    # one Gaussian at e composes to at least e, so the answer never passes the budget; nor a
    # single run's limit (privacy.accounting.plan.MAX_EPSILON)
    lo, hi = 0.0, min(budget, MAX_EPSILON)
    f_hi = excess(hi)
    if f_hi <= 0:
        return hi
    f_lo = excess(lo)
    if f_lo > 0:
        return 0.0
    tol = _HEADROOM_TOL * hi
    kept = 0  # +1: the last probe moved lo (hi kept), -1: it moved hi
    while hi - lo > tol:
        guess = 0.5 * (lo + hi) if math.isinf(f_hi) else (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        # at least half the tolerance inside: near the root the next probe straddles it
        x = min(max(guess, lo + 0.5 * tol), hi - 0.5 * tol)
        f_x = excess(x)
        if f_x <= 0:
            lo, f_lo = x, f_x
            if kept == 1:
                f_hi *= 0.5
            kept = 1
        else:
            hi, f_hi = x, f_x
            if kept == -1:
                f_lo *= 0.5
            kept = -1
    return lo


def describe_event(event: Event) -> str:
    """A short human label, e.g. 'poisson_gaussian(q=0.01, sigma=1.1, steps=1000)'."""
    if isinstance(event, RepeatedEvent):
        return f"{describe_event(event.event)} x{event.count}"
    if isinstance(event, GaussianEvent | LaplaceEvent):
        return f"{event.kind}(sigma={event.noise_multiplier:.4g})"
    if isinstance(event, PoissonGaussianEvent):
        return f"poisson_gaussian(q={event.sample_rate:.4g}, sigma={event.noise_multiplier:.4g}, steps={event.steps})"
    if isinstance(event, PureDPEvent):
        return f"pure_dp(eps={event.epsilon:.4g})"
    if isinstance(event, ApproxDPEvent):
        return f"approx_dp(eps={event.epsilon:.4g}, delta={event.delta:.3g})"
    if isinstance(event, NonPrivateEvent):
        return f"non_private({event.reason})"
    return repr(event)


def budget_verdict(
    dataset: str,
    budget: float,
    delta: float,
    earlier_runs: Sequence[Sequence[Event]],
    events: Sequence[Event],
    who: str,
) -> tuple[float, float]:
    """The one budget check (the ledger's reservation and every dry run use it): (requested,
    total) epsilon of `events` composed after the events of the dataset's charged runs
    (`earlier_runs`, one list per run, oldest first), or BudgetExceeded naming every number."""
    earlier = [e for run in earlier_runs for e in run]
    n_runs = len(earlier_runs)
    spent = compose_epsilon(earlier, delta)
    requested = compose_epsilon(events, delta)
    total = compose_epsilon(earlier + list(events), delta) if earlier else requested
    if not total <= budget * (1 + REL_TOL):
        raise BudgetExceeded(
            f"{who} was refused before reading any row: dataset '{dataset}' has a total "
            f"budget of epsilon={budget:.4g} (delta={delta:g}); {n_runs} earlier run(s) spent "
            f"epsilon={spent:.4g}, and this run requests epsilon={requested:.4g} on its own, which "
            f"composes to a total of {total:.4g}. A next run can ask for about epsilon="
            f"{headroom_epsilon(earlier, budget, delta):.4g} (found by composition, not by subtraction). "
            f"Lower the run's epsilon, or raise the dataset's budget deliberately (`privflow ledger "
            f"set-budget {dataset} --epsilon E --delta D`) if the data owner agrees."
        )
    return requested, total


def check_budget(dataset: str, events: Sequence[Event], budget: tuple[float, float], who: str = "This run") -> None:
    """The budget check for a dataset with no recorded run (or no ledger file yet): the same
    verdict as a reservation, against the budget that would be recorded."""
    budget_verdict(dataset, float(budget[0]), float(budget[1]), [], events, who)


__all__ = [
    "budget_verdict",
    "check_budget",
    "compose_epsilon",
    "describe_event",
    "headroom_epsilon",
    "merge_events",
]
