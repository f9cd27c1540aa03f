"""The validation gate: DP counts of failing and passing rows, and the decision to stop a run on them.

Whether a run stops because rows fail the schema's checks, or because there are too few rows
to train on, is a fact about the private rows that shows in a release (a run that never
produced a model, a ledger line, a message in the orchestrator). So the decision is a
mechanism (docs/architecture.md, privacy rules 5 and 8):

    f(D)  = rows that fail any row-level check (a line the reader could not read included)
    u(D)  = rows that pass every check with no value changed
    c(D)  = rows that pass with a value clamped to a bound, and none sent to `other`
    o(D)  = rows that pass with a value sent to their column's `other`, and none clamped
    b(D)  = rows that pass with both
    h~    = (f, u, c, o, b)(D) + Laplace(1 / epsilon) per cell
    p~    = u~ + c~ + o~ + b~                                  post-processing
    stop  = f~ > threshold  or  p~ < floor                    post-processing

The five cells partition the rows (each row, by its own values alone, is in exactly one), so
adding or removing one row moves exactly one cell by 1: the histogram has L1 sensitivity 1 and
the release is epsilon-DP with the same event as a release of (f, p) alone
(``LaplaceEvent(1/epsilon)``, Dwork et al. 2006; parallel composition over disjoint cells):
the row count and the clamped / other figures cost nothing beyond the failing count, and no
new ledger event is recorded. Cells that the public schema rules out (no column clamps: c = b
= 0; no `other`: o = b = 0, on every table) are not released, so a schema that does neither
releases (f, u) = (f, p) as before. The floor on p~ accounts for the noise of the sum of the
released passing cells (``passing_cells``, ``laplace_sum_quantile``). Both limits are public
and come from the schema's ``expected_rows``, never from the rows:

- ``threshold``: the policy's fraction of expected_rows, raised to the noise floor
  b * ln(1 / (2 p)) below which a clean table (f = 0) would be stopped with probability above
  p (``FALSE_STOP``);
- ``floor``: a minimum number of passing rows (``MIN_ROWS_FRACTION`` of expected_rows, at least
  the selection split's minimum), lowered where needed so that a clean table of expected_rows
  rows is stopped with probability at most p; without expected_rows there is no floor. A
  header-only file, or a handful of rows where thousands are expected, stops here.

Which rows fail is a per-row predicate, so dropping them before training keeps every later
mechanism's sensitivity (a stable transformation); so are the clamping and the mapping to
`other` (per-row maps). The exact counts stay in the curator-only report; only ``f~``,
``p~`` and the noisy rows with a clamped / `other` value (c~ + b~, o~ + b~) are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.data.validation import RowCells
from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.accounting.plan import PrivacyPlan
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
    noisy_clamped: float | None = None  # passing rows with a clamped value (c~ + b~); None where no column clamps
    noisy_other: float | None = None  # passing rows with a value sent to `other` (o~ + b~); None where none declared

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
        kept = self.kept_text()
        return f"{text}; {kept}" if kept else text

    def kept_text(self) -> str:
        """The DP figures of rows kept with a changed value (the same release), where the schema
        clamps or declares `other`; empty otherwise."""
        parts = []
        if self.noisy_clamped is not None:
            parts.append(f"about {max(0.0, self.noisy_clamped):.0f} rows had a value clamped to a bound")
        if self.noisy_other is not None:
            parts.append(f"about {max(0.0, self.noisy_other):.0f} had a category sent to 'other'")
        if not parts:
            return ""
        return ", ".join(parts) + " (kept, not failing; the same DP release)"


def threshold(policy_rows: float, event: LaplaceEvent, false_stop: float = FALSE_STOP) -> float:
    """The public stop limit on failing rows: the policy's row limit, raised to the noise floor."""
    if not 0 < false_stop < 0.5:
        raise ValueError(f"false_stop must lie in (0, 0.5), got {false_stop!r}")
    return max(float(policy_rows), event.noise_multiplier * math.log(1.0 / (2.0 * false_stop)))


def floor(
    expected_rows: int | None,
    least: int,
    event: LaplaceEvent,
    false_stop: float = FALSE_STOP,
    passing_cells: int = 1,
) -> float:
    """The public minimum of passing rows: MIN_ROWS_FRACTION of expected_rows, at least `least`,
    lowered so that a clean table of expected_rows rows is stopped with probability at most
    `false_stop` (p~ is the sum of `passing_cells` noisy cells: `passing_cells(schema)`); -inf
    (no floor) without expected_rows."""
    if not 0 < false_stop < 0.5:
        raise ValueError(f"false_stop must lie in (0, 0.5), got {false_stop!r}")
    if expected_rows is None:
        return -math.inf
    wanted = max(float(least), MIN_ROWS_FRACTION * float(expected_rows))
    return min(wanted, float(expected_rows) - laplace_sum_quantile(passing_cells, event.noise_multiplier, false_stop))


def passing_cells(schema: Schema) -> int:
    """How many cells of passing rows the gate releases for `schema` (public): 1 (unchanged), 2
    where columns clamp or declare `other`, 4 where both."""
    clamp = any(schema.clamps(c) for c in schema.columns)
    other = any(c.other is not None for c in schema.columns)
    return 4 if clamp and other else 2 if clamp or other else 1


def laplace_sum_tail(k: int, x: float) -> float:
    """P(L_1 + ... + L_k > x) for k independent Laplace(0, 1) and x >= 0, exactly: the sum is
    G_1 - G_2 with G_i ~ Gamma(k, 1), so the tail is
    e^-x sum_{j<k} sum_{i<=j} x^(j-i) / ((j-i)! i!) * Gamma(k+i) / (Gamma(k) 2^(k+i)) (k = 1: e^-x / 2)."""
    if k < 1 or x < 0:
        raise ValueError(f"need k >= 1 and x >= 0, got k={k!r}, x={x!r}")
    total = 0.0
    for j in range(k):
        for i in range(j + 1):
            total += (
                x ** (j - i)
                / (math.factorial(j - i) * math.factorial(i))
                * math.gamma(k + i)
                / math.gamma(k)
                / 2.0 ** (k + i)
            )
    return math.exp(-x) * total


def laplace_sum_quantile(k: int, scale: float, p: float) -> float:
    """The t with P(sum of k Laplace(0, scale) > t) = p (p in (0, 0.5)): scale * ln(1 / (2p)) for
    k = 1, found by bisection on `laplace_sum_tail` otherwise (the sum is symmetric, so the same t
    bounds its lower tail)."""
    if k == 1:
        return scale * math.log(1.0 / (2.0 * p))
    lo, hi = 0.0, 1.0
    while laplace_sum_tail(k, hi) > p:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if laplace_sum_tail(k, mid) > p else (lo, mid)
    return scale * hi


def gate_event(epsilon: float) -> LaplaceEvent:
    """The event of one gate decision at this epsilon."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"gate epsilon must be a finite positive number, got {epsilon!r}")
    return LaplaceEvent(1.0 / float(epsilon))


def released_cells(cells: RowCells) -> list[str]:
    """The cells of `cells` the gate releases: those the public schema does not rule out (module
    docstring), in the histogram's order."""
    names = ["failing", "unchanged"]
    if cells.clamp:
        names.append("clamped")
    if cells.other_in_effect:
        names.append("other")
    if cells.clamp and cells.other_in_effect:
        names.append("both")
    return names


def gate(
    failing_rows: int,
    threshold: float,
    event: LaplaceEvent,
    passing_rows: int = 0,
    floor: float = -math.inf,
    cells: RowCells | None = None,
) -> GateDecision:
    """Release the DP histogram of the rows' cells (`cells`: failing, passing unchanged, passing
    with a clamped value, with an `other` value, with both; without it the pair (failing,
    passing)) with Laplace(1/epsilon) per cell (L1 sensitivity 1, module docstring) and decide:
    stop when failing exceeds `threshold` or the passing cells' sum falls below `floor`."""
    if failing_rows < 0 or passing_rows < 0:
        raise ValueError(f"row counts must be >= 0, got {failing_rows} failing and {passing_rows} passing")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    cells = RowCells.of(failing_rows, passing_rows) if cells is None else cells
    if (cells.failing, cells.passing) != (failing_rows, passing_rows):
        raise ValueError(
            f"the cells ({cells.failing} failing, {cells.passing} passing) are not the rows given "
            f"({failing_rows} failing, {passing_rows} passing)"
        )
    names = released_cells(cells)
    exact = np.array([float(getattr(cells, n)) for n in names])
    if (exact < 0).any():
        raise ValueError(f"cell counts must be >= 0, got {dict(zip(names, exact.tolist(), strict=True))}")
    noisy = dict(zip(names, (float(x) for x in laplace_mechanism(exact, 1.0, event.noise_multiplier)), strict=True))
    f = noisy["failing"]
    p = sum(v for n, v in noisy.items() if n != "failing")
    both = noisy.get("both", 0.0)
    return GateDecision(
        f,
        float(threshold),
        1.0 / event.noise_multiplier,
        f > threshold or p < floor,
        p,
        float(floor),
        noisy_clamped=noisy["clamped"] + both if "clamped" in noisy else None,
        noisy_other=noisy["other"] + both if "other" in noisy else None,
    )


# -- the run's limits, from its config and plan (pre-flight and the flow use the same) -------------


def false_stop_keyword(config: RunConfig) -> dict[str, float]:
    """The configured false-stop probability as a keyword, or none: the gate's own FALSE_STOP applies."""
    return {} if config.gate.false_stop is None else {"false_stop": config.gate.false_stop}


def _gate_event(plan: PrivacyPlan) -> LaplaceEvent:
    """The plan's validation gate: its DP count of failing rows, a Laplace mechanism."""
    event = plan.stage("validate").event
    if not isinstance(event, LaplaceEvent):
        raise TypeError(f"the plan's 'validate' stage is a {type(event).__name__}, not the gate's LaplaceEvent")
    return event


def gate_limit(config: RunConfig, schema: Schema, plan: PrivacyPlan) -> float:
    """The public limit on the validation gate's DP count of failing rows: the policy's fraction
    of expected_rows, at least the gate's noise floor (privacy/mechanisms/py)."""
    fraction = config.gate.strict_max_failing if config.policy == "strict" else config.gate.quarantine_max_failing
    return threshold(
        fraction * float(schema.dataset.expected_rows or 0),
        _gate_event(plan),
        **false_stop_keyword(config),
    )


def gate_floor(config: RunConfig, schema: Schema, plan: PrivacyPlan) -> float:
    """The public minimum on the validation gate's DP count of passing rows: a fraction of
    expected_rows, at least the selection split's minimum, below the noise of a table of the
    expected size (privacy/mechanisms/py); -inf without expected_rows."""
    expected = schema.dataset.expected_rows
    return floor(
        expected,
        config.select.min_rows(expected),
        _gate_event(plan),
        **false_stop_keyword(config),
        passing_cells=passing_cells(schema),
    )


def gate_note(config: RunConfig, schema: Schema, plan: PrivacyPlan) -> str | None:
    """A warning when the gate cannot stop the run: without expected_rows it has no minimum of
    rows and only its noise floor as a limit; with them, its limit (on a small table, the noise
    floor of its DP count) may be at least the expected row count, so even a table whose every
    row fails the checks goes on, trained on the rows that pass. From public quantities only."""
    expected = schema.dataset.expected_rows
    limit = gate_limit(config, schema, plan)
    eps = 1.0 / _gate_event(plan).noise_multiplier
    if expected is None:
        return (
            f"the schema declares no dataset.expected_rows, so the validation gate has no public minimum of rows "
            f"(a file with few or no rows is not stopped) and stops only above {limit:.0f} failing rows, the noise "
            f"floor of its DP count at epsilon {eps:.3g}. Declare the table's approximate size as expected_rows."
        )
    if limit < expected:
        return None
    size = f"{expected} expected rows"
    return (
        f"the validation gate cannot stop this run: its limit of {limit:.0f} failing rows (the noise floor of its "
        f"DP count at epsilon {eps:.3g}) is not below the table's {size}, so however many rows fail the "
        f"schema's checks the run goes on with the rows that pass ({config.policy} policy), possibly very few. "
        "Check the table against the schema before spending, or give the gate a larger share "
        "(privacy.gate_share) to lower the floor."
    )


__all__ = [
    "FALSE_STOP",
    "MIN_ROWS_FRACTION",
    "GateDecision",
    "RowCells",
    "false_stop_keyword",
    "floor",
    "gate",
    "gate_floor",
    "gate_limit",
    "gate_note",
    "gate_event",
    "laplace_sum_quantile",
    "laplace_sum_tail",
    "passing_cells",
    "released_cells",
    "threshold",
]
