"""Composition for the privacy ledger: the tight (PLD) epsilon of a list of events, the epsilon
a next run can ask for, and the one budget verdict that reserving and checking share.

A dataset's budget is enforced by two figures together: the PLD composition of every charged
run's events (the tight figure, exact when the runs' parameters were fixed in advance), and the
bound valid however each run was chosen after earlier releases (`filter.adaptive_epsilon`, a
Rényi privacy filter). A run is refused when either would pass the budget.

Functions of mechanism parameters only (public): no SQLite, no rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

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
from privflow.privacy.ledger.filter import adaptive_epsilon

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
    """The largest epsilon e (at `delta`) of ONE more run, a Gaussian mechanism calibrated to
    (e, delta) (`gaussian_noise_for_epsilon`), that the ledger's reservation would accept after
    `events` (the dataset's charged runs' events): its PLD total and the bound valid for
    adaptively chosen runs (`filter.adaptive_epsilon`, `events` as the earlier runs) both within
    `budget`. Composition is not subtraction: the PLD figure alone would allow well above budget
    minus spent; the adaptive bound, which grows faster, often allows less.

    A next run's events depend on its plan, which this module does not know; a run's stages
    compose close to one Gaussian at the run's epsilon, so this is what a next run can ask
    for, about; pre-flight checks the exact plan. Both figures grow with e. The adaptive bound
    is cheaper (a Rényi curve and a closed form; for a dataset's first run, one Gaussian's exact
    epsilon), so its largest fit is found first, then the PLD one below it, each in a bracket
    [fits, does not fit] narrowed by the Illinois rule (`_largest_fit`): a PLD probe builds a new
    Gaussian PLD, and this needs fewer probes than bisection. The lower end of the final bracket
    is returned (the side that fits both). 0 when nothing more fits.
    """
    budget = float(budget)
    if not (math.isfinite(budget) and budget > 0):
        return 0.0
    limit = budget * (1 + REL_TOL)
    earlier = [list(events)] if events else []

    def gaussian(e: float) -> list[Event]:
        return [GaussianEvent(gaussian_noise_for_epsilon(e, delta))] if e > 0 else []

    def adaptive_excess(e: float) -> float:
        """The adaptive bound with a Gaussian at e, minus the limit: <= 0 where it fits."""
        try:
            return adaptive_epsilon([*earlier, gaussian(e)], delta) - limit
        except PLDTooLarge:  # the first run's PLD: too little noise to account for
            return math.inf

    def excess(e: float) -> float:
        """The PLD composition with a Gaussian at e, minus the limit: <= 0 where it fits."""
        try:
            return compose_epsilon([*events, *gaussian(e)], delta) - limit
        except PLDTooLarge:  # too little noise to account for: no run's plan could ask for it either
            return math.inf

    # one Gaussian at e composes to at least e, so the answer never passes the budget; nor a
    # single run's limit (privacy.accounting.plan.MAX_EPSILON)
    hi = min(budget, MAX_EPSILON)
    tol = _HEADROOM_TOL * hi
    a_lo = adaptive_excess(0.0)
    if a_lo > 0:
        return 0.0
    a_hi = adaptive_excess(hi)
    if a_hi > 0:
        hi = _largest_fit(adaptive_excess, 0.0, hi, a_lo, a_hi, tol)
    f_hi = excess(hi)
    if f_hi <= 0:
        return hi
    f_lo = excess(0.0)
    if f_lo > 0:
        return 0.0
    return _largest_fit(excess, 0.0, hi, f_lo, f_hi, tol)


def _largest_fit(f: Callable[[float], float], lo: float, hi: float, f_lo: float, f_hi: float, tol: float) -> float:
    """The lower end of a bracket [lo, hi] with f(lo) <= 0 < f(hi), f increasing, narrowed to
    `tol` by the Illinois rule (regula falsi that halves a stale end's value; bisection while
    f(hi) is infinite)."""
    kept = 0  # +1: the last probe moved lo (hi kept), -1: it moved hi
    while hi - lo > tol:
        guess = 0.5 * (lo + hi) if math.isinf(f_hi) else (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        # at least half the tolerance inside: near the root the next probe straddles it
        x = min(max(guess, lo + 0.5 * tol), hi - 0.5 * tol)
        f_x = f(x)
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
    total) PLD epsilon of `events` composed after the events of the dataset's charged runs
    (`earlier_runs`, one list per run, oldest first), or BudgetExceeded naming every number.

    The run is refused when the PLD total, or the bound valid for adaptively chosen runs
    (`filter.adaptive_epsilon` over the earlier runs and this one), would pass the budget."""
    earlier = [e for run in earlier_runs for e in run]
    n_runs = len(earlier_runs)
    spent = compose_epsilon(earlier, delta)
    requested = compose_epsilon(events, delta)
    total = compose_epsilon(earlier + list(events), delta) if earlier else requested
    adaptive = adaptive_epsilon([*earlier_runs, list(events)], delta)
    limit = budget * (1 + REL_TOL)
    over_pld, over_adaptive = not total <= limit, not adaptive <= limit
    if over_adaptive and not over_pld:
        _refuse_past_the_approx_share(dataset, delta, earlier_runs, events, who)
    if over_pld or over_adaptive:
        which = (
            "both figures pass it"
            if over_pld and over_adaptive
            else ("the PLD total passes it" if over_pld else "the adaptive bound passes it, the PLD total does not")
        )
        raise BudgetExceeded(
            f"{who} was refused before reading any row: dataset '{dataset}' has a total "
            f"budget of epsilon={budget:.4g} (delta={delta:g}); {n_runs} earlier run(s) spent "
            f"epsilon={spent:.4g}, and this run requests epsilon={requested:.4g} on its own, which "
            f"composes to a total of {total:.4g} (PLD) and to {adaptive:.4g} by the bound valid for "
            f"adaptively chosen runs (a Rényi privacy filter, `privflow ledger show`); {which}. A next run "
            f"can ask for about epsilon={headroom_epsilon(earlier, budget, delta):.4g} (found by composition "
            f"under both figures, not by subtraction). Lower the run's epsilon, or raise the dataset's budget "
            f"deliberately (`privflow ledger set-budget {dataset} --epsilon E --delta D`) if the data owner agrees."
        )
    return requested, total


def _refuse_past_the_approx_share(
    dataset: str, delta: float, earlier_runs: Sequence[Sequence[Event]], events: Sequence[Event], who: str
) -> None:
    """BudgetExceeded naming the cause when the adaptive bound is infinite only because the
    (epsilon, delta) releases' deltas (DP drafts' thresholded histograms) would sum past the share
    of delta the filter keeps for them (`filter.APPROX_DELTA_SHARE`): a smaller epsilon cannot help."""
    from privflow.privacy.ledger.filter import APPROX_DELTA_SHARE, rdp_curve

    _, before = rdp_curve([e for run in earlier_runs for e in run])
    _, this = rdp_curve(list(events))
    cap = APPROX_DELTA_SHARE * delta
    if this == 0 or before + this <= cap * (1 + 1e-9):
        return
    left = max(cap - before, 0.0)
    raise BudgetExceeded(
        f"{who} was refused before reading any row: its (epsilon, delta) releases (a DP schema draft's "
        f"thresholded histograms) add delta={this:.3g}, and the earlier ones of dataset '{dataset}' hold "
        f"{before:.3g} of the {cap:.3g} ({APPROX_DELTA_SHARE:.0%} of the dataset's delta={delta:g}) that the "
        "ledger's bound for adaptively chosen runs keeps for them, whatever the epsilon. "
        + (
            f"Draft with --delta {left * 0.999:.2g} or less, "
            if left > 0
            else "Draft no more under this dataset name (the schema you have keeps its draft's charge), "
        )
        + f"or raise the dataset's delta deliberately (`privflow ledger set-budget {dataset} --epsilon E "
        "--delta D`) if the data owner agrees."
    )


def check_budget(dataset: str, events: Sequence[Event], budget: tuple[float, float], who: str = "This run") -> None:
    """The budget check for a dataset with no recorded run (or no ledger file yet): the same
    verdict as a reservation, against the budget that would be recorded."""
    budget_verdict(dataset, float(budget[0]), float(budget[1]), [], events, who)


__all__ = [
    "adaptive_epsilon",
    "budget_verdict",
    "check_budget",
    "compose_epsilon",
    "describe_event",
    "headroom_epsilon",
    "merge_events",
]
