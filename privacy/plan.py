"""The privacy plan: split a run's total (epsilon, delta) over its stages and calibrate noise.

The small stages (DP statistics, DP prior, checkpoint selection) each get their declared
share of epsilon as their *standalone* guarantee at the run's delta; one stage, DP-SGD in
the pipeline (DP-EM when a DP mixture is the whole model), takes the rest: its noise
multiplier is found by bisection so that the tight PLD composition of every stage lands
at most 1% under the target. Summing the stages' standalone epsilons
would overstate the cost; composing them is what makes the split meet the target.
The plan is made and recorded before any private value is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from privflow.errors import PrivacyPlanError
from privflow.privacy.accountant import PLDAccountant, RDPAccountant
from privflow.privacy.events import Event, PoissonGaussianEvent, event_to_dict

__all__ = ["MAX_EPSILON", "PrivacyPlan", "Remainder", "SGDShape", "StagePlan", "make_plan"]

_COARSE = 1e-3  # PLD discretisation while searching; the final figure uses the fine default

# The largest total epsilon a plan accepts. Past it a "guarantee" means nothing (e^100 is
# about 1e43), and the small stages' noise shrinks until their privacy-loss distributions
# need gigabytes; a clear refusal is better than either.
MAX_EPSILON = 100.0


@dataclass(frozen=True)
class StagePlan:
    """One stage: its share of the target, its own epsilon at the run's delta, its event."""

    name: str
    share: float
    epsilon_alone: float
    event: Event

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
    """Bisection on log(sigma): smallest noise whose composition with `fixed` meets the target."""
    coarse, fine = PLDAccountant(_COARSE), PLDAccountant()

    def eps_at(sigma: float, acc: PLDAccountant) -> float:
        return acc.epsilon([*fixed, remainder.event(sigma)], delta)

    sigma_low, sigma_high = remainder.sigma_range
    if eps_at(sigma_high, coarse) > epsilon:
        raise PrivacyPlanError(
            f"No noise level up to {sigma_high:g} lets stage '{remainder.name}' ({remainder.event(1.0)}) meet "
            f"epsilon={epsilon}; shorten it (fewer steps or iterations) or raise epsilon."
        )
    goal = epsilon * (1 - tolerance / 2)
    lo, hi = math.log(sigma_low), math.log(sigma_high)
    if eps_at(sigma_low, coarse) <= goal:
        hi = lo
    for _ in range(40):
        if hi - lo < 1e-4:
            break
        mid = (lo + hi) / 2
        if eps_at(math.exp(mid), coarse) > goal:
            lo = mid
        else:
            hi = mid
    sigma = math.exp(hi)
    # The fine discretisation gives the reported figure; nudge sigma up until it is under target
    # (a bounded number of nudges: the coarse grid is already pessimistic, so a few suffice).
    for _ in range(200):
        if eps_at(sigma, fine) <= epsilon:
            return remainder.event(sigma)
        sigma *= 1.002
    raise PrivacyPlanError(
        f"Calibration of stage '{remainder.name}' did not converge to epsilon={epsilon}; lower epsilon or shorten it."
    )
