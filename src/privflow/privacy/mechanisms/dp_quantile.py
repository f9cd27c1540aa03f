"""A DP quantile of per-row scores: the anomaly threshold of `privflow score --fpr q`; and the
same exponential mechanism over an explicit public candidate list (`CandidateQuantile`, the DP
bounds of `privflow schema draft`, on the public symmetric log grid `log_grid`).

The exponential mechanism (Smith 2011) over a PUBLIC grid of candidate thresholds t in the
public clip range [low, high] (the run config's `select.score_low`/`score_high`, by default
[-20, 10] nats), with utility

    u(D, t) = -| #{x in D : x < t} - q |D| |.

Adding or removing one row changes #{x < t} by at most 1 and q|D| by q, in the same
direction when x < t and alone otherwise, so u moves by at most max(1 - q, q) <= 1:
sensitivity 1 under add/remove (a count-based utility; no row value is ever released).

The release is OpenDP 0.16's `make_private_quantile` (the same score, scaled to integers
and computed as (1-q)#{x < t} - q#{x > t}, which equals #{x < t} - q|D| off the grid points),
with symmetric (add/remove) distance and max divergence; its scale is calibrated so that
OpenDP's own privacy map of distance 1 is at most epsilon, so the event this module
reports, `PureDPEvent(epsilon)`, is never stronger than what OpenDP certifies. The noise
comes from OpenDP's exact samplers and OS entropy; no caller generator reaches it.

Scores are clipped to [low, high] first (NaN and -inf to low, +inf to high): a per-row map,
so the sensitivity holds, and clipping does not change which side of a grid point a score
falls on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from privflow.core.limits import MAX_NATS
from privflow.privacy.accounting.events import Event, PureDPEvent
from privflow.privacy.noise import calibrated, exact_noisy_max, opendp_parts

DEFAULT_GRID_POINTS = 301  # 0.1 nat steps over the default [-20, 10]
MIN_STEP = 1e-6  # nats between grid points: float32 log-likelihoods of tens of nats resolve no finer


@dataclass(frozen=True)
class DPQuantile:
    """Public settings of one quantile release: which quantile, at what epsilon, on which grid."""

    q: float
    epsilon: float
    low: float = -20.0
    high: float = 10.0
    grid_points: int = DEFAULT_GRID_POINTS

    def __post_init__(self) -> None:
        if not (isinstance(self.q, int | float) and 0.0 < self.q < 1.0):
            raise ValueError(f"the quantile (false-positive rate) must lie strictly between 0 and 1, got {self.q!r}")
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"the quantile's epsilon must be a finite positive number, got {self.epsilon!r}")
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"need a finite clip range low < high, got [{self.low}, {self.high}]")
        if max(abs(self.low), abs(self.high)) > MAX_NATS:
            raise ValueError(f"the clip range [{self.low:g}, {self.high:g}] reaches past +-{MAX_NATS:g} nats")
        if int(self.grid_points) < 2:
            raise ValueError(f"the candidate grid needs at least 2 points, got {self.grid_points}")
        if self.step < MIN_STEP:  # no log-likelihood is resolved that finely: the release would be noise
            raise ValueError(
                f"the clip range [{self.low:g}, {self.high:g}] over {self.grid_points} points gives steps of "
                f"{self.step:.3g} nats, under {MIN_STEP:g}; widen it"
            )

    def grid(self) -> np.ndarray:
        """The public candidate thresholds: evenly spaced over [low, high], both ends included."""
        return quantile_grid(self.low, self.high, self.grid_points)

    @property
    def step(self) -> float:
        return (self.high - self.low) / (int(self.grid_points) - 1)

    def event(self) -> Event:
        """The privacy event of one release: pure epsilon-DP."""
        return PureDPEvent(float(self.epsilon))

    def measurement(self) -> Any:
        """The calibrated OpenDP measurement (its map(1) <= epsilon)."""
        return quantile_measurement(
            float(self.q), float(self.epsilon), float(self.low), float(self.high), int(self.grid_points)
        )

    def release(self, scores: np.ndarray) -> float:
        """The DP q-quantile of `scores` (one pick from the grid)."""
        return float(self.measurement()(clip_scores(scores, self.low, self.high).tolist()))


def quantile_grid(low: float, high: float, points: int) -> np.ndarray:
    return np.linspace(float(low), float(high), int(points))


def clip_scores(scores: np.ndarray, low: float, high: float) -> np.ndarray:
    """Per-row clip to [low, high]; NaN and -inf go to low, +inf to high."""
    v = np.asarray(scores, dtype=np.float64).ravel()
    return np.clip(np.nan_to_num(v, nan=low, posinf=high, neginf=low), low, high)


@lru_cache(maxsize=64)
def quantile_measurement(q: float, epsilon: float, low: float, high: float, points: int) -> Any:
    """OpenDP's private quantile over the grid, add/remove distance, scale calibrated to epsilon."""
    dp = opendp_parts()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    candidates = quantile_grid(low, high, points).tolist()

    def build(scale: float) -> Any:
        return dp.m.make_private_quantile(domain, dp.symmetric_distance(), dp.max_divergence(), candidates, q, scale)

    per_unit = float(build(1.0).map(1))  # epsilon at scale 1; the map is proportional to 1/scale
    return calibrated(build, 1, epsilon, per_unit / epsilon)


# -- a quantile over an explicit public candidate list (`privflow schema draft`'s bounds) -------------

LOG_GRID_PER_DECADE = 10  # candidates per decade of the symmetric log grid
LOG_GRID_EXPONENTS = (-6, 12)  # |t| from 10^-6 to 10^12, both signs, and 0


def log_grid(per_decade: int = LOG_GRID_PER_DECADE, exponents: tuple[int, int] = LOG_GRID_EXPONENTS) -> np.ndarray:
    """The PUBLIC symmetric log grid: 0 and +-10^(k / per_decade) for k from exponents[0] * per_decade to
    exponents[1] * per_decade (sorted, 2 * 18 * 10 + 3 = 363 points by default)."""
    lo, hi = int(exponents[0]) * int(per_decade), int(exponents[1]) * int(per_decade)
    pos = np.array([float(f"{10.0 ** (k / per_decade):.6g}") for k in range(lo, hi + 1)])
    return np.concatenate([-pos[::-1], [0.0], pos])


@dataclass(frozen=True)
class CandidateQuantile:
    """One q-quantile by the exponential mechanism (Smith 2011) over a PUBLIC sorted candidate list:
    the utility -|#{x < t} - q n| as in `DPQuantile`, sensitivity 1 under add/remove, OpenDP's
    `make_private_quantile` calibrated so that its map(1) <= epsilon: pure epsilon-DP, `PureDPEvent`.
    Values are clipped into [candidates[0], candidates[-1]] first (a per-row map)."""

    q: float
    epsilon: float
    candidates: tuple[float, ...]
    prior: tuple[float, ...] | None = None  # public log-weights per candidate, in units of the noise scale

    def __post_init__(self) -> None:
        if not (isinstance(self.q, int | float) and 0.0 < self.q < 1.0):
            raise ValueError(f"the quantile must lie strictly between 0 and 1, got {self.q!r}")
        if self.prior is not None and (
            len(self.prior) != len(self.candidates) or not all(math.isfinite(p) for p in self.prior)
        ):
            raise ValueError("the prior needs one finite log-weight per candidate")
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"the quantile's epsilon must be a finite positive number, got {self.epsilon!r}")
        c = np.asarray(self.candidates, dtype=np.float64)
        if c.size < 2 or not np.all(np.isfinite(c)) or not np.all(np.diff(c) > 0):
            raise ValueError("the candidates must be at least 2 finite, strictly increasing numbers")

    def event(self) -> Event:
        return PureDPEvent(float(self.epsilon))

    def measurement(self) -> Any:
        return candidate_measurement(float(self.q), float(self.epsilon), tuple(float(c) for c in self.candidates))

    def utility(self, values: np.ndarray) -> np.ndarray:
        """u(t) = -|#{x < t} - q n| for every candidate t (sensitivity max(q, 1 - q) <= 1)."""
        v = np.sort(clip_scores(values, self.candidates[0], self.candidates[-1]))
        below = np.searchsorted(v, np.asarray(self.candidates, dtype=np.float64), side="left")
        return -np.abs(below - float(self.q) * v.size)

    def rank_error(self, beta: float = 0.05) -> float:
        """Rows: with probability at least 1 - beta the pick's utility is within this of the best
        candidate's, i.e. about this many rows from the q-quantile's rank where the candidates are
        fine enough (the exponential mechanism's accuracy at scale 2/epsilon, sensitivity 1: 2 (ln
        |candidates| + ln(1/beta)) / epsilon; McSherry & Talwar 2007, Theorem 8). Without a prior."""
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta must lie strictly between 0 and 1, got {beta!r}")
        return 2.0 * (math.log(len(self.candidates)) + math.log(1.0 / beta)) / float(self.epsilon)

    def release(self, values: np.ndarray) -> float:
        """The DP q-quantile of `values` (one of the candidates). Without a prior: OpenDP's
        `make_private_quantile`; with one: Report-Noisy-Max with exponential noise (OpenDP's exact
        `make_noisy_max`, scale 2/epsilon for a sensitivity-1 non-monotone score) over u(t) + the
        prior times that scale. A public offset per candidate leaves the sensitivity as it is."""
        if self.prior is None:
            v = clip_scores(values, self.candidates[0], self.candidates[-1])
            return float(self.measurement()(v.tolist()))
        scores = self.utility(values) + np.asarray(self.prior, dtype=np.float64) * (2.0 / float(self.epsilon))
        return float(self.candidates[exact_noisy_max(scores, 1.0, float(self.epsilon), monotone=False)])


@lru_cache(maxsize=256)
def candidate_measurement(q: float, epsilon: float, candidates: tuple[float, ...]) -> Any:
    """OpenDP's private quantile over `candidates`, add/remove distance, scale calibrated to epsilon."""
    dp = opendp_parts()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))

    def build(scale: float) -> Any:
        return dp.m.make_private_quantile(
            domain, dp.symmetric_distance(), dp.max_divergence(), list(candidates), q, scale
        )

    per_unit = float(build(1.0).map(1))
    return calibrated(build, 1, epsilon, per_unit / epsilon)


__all__ = [
    "DEFAULT_GRID_POINTS",
    "LOG_GRID_EXPONENTS",
    "LOG_GRID_PER_DECADE",
    "CandidateQuantile",
    "DPQuantile",
    "candidate_measurement",
    "log_grid",
    "clip_scores",
    "quantile_grid",
    "quantile_measurement",
]
