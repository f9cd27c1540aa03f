"""DP histograms: `PublicHistogram`, Laplace counts over a public list of cells (below); and a DP
histogram over values nobody listed in advance: noisy counts of the values that occur,
kept above a threshold (the stability-based histogram).

Korolova, Kenthapadi, Mishra & Ntoulas 2009 ("Releasing search queries and clicks privately",
WWW: the release of the queries whose Laplace-noised count passes a threshold set from delta)
and Gopi, Gulhane, Kulkarni, Shen, Shokouhi & Yekhanin 2020 ("Differentially private set
union", ICML: the one-item-per-user case of their Laplace policy, their Section 3) analyse the
same release. (Neither paper is in ../shared/papers; the argument is written out below.)

    for every value v that occurs in the column:   c~(v) = c(v) + Laplace(b),  b = 1 / epsilon
    release {(v, c~(v)) : c~(v) > T},   T = 1 + b ln(1 / delta)
    public keys (the column's missing values): released always, c~ = c + Laplace(b)

Sensitivity: a row holds one value of the column (or is missing), so adding or removing it
changes one count by 1. If that value already occurs, the two releases differ only in that
coordinate's Laplace count, epsilon-DP (the threshold is post-processing of it). If it does not
(a count of 1 against none), the one table releases it only when 1 + Z > T; that happens with
probability at most exp(-(T - 1) / b) = delta, and otherwise both release the same thing: the
release is (epsilon, delta)-DP, `ApproxDPEvent(epsilon, delta)`. The continuous Laplace's tail
is (1/2) exp(-t / b); the factor 1/2 is dropped so that the bound holds for OpenDP's exact
discrete Laplace on its 2^k grid as well (its tail is exp(-t / b) / (1 + exp(-g / b))).
`keep_probability` is the continuous closed form that the tests compare against.

The noise is `laplace_mechanism`'s exact sampler (OpenDP), no caller generator.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from privflow.privacy.accounting.events import ApproxDPEvent, LaplaceEvent
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism

K = TypeVar("K", bound=Hashable)  # a histogram's keys: a column's values

MAX_DELTA = 0.1  # a delta above this keeps values of count 1 too often to call the release private


@dataclass(frozen=True)
class ThresholdedHistogram:
    """Public settings of one release: epsilon (the Laplace scale 1/epsilon) and delta (the threshold)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"the histogram's epsilon must be a finite positive number, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta <= MAX_DELTA):
            raise ValueError(f"the histogram's delta must lie in (0, {MAX_DELTA:g}], got {self.delta!r}")

    @property
    def scale(self) -> float:
        """The Laplace scale b = 1/epsilon (L1 sensitivity 1)."""
        return 1.0 / float(self.epsilon)

    @property
    def threshold(self) -> float:
        """T = 1 + b ln(1/delta): a value of count 1 passes it with probability at most delta."""
        return 1.0 + self.scale * math.log(1.0 / float(self.delta))

    def epsilon_to_pass(self, rows: float) -> float:
        """The epsilon at which the threshold, at this delta, is `rows` (> 1): a value held by that
        many rows passes it about half the time. No (epsilon, delta)-DP release can list a value held
        by fewer than about ln(1/delta) / epsilon rows."""
        if not rows > 1.0:
            raise ValueError(f"rows must exceed 1, got {rows!r}")
        return math.log(1.0 / float(self.delta)) / (float(rows) - 1.0)

    def event(self) -> ApproxDPEvent:
        return ApproxDPEvent(float(self.epsilon), float(self.delta))

    def release(self, counts: Mapping[K, int], public: Iterable[K] = ()) -> dict[K, float]:
        """Noisy counts of the `public` keys (always, count 0 where absent) and of the other keys of
        `counts` whose noisy count passes the threshold. `counts` holds the values that occur (count
        >= 1) of one column, each row counted once."""
        pub = list(dict.fromkeys(public))
        listed = set(pub)
        private = [k for k, c in counts.items() if c > 0 and k not in listed]
        keys = pub + private
        if not keys:
            return {}
        exact = np.array([float(counts.get(k, 0)) for k in keys], dtype=np.float64)
        if np.any(exact < 0):
            raise ValueError("counts must be >= 0")
        noisy = laplace_mechanism(exact, 1.0, self.scale)
        out: dict[K, float] = {k: float(noisy[i]) for i, k in enumerate(pub)}
        t = self.threshold
        for i, k in enumerate(private, start=len(pub)):
            if noisy[i] > t:
                out[k] = float(noisy[i])
        return out


@dataclass(frozen=True)
class PublicHistogram:
    """Laplace counts over a PUBLIC list of cells (the caller's; nothing read off the rows decides
    which cells exist): each row counts in `sensitivity` cells (one per level of a hierarchy), so
    adding or removing it moves those counts by 1 each, L1 sensitivity `sensitivity`,
    Laplace(sensitivity/epsilon) per cell, `LaplaceEvent(1/epsilon)` (Dwork et al. 2006),
    `laplace_mechanism`'s exact sampler. Used for a column's kind histogram
    (privflow/data/draft.py `KIND_CELLS`)."""

    epsilon: float
    sensitivity: float = 1.0  # how many cells one row counts in (its L1 sensitivity)

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"the histogram's epsilon must be a finite positive number, got {self.epsilon!r}")
        if not (isinstance(self.sensitivity, int | float) and math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise ValueError(f"the histogram's sensitivity must be a finite positive number, got {self.sensitivity!r}")

    @property
    def scale(self) -> float:
        """The Laplace scale: sensitivity / epsilon."""
        return float(self.sensitivity) / float(self.epsilon)

    def event(self) -> LaplaceEvent:
        return laplace_event(1.0 / float(self.epsilon))

    def release(self, counts: np.ndarray) -> np.ndarray:
        """Noisy counts of the cells: `counts[i]` is how many rows fall in cell i (each row in one)."""
        exact = np.asarray(counts, dtype=np.float64).ravel()
        if np.any(exact < 0) or not np.all(np.isfinite(exact)):
            raise ValueError("counts must be finite and >= 0")
        return laplace_mechanism(exact, float(self.sensitivity), 1.0 / float(self.epsilon))


def keep_probability(count: float, epsilon: float, delta: float) -> float:
    """P(count + Laplace(1/epsilon) > T) for the continuous Laplace (the closed form the tests check
    the sampler against): (1/2) exp(-(T - c) epsilon) below T, 1 - (1/2) exp(-(c - T) epsilon) above."""
    h = ThresholdedHistogram(epsilon, delta)
    gap = (float(count) - h.threshold) / h.scale
    return 0.5 * math.exp(gap) if gap < 0 else 1.0 - 0.5 * math.exp(-gap)


def dp_histogram_event(epsilon: float, delta: float) -> ApproxDPEvent:
    """The event of one `ThresholdedHistogram(epsilon, delta).release`."""
    return ThresholdedHistogram(epsilon, delta).event()


__all__ = ["MAX_DELTA", "PublicHistogram", "ThresholdedHistogram", "dp_histogram_event", "keep_probability"]
