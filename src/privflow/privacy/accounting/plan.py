"""The privacy plan: split a run's total (epsilon, delta) over its stages and calibrate noise.

The small stages (DP statistics, DP prior, checkpoint selection) each get their declared
share of epsilon as their *standalone* guarantee at the run's delta; one stage, DP-SGD in
the pipeline (DP-EM when a DP mixture is the whole model), takes the rest: its noise
multiplier is found by a root search (secant steps, `_calibrate`) so that the tight PLD composition of every stage lands
at most 1% under the target. Summing the stages' standalone epsilons
would overstate the cost; composing them is what makes the split meet the target.
The plan is made and recorded before any private value is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from privflow.core.errors import PrivacyPlanError
from privflow.privacy.accounting.accountant import PLDAccountant, RDPAccountant
from privflow.privacy.accounting.events import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PoissonGaussianEvent,
    event_to_dict,
)

__all__ = ["MAX_EPSILON", "MAX_STEPS", "PrivacyPlan", "Remainder", "SGDShape", "StagePlan", "make_plan"]

_COARSE = 1e-3  # PLD discretisation while searching; the final figure uses the fine default

# The largest total epsilon a plan accepts. Past it a "guarantee" means nothing (e^100 is
# about 1e43), and the small stages' noise shrinks until their privacy-loss distributions
# need gigabytes; a clear refusal is better than either.
MAX_EPSILON = 100.0
# The most DP-SGD steps a plan accepts: at epsilon 1 even 10 million steps at a 1.6% sample rate
# need more noise than any search reaches, and a billion would keep the accountant busy for hours.
MAX_STEPS = 10_000_000


@dataclass(frozen=True)
class StagePlan:
    """One stage: its share of the target, its own epsilon at the run's delta, its event."""

    name: str
    share: float
    epsilon_alone: float
    event: Event

    @property
    def noise_multiplier(self) -> float:
        """The noise multiplier of the stage's event: a Gaussian, Laplace or Poisson-subsampled
        Gaussian mechanism's (the other events have none)."""
        event = self.event
        if not isinstance(event, GaussianEvent | LaplaceEvent | PoissonGaussianEvent):
            raise TypeError(f"stage '{self.name}' is a {type(event).__name__}, which has no noise multiplier")
        return event.noise_multiplier

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "share": self.share,
            "epsilon_alone": self.epsilon_alone,
            "event": event_to_dict(self.event),
        }


@dataclass(frozen=True)
class PrivacyPlan:
    """The calibrated split; `epsilon` is the PLD composition of every stage at `delta`."""

    target_epsilon: float
    delta: float
    stages: tuple[StagePlan, ...]
    epsilon: float
    epsilon_rdp: float

    @property
    def events(self) -> list[Event]:
        return [s.event for s in self.stages]

    def stage(self, name: str) -> StagePlan:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.stages)

    def to_dict(self) -> dict[str, object]:
        return {
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "epsilon_pld": self.epsilon,
            "epsilon_rdp": self.epsilon_rdp,
            "stages": [s.to_dict() for s in self.stages],
        }


@dataclass(frozen=True)
class SGDShape:
    """DP-SGD's public shape: Poisson sample rate and number of steps."""

    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1 or self.steps < 1:
            raise PrivacyPlanError(f"DP-SGD needs a sample rate in (0, 1] and at least one step, got {self}.")
        if self.steps > MAX_STEPS:  # accounting for billions of steps alone would take hours
            raise PrivacyPlanError(
                f"DP-SGD of {self.steps:,} steps is past privflow's limit of {MAX_STEPS:,} (steps = epochs / sample "
                "rate, the sample rate being batch_size / expected_rows); use fewer epochs or a larger batch."
            )

    def event(self, noise_multiplier: float) -> PoissonGaussianEvent:
        return PoissonGaussianEvent(self.sample_rate, noise_multiplier, self.steps)


@dataclass(frozen=True)
class Remainder:
    """The stage that takes what the small stages leave: its name, its event as a function
    of its noise multiplier (epsilon must fall as it grows) and the range searched.

    For DP-SGD the range starts at 0.3: below it the subsampled PLD of hundreds of steps
    needs gigabytes, and no useful run lives there.
    """

    name: str
    event: Callable[[float], Event]
    sigma_range: tuple[float, float] = (0.3, 1e3)


def make_plan(
    epsilon: float,
    delta: float,
    small_stages: Mapping[str, tuple[float, Callable[[float], Event]]],
    remainder: SGDShape | Remainder | None,
    tolerance: float = 0.01,
) -> PrivacyPlan:
    """Calibrate every stage so the composed (PLD) epsilon is within `tolerance` under `epsilon`.

    `small_stages` maps a stage name to (share of epsilon, function from that stage's
    standalone epsilon to its event); `remainder` (DP-SGD's shape, named "train", or any
    `Remainder`) takes the rest. Raises PrivacyPlanError, before any data is read,
    when the target cannot be met.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise PrivacyPlanError(f"epsilon must be a finite positive number, got {epsilon}.")
    if epsilon > MAX_EPSILON:
        raise PrivacyPlanError(
            f"epsilon={epsilon:g} is above privflow's limit of {MAX_EPSILON:g}: at such values the guarantee "
            "says nothing (e^epsilon is astronomically large) and the accountant cannot represent the noise. "
            f"Choose an epsilon of at most {MAX_EPSILON:g} (typical values are 0.1 to 10)."
        )
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise PrivacyPlanError(f"delta must lie strictly between 0 and 1, got {delta}.")
    try:
        return _make_plan(epsilon, delta, small_stages, remainder, tolerance)
    except PrivacyPlanError:
        raise
    except (ArithmeticError, ValueError) as exc:
        # math domain errors, overflows and PLD grids too large to build: never a traceback.
        raise PrivacyPlanError(
            f"The privacy plan for epsilon={epsilon:g}, delta={delta:g} cannot be computed: {exc}. "
            "Use a smaller epsilon or a smaller delta, or change the stage shares."
        ) from None


def _make_plan(
    epsilon: float,
    delta: float,
    small_stages: Mapping[str, tuple[float, Callable[[float], Event]]],
    remainder: SGDShape | Remainder | None,
    tolerance: float,
) -> PrivacyPlan:
    total_share = sum(share for share, _ in small_stages.values())
    if total_share >= 1:
        raise PrivacyPlanError(
            f"The stage shares {dict((k, v[0]) for k, v in small_stages.items())} add up to {total_share:.3f}; "
            "they must leave room for training (sum below 1)."
        )
    pld = PLDAccountant()
    stages: list[StagePlan] = []
    for name, (share, make_event) in small_stages.items():
        if share <= 0:
            continue
        event = make_event(share * epsilon)
        stages.append(StagePlan(name, share, pld.epsilon([event], delta), event))
    fixed = [s.event for s in stages]
    fixed_eps = pld.epsilon(fixed, delta) if fixed else 0.0
    if fixed_eps >= epsilon * (1 - tolerance):
        raise PrivacyPlanError(
            f"The stages other than training already cost epsilon={fixed_eps:.4f} of the target {epsilon}; "
            "lower their shares."
        )
    if isinstance(remainder, SGDShape):
        remainder = Remainder("train", remainder.event)
    if remainder is not None:
        event = _calibrate(epsilon, delta, fixed, remainder, tolerance)
        stages.append(StagePlan(remainder.name, 1 - total_share, pld.epsilon([event], delta), event))
    total = pld.epsilon([s.event for s in stages], delta)
    if total > epsilon:
        raise PrivacyPlanError(f"Calibration failed: the composed epsilon {total:.4f} exceeds the target {epsilon}.")
    rdp = RDPAccountant().epsilon([s.event for s in stages], delta)
    return PrivacyPlan(epsilon, delta, tuple(stages), total, rdp)


def _calibrate(epsilon: float, delta: float, fixed: list[Event], remainder: Remainder, tolerance: float) -> Event:
    """Smallest noise whose composition with `fixed` lands within `tolerance` under the target.

    A root search on log(epsilon) against log(sigma) (nearly linear there, so a secant step
    lands close): first on the coarse PLD grid (cheap), then on the fine one, whose figure is
    the one reported and must lie in [(1 - tolerance) * epsilon, epsilon]. A handful of
    compositions instead of the twenty-odd of a bisection to the same width; every composition
    is remembered by the accountant, so a plan made again from the same inputs is a look-up.
    """
    coarse, fine = PLDAccountant(_COARSE), PLDAccountant()

    def eps_at(sigma: float, acc: PLDAccountant) -> float:
        return acc.epsilon([*fixed, remainder.event(sigma)], delta)

    sigma_low, sigma_high = remainder.sigma_range
    lo, hi = math.log(sigma_low), math.log(sigma_high)
    goal = epsilon * (1 - tolerance / 2)

    def coarse_gap(x: float) -> float:
        return math.log(max(eps_at(math.exp(x), coarse), _TINY)) - math.log(goal)

    # The most noise first: the cheapest composition (the smallest grid), and the refusal.
    high = eps_at(sigma_high, coarse)
    if high > epsilon:
        raise PrivacyPlanError(
            f"No noise level up to {sigma_high:g} lets stage '{remainder.name}' ({remainder.event(1.0)}) meet "
            f"epsilon={epsilon}; shorten it (fewer steps or iterations) or raise epsilon."
        )
    gap_high = math.log(max(high, _TINY)) - math.log(goal)
    if gap_high > 0:
        x, slope = hi, -1.0
    else:
        x, slope = _decreasing_root(coarse_gap, lo, (hi, gap_high), min(max(0.0, lo), hi))
    # The fine discretisation gives the reported figure: secant steps on it from the coarse
    # root (the two grids differ by a nearly constant factor there, so one step usually does).
    floor = (1 - tolerance) * epsilon
    seen: tuple[float, float] | None = None
    for _ in range(_FINE_STEPS):
        e = eps_at(math.exp(x), fine)
        if e <= epsilon and (e >= floor or x <= lo):
            return remainder.event(math.exp(x))
        gap = math.log(max(e, _TINY)) - math.log(goal)
        if seen is not None and seen[0] != x:
            slope = _clamp_slope((gap - seen[1]) / (x - seen[0]))
        seen = (x, gap)
        step = min(max(x - gap / slope, lo), hi)
        if step == x:
            break
        x = step
    # Not settled in a few steps (an odd curve): the former rule, nudging sigma up from here
    # until the fine figure is under the target.
    sigma = math.exp(x)
    for _ in range(200):
        if eps_at(sigma, fine) <= epsilon:
            return remainder.event(sigma)
        sigma *= 1.002
    raise PrivacyPlanError(
        f"Calibration of stage '{remainder.name}' did not converge to epsilon={epsilon}; lower epsilon or shorten it."
    )


_TINY = 1e-300  # floor under an epsilon before its log (a huge noise composes to 0)
_X_TOL = 1e-4  # log(sigma): the width the former bisection stopped at
_F_TOL = 2e-4  # |log(epsilon / goal)| at which the coarse search stops: 0.02% of the goal
_FINE_STEPS = 6


def _clamp_slope(slope: float) -> float:
    """d log(epsilon) / d log(sigma) kept negative and finite (epsilon falls as noise grows)."""
    return min(max(slope, -20.0), -0.05) if math.isfinite(slope) else -1.0


def _decreasing_root(
    f: Callable[[float], float], lo: float, high: tuple[float, float], x0: float
) -> tuple[float, float]:
    """A root of a decreasing f on [lo, hi] given (hi, f(hi)) with f(hi) <= 0; `lo` when f(lo) <= 0.

    Secant steps from x0 (slope -1 to start: epsilon is about proportional to 1/sigma), at most
    a factor e^3 in sigma each, until a sign change brackets the root; then the Illinois variant
    of regula falsi, which keeps the bracket and converges superlinearly. Stops at
    |f| <= _F_TOL or a bracket under _X_TOL. Returns (x, the last secant slope).
    """
    hi = high[0]
    known = {hi: high[1]}
    left: tuple[float, float] | None = None  # a point with f > 0 (too little noise)
    right: tuple[float, float] | None = None  # a point with f <= 0
    slope, side = -1.0, 0
    prev: tuple[float, float] | None = None
    x = x0
    for _ in range(60):
        fx = known[x] if x in known else f(x)
        if abs(fx) <= _F_TOL:
            return x, slope
        if prev is not None and prev[0] != x:
            slope = _clamp_slope((fx - prev[1]) / (x - prev[0]))
        prev = (x, fx)
        if fx > 0:
            if side == 1 and right is not None:
                right = (right[0], right[1] / 2)  # Illinois: halve the stale end's value
            left, side = (x, fx), 1
        else:
            if side == -1 and left is not None:
                left = (left[0], left[1] / 2)
            right, side = (x, fx), -1
            if x <= lo:
                return lo, slope
        if left is not None and right is not None:
            if right[0] - left[0] < _X_TOL:
                return right[0], slope
            # regula falsi between the bracket's ends, kept strictly inside it
            t = left[1] / (left[1] - right[1])
            x = left[0] + min(max(t, 0.01), 0.99) * (right[0] - left[0])
        else:
            # a secant step towards the root, at most a factor e^3 in sigma, within [lo, hi]
            x = min(max(x - max(min(fx / slope, 3.0), -3.0), lo), hi)
    return (right or high)[0], slope
