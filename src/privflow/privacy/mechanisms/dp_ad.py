"""DP anomaly detection by sample-and-aggregate (DP-AD; DP-NF, Waites & Cummings 2021, section 5,
Algorithm 2) and its privacy events.

Partitions. The private table D is split into k disjoint parts by a salted hash of each row
and its occurrence rank (`partition_of`, `privflow.data.row_hash`): the part of a row's k-th copy is
a function of that row and k alone (the salt is drawn from the OS CSPRNG and kept
curator-only), so adding or removing one row changes exactly one part, as a multiset, and
leaves every other part as it was (a position-based split would shift every later row). Each
part trains a NON-private density estimator and sets its own threshold tau_i from its own
held-out rows (`partition_threshold`, the empirical fpr-quantile of their
log-likelihoods; or a public tau for every part, the paper's "known likelihood threshold").
Everything a part computes is a function of that part only.

Votes (Algorithm 2, lines 4-9). For a query x, part i votes "anomalous" when
log p_i(x) < tau_i; c_out(x) counts those votes and c_in(x) = k - c_out(x) (k is public).

Sensitivity. One row added or removed changes one part, hence at most one model and one
threshold, hence at most one vote on every query: c_out(x) and c_in(x) each move by at most
1 (in opposite directions): L-infinity sensitivity 1 of the score vector (c_in, c_out), not
monotone. This holds whatever the part's model does, so the models themselves need no noise
(sample-and-aggregate, Nissim, Raskhodnikova & Smith 2007).

Aggregation (Algorithm 2, lines 10-11), `VoteAggregation`: Report-Noisy-Max over the two
counts with exponential noise of scale 2/epsilon, i.e. OpenDP's exact ``make_noisy_max``
(``privacy.noise.exact_noisy_max``, non-monotone L-infinity distance), whose certified map of
distance 1 is at most epsilon. Its output law is permute-and-flip's (McKenna & Sheldon 2020;
Ding et al. 2021): with d = c_out - c_in,

    P(anomalous) = 1 - exp(-epsilon d / 2) / 2   (d >= 0),    exp(epsilon d / 2) / 2   (d < 0),

where the paper's exponential mechanism gives 1 / (1 + exp(-epsilon d / 2)): the same
epsilon-DP guarantee, and never less likely to return the majority (`prob_anomalous`). Each
answered query is epsilon-DP with respect to D; q answered queries, chosen adaptively or not,
are ``RepeatedEvent(PureDPEvent(epsilon), q)`` (`VoteAggregation.event`), composed by the
ledger's PLD accountant.

Sparse vector (option), `SparseVector`: for long streams in which few rows are expected to be
anomalous. Sparse with cutoff c (Dwork & Roth 2014, Algorithms 1 and 2; Lyu, Su & Li 2017,
Algorithm 1 with epsilon_1 = epsilon_2 = epsilon / 2) runs AboveThreshold instances one after
another over the rows in file order. An instance draws a noisy threshold T + rho, rho discrete
Laplace of scale 2/epsilon, and answers each row "not flagged" until a row with
c_out(x) + nu >= T + rho, nu discrete Laplace of scale 4/epsilon (fresh per row), which it
answers "flagged" and stops; the next row starts a new instance. After c flags the call halts
and later rows are not answered. Counts and noise are integers (OpenDP's exact discrete Laplace,
certified: map(1) of the threshold noise and map(2) of the query noise are each at most
epsilon / 2), so the comparisons are exact.

Exact privacy statement of one SVT call, and what the ledger records. Each AboveThreshold
instance is epsilon-DP with respect to D for its whole output (the rows it answered "not
flagged" and the flag that ended it; Dwork & Roth Theorem 3.23, which holds for integer noise
since every shift in its proof is an integer). An instance cut short by the end of the file
released only "not flagged" answers: that costs epsilon / 2 (threshold noise alone), and the
ledger still records epsilon for it. Whether another instance starts depends only on the
earlier answers and the public file length. The call therefore is an adaptive sequence of m
epsilon-DP mechanisms, m = flags + (1 if rows were answered after the last flag), at most c
(and at most the number of rows): the ledger reserves ``RepeatedEvent(PureDPEvent(epsilon),
min(c, q))`` before any vote is counted and settles ``RepeatedEvent(PureDPEvent(epsilon), m)``
(`SparseVector.reserve_event`, `SparseVector.event`). Only flagged rows (and the one open
instance) pay; "not flagged" answers within an instance are free. As for every run the
ledger composes, the decision to run each further mechanism was made from public inputs and
earlier outputs, the setting of a privacy filter: under basic composition (the sum of the
epsilons) that is a valid filter for pure-DP pieces (Rogers, Roth, Ullman & Vadhan 2016); the
PLD total the ledger reports treats the realised sequence as if it had been fixed in advance,
as it does for runs. The accountant has no SVT event; the instances are recorded as the pure
epsilon-DP events they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl

from privflow.data.row_hash import row_units
from privflow.privacy.accounting.events import Event, PureDPEvent, RepeatedEvent
from privflow.privacy.noise import calibrated, noisy_max_measurement, opendp_parts

MAX_PARTITIONS = 1000
IN, OUT = 0, 1  # candidate indices of the aggregation: in-distribution, anomalous
NOT_ANSWERED, NOT_FLAGGED, FLAGGED = -1, 0, 1  # SVT answers per row


def _check_epsilon(epsilon: float, what: str = "epsilon") -> None:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"{what} must be a finite positive number, got {epsilon!r}")


def _check_partitions(k: int) -> None:
    if not (isinstance(k, int | np.integer) and 1 <= int(k) <= MAX_PARTITIONS):
        raise ValueError(f"the number of partitions must be an integer in [1, {MAX_PARTITIONS}], got {k!r}")


@dataclass(frozen=True)
class EnsembleSettings:
    """Public settings of a DP-AD ensemble (nothing here is read off the rows).

    Each part's threshold is either the empirical `fpr`-quantile of its own held-out rows
    (`holdout_fraction` of its rows, by a salted hash) or one public `threshold` for all parts.
    """

    partitions: int
    epsilon_per_query: float
    fpr: float | None = 0.05
    threshold: float | None = None
    holdout_fraction: float = 0.2

    def __post_init__(self) -> None:
        VoteAggregation(self.partitions, self.epsilon_per_query)  # validates k and epsilon
        if (self.fpr is None) == (self.threshold is None):
            raise ValueError("give exactly one of a per-part false-positive rate (fpr) or a public threshold")
        if self.fpr is not None and not 0.0 < self.fpr < 1.0:
            raise ValueError(f"fpr must lie strictly between 0 and 1, got {self.fpr!r}")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"the public threshold must be a finite number, got {self.threshold!r}")
        low = 0.0 if self.fpr is None else 0.01
        if not low <= self.holdout_fraction < 0.9:
            raise ValueError(
                f"the held-out fraction must lie in [{low:g}, 0.9) (a per-part fpr needs held-out rows), "
                f"got {self.holdout_fraction!r}"
            )

    def aggregation(self) -> VoteAggregation:
        return VoteAggregation(int(self.partitions), float(self.epsilon_per_query))


# -- partitions (one row affects one part) -----------------------------------------------------


def partition_of(df: pl.DataFrame, k: int, salt: int) -> np.ndarray:
    """The part (0..k-1) of every row: a salted hash of the row and its occurrence rank
    (`privflow.data.row_hash`), so adding or removing a row changes only that row's part, as
    multisets (DP-NF Algorithm 2, line 2: disjoint partitions), and a repeated row's copies
    spread over the parts."""
    _check_partitions(k)
    return np.minimum((row_units(df, salt) * int(k)).astype(np.int64), int(k) - 1)


def holdout_coins(df: pl.DataFrame, fraction: float, salt: int) -> np.ndarray:
    """True for a part's held-out rows (its threshold's rows), by a salted hash of the row and
    its rank (another salt than the partition's): inside one part, so covered by its sensitivity."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"the held-out fraction must lie in [0, 1), got {fraction!r}")
    return row_units(df, salt) < float(fraction)


def partition_threshold(holdout_loglik: np.ndarray, fpr: float) -> float:
    """A part's own threshold: the empirical fpr-quantile of its held-out rows' log-likelihoods
    (at most a fraction fpr of them lie below it). Not private, and need not be: it is a
    function of that part alone, whose influence the aggregation bounds by one vote.
    A part with no held-out row gets -inf (it never votes anomalous)."""
    if not 0.0 < fpr < 1.0:
        raise ValueError(f"the false-positive rate must lie strictly between 0 and 1, got {fpr!r}")
    v = np.asarray(holdout_loglik, dtype=np.float64).ravel()
    if v.size == 0:
        return -math.inf
    v = np.nan_to_num(v, nan=-np.inf)
    return float(np.quantile(v, fpr, method="inverted_cdf"))


def votes_out(loglik: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """c_out per query: how many parts vote anomalous (loglik[i, j] < thresholds[i]; a NaN
    log-likelihood votes anomalous). loglik is [parts, queries]; DP-NF Algorithm 2, lines 4-9."""
    ll = np.asarray(loglik, dtype=np.float64)
    tau = np.asarray(thresholds, dtype=np.float64).reshape(-1, 1)
    if ll.ndim != 2 or ll.shape[0] != tau.shape[0]:
        raise ValueError(f"loglik must be [parts, queries] with one threshold per part, got {ll.shape} and {tau.shape}")
    return (~(ll >= tau)).sum(axis=0).astype(np.int64)


def _check_votes(votes: np.ndarray, k: int) -> np.ndarray:
    v = np.asarray(votes)
    if v.ndim != 1:
        raise ValueError(f"votes must be a 1-d array of counts, got shape {v.shape}")
    if v.size and (not np.issubdtype(v.dtype, np.integer) or v.min() < 0 or v.max() > k):
        raise ValueError(f"votes must be integer counts in [0, {k}]")
    return v.astype(np.int64)


# -- aggregation: Report-Noisy-Max over (c_in, c_out) ----------------------------------------------


@dataclass(frozen=True)
class VoteAggregation:
    """Public settings of DP-AD's aggregation: k parts, epsilon per answered query."""

    partitions: int
    epsilon: float

    def __post_init__(self) -> None:
        _check_partitions(self.partitions)
        _check_epsilon(self.epsilon, "the epsilon per query")

    def measurement(self) -> Any:
        """OpenDP's Report-Noisy-Max (exponential noise, scale 2/epsilon), map(1) <= epsilon."""
        return noisy_max_measurement(1.0, float(self.epsilon), False)

    def release(self, votes: np.ndarray) -> np.ndarray:
        """One epsilon-DP answer per query: True (anomalous) when the noisy c_out beats the
        noisy c_in (DP-NF Algorithm 2, line 10); fresh noise for every query."""
        v = _check_votes(votes, int(self.partitions))
        meas, k = self.measurement(), int(self.partitions)
        return np.fromiter((meas([float(k - c), float(c)]) == OUT for c in v.tolist()), dtype=bool, count=v.size)

    def event(self, queries: int) -> Event:
        """What `queries` answers cost: that many epsilon-DP picks, composed adaptively."""
        if queries < 0:
            raise ValueError(f"queries must be >= 0, got {queries}")
        return RepeatedEvent(PureDPEvent(float(self.epsilon)), int(queries))


def prob_anomalous(votes: np.ndarray | int, partitions: int, epsilon: float) -> np.ndarray:
    """Closed form of `VoteAggregation.release`: P(anomalous) given c_out, with d = 2 c_out - k
    and Laplace(2/epsilon) as the difference of the two exponential noises."""
    d = 2.0 * np.asarray(votes, dtype=np.float64) - float(partitions)
    half = 0.5 * np.exp(-0.5 * float(epsilon) * np.abs(d))
    return np.where(d >= 0, 1.0 - half, half)


# -- sparse vector (AboveThreshold with restarts, cutoff c) -----------------------------------------


@lru_cache(maxsize=64)
def _int_laplace(d_in: int, budget: float) -> Any:
    """OpenDP's exact discrete Laplace on integer vectors whose map(d_in) <= budget."""
    dp = opendp_parts()
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64")
    return calibrated(lambda s: dp.m.make_laplace(*space, scale=s), int(d_in), float(budget), d_in / budget)


def svt_noise(epsilon: float) -> tuple[Any, Any]:
    """(threshold noise, query noise) of one AboveThreshold instance at `epsilon`: discrete
    Laplace of scale ~2/epsilon with map(1) <= epsilon/2, and of scale ~4/epsilon with
    map(2) <= epsilon/2 (the shifts of Dwork & Roth's proof, Theorem 3.23)."""
    _check_epsilon(epsilon)
    return _int_laplace(1, float(epsilon) / 2.0), _int_laplace(2, float(epsilon) / 2.0)


@dataclass(frozen=True)
class SVTResult:
    """One SVT call: per-row answers (FLAGGED, NOT_FLAGGED, NOT_ANSWERED after the cutoff),
    the number of flags and of AboveThreshold instances that answered at least one row."""

    answers: np.ndarray
    flags: int
    instances: int

    @property
    def answered(self) -> int:
        return int(np.count_nonzero(self.answers != NOT_ANSWERED))


@dataclass(frozen=True)
class SparseVector:
    """Public settings of DP-AD with the sparse vector technique (module docstring): epsilon
    per AboveThreshold instance (one per flag), the public threshold T in votes, the cutoff c."""

    partitions: int
    epsilon: float
    threshold: float
    max_flags: int

    def __post_init__(self) -> None:
        _check_partitions(self.partitions)
        _check_epsilon(self.epsilon, "the epsilon per flag")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold <= self.partitions):
            raise ValueError(f"the SVT threshold must be a vote count in [0, {self.partitions}], got {self.threshold}")
        if not (isinstance(self.max_flags, int | np.integer) and self.max_flags >= 1):
            raise ValueError(f"the cutoff (max flags) must be a positive integer, got {self.max_flags!r}")

    def release(self, votes: np.ndarray) -> SVTResult:
        """Sparse(c) over the rows in order: flag a row when c_out + nu >= T + rho."""
        v = _check_votes(votes, int(self.partitions))
        q = v.size
        answers = np.full(q, NOT_ANSWERED, dtype=np.int8)
        if q == 0:
            return SVTResult(answers, 0, 0)
        rho_meas, nu_meas = svt_noise(float(self.epsilon))
        # Noise is independent of the data, so drawing it in advance is the same law as drawing
        # it row by row: one rho per instance (at most min(c, q) of them), one nu per row.
        rho = np.asarray(rho_meas([0] * min(int(self.max_flags), q)), dtype=np.int64)
        nu = np.asarray(nu_meas([0] * q), dtype=np.int64)
        flags, instances, open_instance = 0, 0, False
        for j in range(q):
            if not open_instance:
                open_instance, instances = True, instances + 1
            if v[j] + nu[j] >= self.threshold + rho[flags]:
                answers[j] = FLAGGED
                flags += 1
                open_instance = False
                if flags == self.max_flags:
                    break
            else:
                answers[j] = NOT_FLAGGED
        return SVTResult(answers, flags, instances)

    def reserve_event(self, queries: int) -> Event:
        """The most one call over `queries` rows can cost: min(c, queries) instances."""
        return RepeatedEvent(PureDPEvent(float(self.epsilon)), min(int(self.max_flags), int(queries)))

    def event(self, instances: int) -> Event:
        """What a call cost: one epsilon-DP event per instance that answered a row."""
        return RepeatedEvent(PureDPEvent(float(self.epsilon)), int(instances))


__all__ = [
    "EnsembleSettings",
    "FLAGGED",
    "IN",
    "MAX_PARTITIONS",
    "NOT_ANSWERED",
    "NOT_FLAGGED",
    "OUT",
    "SVTResult",
    "SparseVector",
    "VoteAggregation",
    "holdout_coins",
    "partition_of",
    "partition_threshold",
    "prob_anomalous",
    "svt_noise",
    "votes_out",
]
