"""The validation gate: DP counts of failing and passing rows, and the decision to stop a run on them.

Whether a run stops because rows fail the schema's checks, or because there are too few rows
to train on, is a fact about the private rows that shows in a release (a run that never
produced a model, a ledger line, a message in the orchestrator). So the decision is a
mechanism (docs/privacy.md, privacy rules 5 and 8):

    f(D)  = rows that fail any row-level check (a line the reader could not read included)
    p(D)  = rows that pass every check
    (f~, p~) = (f(D), p(D)) + Laplace(1 / epsilon) per coordinate
    stop  = f~ > threshold  or  p~ < floor                    post-processing

Adding or removing one row moves exactly one of f and p by 1, so the pair has L1 sensitivity
1 and the release is epsilon-DP (``LaplaceEvent(1/epsilon)``, Dwork et al. 2006): the row
count costs nothing beyond the failing count. Both limits are public and come from the
schema's ``expected_rows``, never from the rows:

- ``threshold``: the policy's fraction of expected_rows, raised to the noise floor
  b * ln(1 / (2 p)) below which a clean table (f = 0) would be stopped with probability above
  p (``FALSE_STOP``);
- ``floor``: a minimum number of passing rows (``MIN_ROWS_FRACTION`` of expected_rows, at least
  the selection split's minimum), lowered where needed so that a clean table of expected_rows
  rows is stopped with probability at most p; without expected_rows there is no floor. A
  header-only file, or a handful of rows where thousands are expected, stops here.

Which rows fail is a per-row predicate, so dropping them before training keeps every later
mechanism's sensitivity (a stable transformation). The exact counts stay in the
curator-only report; only ``f~`` and ``p~`` are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.mechanisms.laplace import laplace_mechanism

FALSE_STOP = 1e-3  # largest probability that a clean table of the expected size is stopped
MIN_ROWS_FRACTION = 0.01  # the floor on passing rows, as a fraction of the schema's expected_rows


@dataclass(frozen=True)
class GateDecision:
    """What the gate releases: the noisy counts, the public limits, and the decision."""

    noisy_failing: float
    threshold: float
    epsilon: float
    stop: bool
    noisy_passing: float = math.inf
    floor: float = -math.inf

    @property
    def margin95(self) -> float:
        """Half-width of the central 95% interval of the Laplace noise: b * ln(1/0.05)."""
        return math.log(20.0) / self.epsilon

    @property
    def too_few(self) -> bool:
        """Whether the passing rows' DP count fell below the floor."""
        return self.noisy_passing < self.floor

    def describe(self) -> str:
        text = (
            f"about {max(0.0, self.noisy_failing):.0f} rows fail the schema's row checks (a DP count at "
            f"epsilon={self.epsilon:.3g}, within +-{self.margin95:.0f} with 95% probability); the policy's "
            f"limit is {self.threshold:.0f}"
        )
        if self.too_few:
            text += (
                f"; about {max(0.0, self.noisy_passing):.0f} rows pass them (the same DP release), below the "
                f"public minimum of {self.floor:.0f} rows ({MIN_ROWS_FRACTION:.0%} of the schema's expected_rows)"
            )
        return text


def threshold(policy_rows: float, event: LaplaceEvent, false_stop: float = FALSE_STOP) -> float:
    """The public stop limit on failing rows: the policy's row limit, raised to the noise floor."""
    if not 0 < false_stop < 0.5:
        raise ValueError(f"false_stop must lie in (0, 0.5), got {false_stop!r}")
    return max(float(policy_rows), event.noise_multiplier * math.log(1.0 / (2.0 * false_stop)))


def floor(expected_rows: int | None, least: int, event: LaplaceEvent, false_stop: float = FALSE_STOP) -> float:
    """The public minimum of passing rows: MIN_ROWS_FRACTION of expected_rows, at least `least`,
    lowered so that a clean table of expected_rows rows is stopped with probability at most
    `false_stop`; -inf (no floor) without expected_rows."""
    if not 0 < false_stop < 0.5:
        raise ValueError(f"false_stop must lie in (0, 0.5), got {false_stop!r}")
    if expected_rows is None:
        return -math.inf
    wanted = max(float(least), MIN_ROWS_FRACTION * float(expected_rows))
    return min(wanted, float(expected_rows) - event.noise_multiplier * math.log(1.0 / (2.0 * false_stop)))


def gate_event(epsilon: float) -> LaplaceEvent:
    """The event of one gate decision at this epsilon."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"gate epsilon must be a finite positive number, got {epsilon!r}")
    return LaplaceEvent(1.0 / float(epsilon))


def gate(
    failing_rows: int,
    threshold: float,
    event: LaplaceEvent,
    passing_rows: int = 0,
    floor: float = -math.inf,
) -> GateDecision:
    """Release the DP counts of failing and passing rows (one Laplace release of the pair, L1
    sensitivity 1) and decide: stop when failing exceeds `threshold` or passing falls below `floor`."""
    if failing_rows < 0 or passing_rows < 0:
        raise ValueError(f"row counts must be >= 0, got {failing_rows} failing and {passing_rows} passing")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    noisy = laplace_mechanism(np.array([float(failing_rows), float(passing_rows)]), 1.0, event.noise_multiplier)
    f, p = float(noisy[0]), float(noisy[1])
    return GateDecision(f, float(threshold), 1.0 / event.noise_multiplier, f > threshold or p < floor, p, float(floor))


__all__ = ["FALSE_STOP", "MIN_ROWS_FRACTION", "GateDecision", "floor", "gate", "gate_event", "threshold"]
