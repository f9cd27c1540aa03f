"""DP bounds of a numeric, integer, date or datetime column (`privflow schema draft`).

Numbers (`QuantileBounds`, below): the 0.5% and 99.5% DP quantiles (exponential mechanism) on a
public symmetric log grid, within windows around a scale the caller took from a DP release.
Dates and datetimes (`DPBounds`, the "year" grid): the outermost cells of a PUBLIC grid whose
Laplace counts pass a threshold.
The rest of this docstring describes `DPBounds`.

A DP estimate of a small quantile from both ends ("min/max-ish"): the lowest cell whose noisy
count passes T is where about T rows lie below, the q = T / n quantile read off a noisy histogram
(the Google differential-privacy library's ApproxBounds does the same on powers of two). Not the
exponential-mechanism quantile of `dp_quantile.py`: its utility -|#{x < t} - q n| is the same
for every candidate below the column's minimum, so where q n epsilon is small, or where the low
quantile falls on a point mass (an amount that is often exactly 0), it picks uniformly among all
candidates below the data, on a +-1e9 search range a bound far out. Thresholded cells scanned
from outside in stop at the first cell that holds rows; an empty cell passes only with the
public false-cell probability.

Grids (public, never read off the rows), each with one more cell for the missing values (a
public key, released always: the column's DP missing count):

- numbers: edges 0, +-{1, 2, 5} x 10^k for k = -3..8, and +-1e9 (a log-scale search range);
  values beyond +-1e9 are clipped into the end cells (a per-row map: the sensitivity holds);
- dates and datetimes: one cell per calendar year from 1900 to 2100 on the day number (days
  since 1970-01-01, fractional for datetimes), clipped likewise.

Sensitivity: a row falls in exactly one cell (missing included), so adding or removing it moves
one count by 1: L1 sensitivity 1, Laplace(1/epsilon) per cell, `LaplaceEvent(1/epsilon)`
(Dwork et al. 2006), from `laplace_mechanism`'s exact sampler. The threshold T = b ln(cells /
FALSE_CELL) keeps every empty cell below it with probability at least 1 - FALSE_CELL (the union
bound on the tail exp(-T / b), which holds for OpenDP's discrete Laplace as well).

Post-processing (`nice_bounds`): the span [low edge of the lowest passing cell, high edge of the
highest] is widened by MARGIN of its width on each side, never across 0 when it did not reach
past it (an amount stays >= 0), and rounded outward to a multiple of the power of ten below the
span; integer columns to whole numbers. Dates keep the passing years' first and last days.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from typing import Literal

import numpy as np

from privflow.privacy.accounting.events import LaplaceEvent, PureDPEvent
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism

FALSE_CELL = 0.01  # largest probability that some empty cell passes the threshold
MARGIN = 0.1  # the passing span is widened by this share of its width on each side
NUMBER_LIMIT = 1e9  # the numbers' public search range is [-NUMBER_LIMIT, NUMBER_LIMIT]
SMALLEST_EDGE = -3  # 10^SMALLEST_EDGE: the finest cell next to 0
FIRST_YEAR, LAST_YEAR = 1900, 2100  # the dates' public search range
_EPOCH = date(1970, 1, 1)

Grid = Literal["number", "year"]


def number_edges() -> np.ndarray:
    """The numbers' cell edges: 0, +-{1, 2, 5} x 10^k (k = SMALLEST_EDGE..8), +-NUMBER_LIMIT."""
    top = int(round(math.log10(NUMBER_LIMIT)))
    pos = sorted({float(f"{m}e{k}") for k in range(SMALLEST_EDGE, top) for m in (1, 2, 5)} | {NUMBER_LIMIT})
    return np.array([-x for x in reversed(pos)] + [0.0] + pos, dtype=np.float64)


def year_edges() -> np.ndarray:
    """The dates' cell edges: 1 January of FIRST_YEAR..LAST_YEAR + 1, as days since 1970-01-01."""
    return np.array([(date(y, 1, 1) - _EPOCH).days for y in range(FIRST_YEAR, LAST_YEAR + 2)], dtype=np.float64)


def day_number(d: date) -> int:
    return (d - _EPOCH).days


@dataclass(frozen=True)
class BoundsRelease:
    """What one release shows: the passing span's edges (None: no cell passed), the missing values'
    noisy count, and the public settings."""

    low: float | None
    high: float | None
    noisy_missing: float
    epsilon: float
    threshold: float

    @property
    def found(self) -> bool:
        return self.low is not None and self.high is not None


@dataclass(frozen=True)
class DPBounds:
    """Public settings of one release: epsilon and the grid."""

    epsilon: float
    grid: Grid = "number"

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"the bounds' epsilon must be a finite positive number, got {self.epsilon!r}")
        if self.grid not in ("number", "year"):
            raise ValueError(f"unknown grid {self.grid!r}")

    def edges(self) -> np.ndarray:
        return number_edges() if self.grid == "number" else year_edges()

    @property
    def scale(self) -> float:
        return 1.0 / float(self.epsilon)

    @property
    def threshold(self) -> float:
        """T = b ln(cells / FALSE_CELL)."""
        return self.scale * math.log((len(self.edges()) - 1) / FALSE_CELL)

    def event(self) -> LaplaceEvent:
        return laplace_event(self.scale)

    def counts(self, values: np.ndarray) -> np.ndarray:
        """The exact cell counts of the present (finite) values, each clipped into the grid."""
        edges = self.edges()
        x = np.asarray(values, dtype=np.float64).ravel()
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite; count missing values apart")
        idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
        return np.bincount(idx, minlength=len(edges) - 1).astype(np.float64)

    def release(self, values: np.ndarray, missing: int) -> BoundsRelease:
        """One Laplace release of the cell counts and the missing count; the passing span."""
        if missing < 0:
            raise ValueError(f"missing must be >= 0, got {missing}")
        edges = self.edges()
        noisy = laplace_mechanism(np.append(self.counts(values), float(missing)), 1.0, self.scale)
        t = self.threshold
        passing = np.nonzero(noisy[:-1] > t)[0]
        if passing.size == 0:
            return BoundsRelease(None, None, float(noisy[-1]), float(self.epsilon), t)
        return BoundsRelease(
            float(edges[passing[0]]), float(edges[passing[-1] + 1]), float(noisy[-1]), float(self.epsilon), t
        )


def _tidy(x: float) -> float:
    return float(f"{x:.12g}") + 0.0  # no float dust (0.30000000000000004), no -0.0


def nice_bounds(low: float, high: float, integer: bool = False) -> tuple[float, float]:
    """The passing span widened by MARGIN each side (not across 0 where it did not reach past it),
    rounded outward to a multiple of the power of ten below its width; whole numbers for integers."""
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got [{low}, {high}]")
    span = high - low
    a, b = low - MARGIN * span, high + MARGIN * span
    if low >= 0:
        a = max(a, 0.0)
    if high <= 0:
        b = min(b, 0.0)
    step = 10.0 ** math.floor(math.log10(span))
    a, b = _tidy(math.floor(_tidy(a / step)) * step), _tidy(math.ceil(_tidy(b / step)) * step)
    if integer:
        a, b = float(math.floor(a)), float(math.ceil(b))
        if a == b:
            b = a + 1.0
    return a, b


# -- bounds from DP quantiles on the public symmetric log grid (`privflow schema draft`) ------------

SIGN_SHARE = 0.005  # a column is taken as non-negative when at most this share of its values is negative
LOW_Q, HIGH_Q = 0.005, 0.995  # the quantiles the drafted bounds are: about 0.5% clamped at each end
GRID_PER_DECADE = 20  # the bounds' log grid: 20 candidates per decade (12% steps)
WINDOW_BELOW, WINDOW_ABOVE = 3, 2  # the candidates lie within these many decades below / above the scale
PRIOR_PER_STEP = 0.15  # each grid step further from the median costs this much log-weight (noise-scale units)
Sign = Literal["nonnegative", "nonpositive", "both"]


@dataclass(frozen=True)
class QuantileBoundsRelease:
    low: float
    high: float


@dataclass(frozen=True)
class QuantileBounds:
    """A numeric column's DP bounds: two exponential-mechanism quantiles (Smith 2011,
    `dp_quantile.CandidateQuantile`), LOW_Q and HIGH_Q, each at `epsilon`, on the PUBLIC symmetric
    log grid `dp_quantile.log_grid(GRID_PER_DECADE)`, within windows around a scale s that is
    public to this mechanism (the draft takes it from its DP kind histogram: the upper edge of the
    decade holding most values):

    - low end: 0, the candidates in [s / 10^WINDOW_BELOW, s] (and their negatives where `sign` is
      "both");
    - high end: the same inner candidates, then those in (s, s 10^WINDOW_ABOVE] at a public prior
      of -PRIOR_PER_STEP (in units of the noise scale) per step past s, and mirrored for the low
      end where `sign` is "both". Beyond the data the quantile's utility is flat, so at a small
      epsilon the pick is near uniform over the candidates there: the window and the prior bound
      how far an end lands past the data, at the cost of clamping more of a heavy tail.

    A public offset per candidate and a public candidate list leave the utility's sensitivity at 1:
    each end is epsilon-DP, the event `PureDPEvent(2 epsilon)` by basic composition."""

    epsilon: float
    scale: float
    sign: Sign = "both"
    below: int = WINDOW_BELOW  # decades of candidates below the scale
    above: int = WINDOW_ABOVE  # ... and above it
    prior: float = PRIOR_PER_STEP  # the log-weight each step past the scale costs (0: a flat window)

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"the bounds' epsilon must be a finite positive number, got {self.epsilon!r}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"the scale must be a finite positive number, got {self.scale!r}")

    def event(self) -> PureDPEvent:
        return PureDPEvent(2.0 * float(self.epsilon))

    def candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(low candidates, their prior, high candidates, their prior): public, from the settings."""
        from privflow.privacy.mechanisms.dp_quantile import log_grid

        grid = log_grid(GRID_PER_DECADE)
        pos = grid[grid > 0]
        s = float(pos[np.argmin(np.abs(np.log10(pos) - math.log10(self.scale)))])
        inner = pos[(pos >= s / 10.0**self.below) & (pos <= s)]
        outer = pos[(pos > s) & (pos <= s * 10.0**self.above)]
        c = float(self.prior)
        neg = self.sign == "both"
        steps = -c * np.arange(1, len(outer) + 1, dtype=np.float64)
        highs = np.concatenate([-inner[::-1] if neg else [], [0.0], inner, outer])
        high_prior = np.concatenate([np.zeros(len(highs) - len(outer)), steps])
        lows = np.concatenate([-outer[::-1] if neg else [], -inner[::-1] if neg else [], [0.0], inner])
        low_prior = np.concatenate([steps[::-1] if neg else [], np.zeros(len(lows) - (len(outer) if neg else 0))])
        return lows, low_prior, highs, high_prior

    def release(self, values: np.ndarray) -> QuantileBoundsRelease:
        from privflow.privacy.mechanisms.dp_quantile import CandidateQuantile

        x = np.asarray(values, dtype=np.float64).ravel()
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite; count missing values apart")
        if self.sign == "nonpositive":
            mirror = QuantileBounds(self.epsilon, self.scale, "nonnegative", self.below, self.above, self.prior)
            mirror_release = mirror.release(-x)
            return QuantileBoundsRelease(-mirror_release.high, -mirror_release.low)
        lows, low_prior, highs, high_prior = self.candidates()
        low = CandidateQuantile(LOW_Q, self.epsilon, tuple(lows), tuple(low_prior)).release(x)
        high = CandidateQuantile(HIGH_Q, self.epsilon, tuple(highs), tuple(high_prior)).release(x)
        if high <= low:  # the two picks crossed (noise): the next candidate up holds the span
            above = highs[highs > low]
            high = float(above[0]) if above.size else low * 2.0 + 1.0
        return QuantileBoundsRelease(float(low), float(high))


def round_out(low: float, high: float, integer: bool = False) -> tuple[float, float]:
    """[low, high] rounded outward to two significant digits of its width (never across 0 where
    it did not reach past it); whole numbers for an integer column."""
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got [{low}, {high}]")
    step = 10.0 ** (math.floor(math.log10(high - low)) - 1)
    a, b = _tidy(math.floor(_tidy(low / step)) * step), _tidy(math.ceil(_tidy(high / step)) * step)
    if low >= 0:
        a = max(a, 0.0)
    if high <= 0:
        b = min(b, 0.0)
    if integer:
        a, b = float(math.floor(a)), float(math.ceil(b))
        if a == b:
            b = a + 1.0
    return a, b


@dataclass(frozen=True)
class YearQuantileBounds:
    """A date or datetime column's DP bounds: the LOW_Q and HIGH_Q quantiles of its day numbers by
    the exponential mechanism (`dp_quantile.CandidateQuantile`, OpenDP's `make_private_quantile`)
    over the PUBLIC candidates 1 January of FIRST_YEAR..LAST_YEAR + 1, each at `epsilon`: pure DP,
    `PureDPEvent(2 epsilon)`. Beyond the data the utility is flat, so at a small epsilon an end
    lands anywhere there (a bound wider than the data, never narrower by more than the noise)."""

    epsilon: float

    def event(self) -> PureDPEvent:
        return PureDPEvent(2.0 * float(self.epsilon))

    def release(self, days: np.ndarray) -> tuple[date, date]:
        """(first day, last day) of the years the two quantiles pick (the high end's year excluded
        when it picked a 1 January: the bound is the day before)."""
        from privflow.privacy.mechanisms.dp_quantile import CandidateQuantile

        edges = tuple(float(e) for e in year_edges())
        low = CandidateQuantile(LOW_Q, self.epsilon, edges).release(days)
        high = CandidateQuantile(HIGH_Q, self.epsilon, edges).release(days)
        if high <= low:
            high = low + 366.0
        first = date.fromordinal(_EPOCH.toordinal() + int(low))
        last = date.fromordinal(_EPOCH.toordinal() + int(high))
        first = date(first.year, 1, 1)
        return first, date(max(last.year - 1, first.year), 12, 31)


def year_span(low: float, high: float) -> tuple[date, date]:
    """The first and last day of the passing years (cell edges are 1 January of consecutive years)."""
    first = date.fromordinal(_EPOCH.toordinal() + int(low))
    last_exclusive = date.fromordinal(_EPOCH.toordinal() + int(high))
    return first, date(last_exclusive.year - 1, 12, 31)


__all__ = [
    "FALSE_CELL",
    "FIRST_YEAR",
    "HIGH_Q",
    "LOW_Q",
    "SIGN_SHARE",
    "Sign",
    "WINDOW_ABOVE",
    "WINDOW_BELOW",
    "YearQuantileBounds",
    "QuantileBounds",
    "QuantileBoundsRelease",
    "round_out",
    "LAST_YEAR",
    "MARGIN",
    "NUMBER_LIMIT",
    "BoundsRelease",
    "DPBounds",
    "day_number",
    "nice_bounds",
    "number_edges",
    "year_edges",
    "year_span",
]
