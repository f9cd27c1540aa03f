"""The budget bound that holds however runs were chosen: a Rényi-DP privacy filter.

PLD composition (`compose.compose_epsilon`) is exact for mechanisms whose parameters are fixed
in advance; it is not known to hold as a privacy filter, when whether a run happens and what it
spends depend on earlier releases (a rerun after the gate stopped a run, a retraining decided by
a promotion's outcome). `adaptive_epsilon` does hold then; the ledger refuses a run when it, or
the PLD total, would pass the budget (`compose.budget_verdict`).

The filter. A fixed public grid of Rényi orders A = ORDERS (k of them). Every mechanism has a
Rényi-DP curve eps_i(alpha) that is a function of its parameters only (Gaussian, Laplace: Mironov
2017; Poisson-subsampled Gaussian: Mironov, Talwar & Zhang 2019, by dp-accounting; an epsilon-DP
release: binary randomized response, which dominates every epsilon-DP pair, Kairouz, Oh &
Viswanath 2015, capped by Bun & Steinke 2016's alpha * eps^2 / 2). An (eps, delta) event (the DP
draft's thresholded histograms) counts as its eps part, pure, plus a failure probability delta_i.
With S(alpha) the summed curve of every recorded mechanism and delta_R = RENYI_DELTA_SHARE * delta:

    filter(S) = min over alpha in A of  S(alpha) + log(1 - 1/alpha) + (log(k / delta_R) - log alpha) / (alpha - 1)

(Canonne, Kamath & Steinke 2020, Prop. 12, at delta_R / k per order), or infinity once the
(eps, delta) events' deltas sum past APPROX_DELTA_SHARE * delta.

Why it holds under full adaptivity (Feldman & Zrnic 2021, "Individual privacy accounting via a
Rényi filter", Thm. 3.1; over several orders Lécuyer 2021, Whitehouse, Ramdas, Rogers & Wu 2023).
Fix neighbouring tables and an order alpha. With L_n the privacy loss of the first n releases and
S_n their summed curves (each fixed before its mechanism runs), M_n = exp((alpha - 1)(L_n - S_n))
is a non-negative supermartingale with M_0 = 1, so E[M_N] <= 1 whenever the interaction ends.
A run is admitted only if some order has S(alpha) + conv(alpha) <= B with it counted; curves only
grow, so at the end some order (which may depend on the outputs) still has it. The hockey-stick
divergence at B, E[(1 - e^(B - L_N))_+], is at most the sum over orders of the same expectation on
the event that this order is within budget, and (1 - e^-x)_+ <= e^((alpha - 1) x) (1 - 1/alpha)^alpha
/ (alpha - 1) bounds each by delta_R / k: delta_R in all (a union bound over the k orders). The
(eps, delta) events add at most APPROX_DELTA_SHARE * delta (each is eps-DP but with probability
delta_i, Kairouz et al. 2015; a fixed cap, as in Whitehouse et al.'s approximate-zCDP filter: a
Rényi delta that shrank as such events were charged would be chosen adaptively, and the union
bound would no longer sum to delta).

The first run. A dataset's first charged run is planned before anything about the dataset was
released, so its parameters are not adaptive: while it is the only run, it is admitted when its
PLD epsilon at delta_1 = FIRST_RUN_DELTA_SHARE * delta fits (or the filter does). Every later run
needs the filter over ALL runs, the first included. Valid: on outcomes where the first run stays
alone and its planned events do not fit the filter, the hockey-stick divergence is at most the
first run's own at B, <= delta_1 (its mechanism, the gate's early stop included, is fixed by its
plan); every other outcome ends within the filter (delta_R), and the (eps, delta) events' failures
add APPROX_DELTA_SHARE * delta: the shares sum to delta. The recorded events of a run the gate
stopped are a data-dependent prefix of its plan, so the first run's PLD cannot instead be
subtracted from the budget left to later runs (a split of epsilon): the filter counts mechanisms,
and charges a stopped run the mechanisms it ran.

So a dataset's runs, however they were chosen, are (B, delta)-DP for the budget B in force when
each was admitted. Functions of mechanism parameters only (public): no SQLite, no rows.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np

from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.accounting.calibration import epsilon_for_gaussian
from privflow.privacy.accounting.events import (
    ApproxDPEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    PoissonGaussianEvent,
    PureDPEvent,
    flatten,
)

# The public grid of Rényi orders. Every order costs log(k) in the conversion (a union bound
# over the k orders): a short grid that spans one large release (small orders) and long DP-SGD
# runs at small epsilon (large orders).
ORDERS: tuple[float, ...] = (
    1.25,
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    12.0,
    16.0,
    20.0,
    24.0,
    32.0,
    48.0,
    64.0,
    128.0,
    256.0,
)
_A = np.asarray(ORDERS, dtype=float)

# The fixed split of a dataset's delta (module docstring): the failure probabilities of
# (epsilon, delta) events (the DP draft's default takes a tenth of the delta), the first run's
# own PLD, and the Rényi filter's conversion.
APPROX_DELTA_SHARE = 0.25
FIRST_RUN_DELTA_SHARE = 0.25
RENYI_DELTA_SHARE = 1.0 - APPROX_DELTA_SHARE - FIRST_RUN_DELTA_SHARE


def pure_dp_rdp(epsilon: float, orders: np.ndarray = _A) -> np.ndarray:
    """Rényi divergence bound of any epsilon-DP pair at `orders`: binary randomized response at
    epsilon dominates every such pair (Kairouz, Oh & Viswanath 2015), so its divergence bounds
    theirs; capped by epsilon and by alpha * epsilon^2 / 2 (Bun & Steinke 2016, Prop. 3.3)."""
    a = np.asarray(orders, dtype=float)
    log_p = -float(np.logaddexp(0.0, -epsilon))  # log(e^eps / (1 + e^eps))
    log_q = -float(np.logaddexp(0.0, epsilon))  # log(1 / (1 + e^eps))
    rr = np.logaddexp(a * log_p + (1 - a) * log_q, a * log_q + (1 - a) * log_p) / (a - 1)
    return np.minimum(np.minimum(rr, epsilon), a * epsilon * epsilon / 2)


class _NonConvergence(logging.Filter):
    """dp-accounting's warning that a fractional order's series did not converge: it then
    returns +inf for that order, which the filter skips (a safe answer, not news for a user)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


@contextlib.contextmanager
def _quiet_non_convergence() -> Iterator[None]:
    quiet = _NonConvergence()
    logger = logging.getLogger("absl")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@functools.lru_cache(maxsize=256)
def _curve(event: Event) -> tuple[float, ...]:
    """One base event's Rényi-DP curve at ORDERS (add/remove adjacency, both directions), cached:
    events are frozen values, and every verdict recomposes the dataset's recorded ones."""
    if isinstance(event, PureDPEvent | ApproxDPEvent):
        return tuple(float(x) for x in pure_dp_rdp(event.epsilon))
    if isinstance(event, PoissonGaussianEvent) and event.steps == 0:
        return tuple(0.0 for _ in ORDERS)
    if isinstance(event, GaussianEvent | LaplaceEvent | PoissonGaussianEvent):
        from dp_accounting import dp_event as dpe
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        acc = rdp.RdpAccountant(orders=list(ORDERS))
        with _quiet_non_convergence():
            if isinstance(event, GaussianEvent):
                acc.compose(dpe.GaussianDpEvent(event.noise_multiplier))
            elif isinstance(event, LaplaceEvent):
                acc.compose(dpe.LaplaceDpEvent(event.noise_multiplier))
            else:
                sampled = dpe.PoissonSampledDpEvent(event.sample_rate, dpe.GaussianDpEvent(event.noise_multiplier))
                acc.compose(dpe.SelfComposedDpEvent(sampled, event.steps))
        return tuple(float(x) for x in acc._rdp)  # noqa: SLF001 - the accountant keeps its curve here
    raise TypeError(f"the Rényi filter cannot account for {event!r}")


def rdp_curve(events: Sequence[Event]) -> tuple[np.ndarray, float]:
    """(S, approx delta): the summed Rényi-DP curve of `events` at ORDERS and the summed deltas of
    their (epsilon, delta) events. S is +inf at every order when an event is not private."""
    total = np.zeros(len(ORDERS))
    approx = 0.0
    for event, n in flatten(list(events)):
        if isinstance(event, NonPrivateEvent):
            return np.full(len(ORDERS), math.inf), approx
        total += n * np.asarray(_curve(event))
        if isinstance(event, ApproxDPEvent):
            approx += n * event.delta
    return total, approx


def epsilon_from_curve(curve: np.ndarray, approx_delta: float, delta: float) -> float:
    """The filter's bound (module docstring) for a summed curve and the summed deltas of the
    (epsilon, delta) events, at the dataset's `delta`: 0 when nothing was released, inf past the
    (epsilon, delta) events' share of delta."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    curve = np.asarray(curve, dtype=float)
    # (the slack absorbs the floating-point sum of a draft's equal per-column deltas only)
    if approx_delta > APPROX_DELTA_SHARE * delta * (1 + 1e-9) or np.isnan(curve).any():
        return math.inf
    if not (curve > 0).any() and approx_delta == 0:  # nothing released: no privacy loss at all
        return 0.0
    delta_r = RENYI_DELTA_SHARE * delta
    conv = np.log1p(-1 / _A) + (math.log(len(ORDERS) / delta_r) - np.log(_A)) / (_A - 1)
    values = curve + conv
    values = values[np.isfinite(values)]
    return max(0.0, float(values.min())) if values.size else math.inf


def filter_epsilon(runs: Sequence[Sequence[Event]], delta: float) -> float:
    """The Rényi filter's bound over every event of `runs` at `delta` (module docstring)."""
    curve, approx = rdp_curve([e for run in runs for e in run])
    return epsilon_from_curve(curve, approx, delta)


def _spends(run: Sequence[Event]) -> bool:
    """Whether a run's events release anything (a DP-SGD stage of zero steps does not)."""
    return any(not (isinstance(e, PoissonGaussianEvent) and e.steps == 0) for e, _ in flatten(list(run)))


def first_run_epsilon(run: Sequence[Event], delta: float) -> float:
    """A dataset's first run alone: its PLD epsilon at FIRST_RUN_DELTA_SHARE * delta (a lone
    Gaussian release by its exact analytic epsilon, Balle & Wang 2018, which the PLD bounds)."""
    if not _spends(run):
        return 0.0
    pairs = flatten(list(run))
    if len(pairs) == 1 and pairs[0][1] == 1 and isinstance(pairs[0][0], GaussianEvent):
        return epsilon_for_gaussian(pairs[0][0].noise_multiplier, FIRST_RUN_DELTA_SHARE * delta)
    return PLDAccountant().epsilon(list(run), FIRST_RUN_DELTA_SHARE * delta)


def adaptive_epsilon(runs: Sequence[Sequence[Event]], delta: float) -> float:
    """The epsilon at `delta` that holds for a dataset's runs (one event list per run, oldest
    first) however each was chosen after the earlier ones' outputs, as the ledger enforces it:
    the Rényi filter over every run's events, or, while a single run has spent, the smaller of
    that and the run's own PLD epsilon at FIRST_RUN_DELTA_SHARE * delta (module docstring)."""
    spending = [run for run in runs if _spends(run)]
    bound = filter_epsilon(spending, delta)
    if len(spending) == 1 and bound > 0:
        bound = min(bound, first_run_epsilon(spending[0], delta))
    return bound


__all__ = [
    "APPROX_DELTA_SHARE",
    "FIRST_RUN_DELTA_SHARE",
    "ORDERS",
    "RENYI_DELTA_SHARE",
    "adaptive_epsilon",
    "epsilon_from_curve",
    "filter_epsilon",
    "first_run_epsilon",
    "pure_dp_rdp",
    "rdp_curve",
]
