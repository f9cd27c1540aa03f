"""The validation gate: a DP count of failing rows, and the decision to stop a run on it.

Whether a run stops because rows fail the schema's checks is a fact about the private
rows that shows in a release (a run that never produced a model, a ledger line, a message
in the orchestrator). So the decision is a mechanism (ARCHITECTURE.md, privacy rule 5):

    c(D)  = number of rows that fail any row-level check     (each row adds 0 or 1)
    c~    = c(D) + Laplace(1 / epsilon)                       L1 sensitivity 1
    stop  = c~ > threshold                                    post-processing

Adding or removing one row moves c by at most 1, so the release is epsilon-DP
(``LaplaceEvent(1/epsilon)``, Dwork et al. 2006). The threshold is public: the larger of
a fraction of the schema's ``expected_rows`` set by the policy (never the private row
count) and the noise floor b * ln(1 / (2 p)), below which a clean table (c = 0) would be
stopped with probability above p (``FALSE_STOP``): a small table or a small gate epsilon
cannot resolve a few bad rows, and a gate that stops clean runs would charge for nothing. Which rows
fail is a per-row predicate, so dropping them before training keeps every later
mechanism's sensitivity (a stable transformation). The exact counts stay in the
curator-only report; only ``c~`` is shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privflow.privacy.events import LaplaceEvent
from privflow.privacy.mechanisms.laplace import laplace_mechanism


@dataclass(frozen=True)
class GateDecision:
    """What the gate releases: the noisy count, the public threshold, and the decision."""

    noisy_failing: float
    threshold: float
    epsilon: float
    stop: bool

    @property
    def margin95(self) -> float:
        """Half-width of the central 95% interval of the Laplace noise: b * ln(1/0.05)."""
        return math.log(20.0) / self.epsilon

    def describe(self) -> str:
        return (
            f"about {max(0.0, self.noisy_failing):.0f} rows fail the schema's row checks (a DP count at "
            f"epsilon={self.epsilon:.3g}, within +-{self.margin95:.0f} with 95% probability); the policy's "
            f"limit is {self.threshold:.0f}"
        )


FALSE_STOP = 1e-3  # largest probability that a table with no failing row is stopped


def threshold(policy_rows: float, event: LaplaceEvent, false_stop: float = FALSE_STOP) -> float:
    """The public stop limit: the policy's row limit, raised to the noise floor where needed."""
    if not 0 < false_stop < 0.5:
        raise ValueError(f"false_stop must lie in (0, 0.5), got {false_stop!r}")
    return max(float(policy_rows), event.noise_multiplier * math.log(1.0 / (2.0 * false_stop)))


def gate_event(epsilon: float) -> LaplaceEvent:
    """The event of one gate decision at this epsilon."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"gate epsilon must be a finite positive number, got {epsilon!r}")
    return LaplaceEvent(1.0 / float(epsilon))


def gate(failing_rows: int, threshold: float, event: LaplaceEvent) -> GateDecision:
    """Release the DP count of failing rows and decide: stop when it exceeds `threshold`."""
    if failing_rows < 0:
        raise ValueError(f"failing_rows must be >= 0, got {failing_rows}")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    noisy = float(laplace_mechanism(np.array([float(failing_rows)]), 1.0, event.noise_multiplier)[0])
    return GateDecision(noisy, float(threshold), 1.0 / event.noise_multiplier, noisy > threshold)


__all__ = ["FALSE_STOP", "GateDecision", "gate", "gate_event", "threshold"]
