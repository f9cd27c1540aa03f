"""DP-AD's mechanisms (privacy/mechanisms/dp_ad.py) against independent references: the
closed form of Report-Noisy-Max on two candidates, OpenDP's own privacy maps, and the exact
output law of the sparse vector technique computed from the discrete Laplace pmf, on which
the privacy claim (each AboveThreshold instance costs at most epsilon) is checked for every
pair of neighbouring vote streams."""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest

from privflow.privacy.accounting.events import PureDPEvent, RepeatedEvent
from privflow.privacy.ledger import compose_epsilon
from privflow.privacy.mechanisms.dp_ad import (
    FLAGGED,
    NOT_ANSWERED,
    NOT_FLAGGED,
    SparseVector,
    VoteAggregation,
    holdout_coins,
    partition_of,
    partition_threshold,
    prob_anomalous,
    svt_noise,
    votes_out,
)

# -- partitions -------------------------------------------------------------------------------


def _rows(n: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"a": rng.integers(0, 50, n), "b": rng.normal(size=n), "c": rng.choice(["x", "y"], n)})


def test_removing_a_row_moves_no_other_row_between_parts() -> None:
    df = _rows(2000)
    part = partition_of(df, 10, salt=12345)
    for i in (0, 17, 1999):
        loo = partition_of(df.filter(pl.int_range(pl.len()) != i), 10, salt=12345)
        assert np.array_equal(np.delete(part, i), loo)
    added = partition_of(pl.concat([df, _rows(1, seed=9)]), 10, salt=12345)
    assert np.array_equal(added[:-1], part)


def test_a_repeated_rows_copies_spread_over_the_parts() -> None:
    """Parts by a coin of the values alone put every copy of a row in one part: a table of
    three distinct rows trained three parts and left the rest empty."""
    df = pl.DataFrame({"a": [1, 2, 3] * 1000})
    part = partition_of(df, 10, salt=5)
    for value in (1, 2, 3):
        sizes = np.bincount(part[(df["a"] == value).to_numpy()], minlength=10)
        assert sizes.min() > 60 and sizes.max() < 140  # 100 per part: sd 9.5


def test_parts_are_balanced_and_salted() -> None:
    df = _rows(20_000)
    part = partition_of(df, 10, salt=1)
    sizes = np.bincount(part, minlength=10)
    assert sizes.min() > 1800 and sizes.max() < 2200  # 2000 +- ~4.5 sd
    assert (partition_of(df, 10, salt=2) != part).mean() > 0.8  # another salt, another split
    coins = holdout_coins(df, 0.2, salt=3)
    assert abs(coins.mean() - 0.2) < 0.015
    # the held-out coin is independent of the part (another salt)
    assert all(abs(coins[part == i].mean() - 0.2) < 0.04 for i in range(10))


def test_partition_threshold_and_votes() -> None:
    ll = np.arange(100, dtype=float)  # 0..99
    t = partition_threshold(ll, 0.05)
    assert (ll < t).sum() <= 5 and (ll <= t).sum() >= 5
    assert partition_threshold(np.array([]), 0.05) == -math.inf
    assert partition_threshold(np.array([np.nan, 1.0, 2.0]), 0.3) == -math.inf  # NaN counts as the lowest
    loglik = np.array([[0.0, 5.0, np.nan], [1.0, 1.0, 1.0], [9.0, 9.0, 9.0]])
    assert votes_out(loglik, np.array([2.0, 1.0, -math.inf])).tolist() == [1, 0, 1]


# -- Report-Noisy-Max aggregation ------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 3.0])
def test_opendp_certifies_at_most_epsilon_per_query(epsilon: float) -> None:
    agg = VoteAggregation(10, epsilon)
    certified = agg.measurement().map(1.0)  # one part changes: each count moves by at most 1
    assert epsilon * (1 - 1e-6) <= certified <= epsilon
    assert agg.event(7) == RepeatedEvent(PureDPEvent(epsilon), 7)


def exponential_mechanism_prob(votes: np.ndarray, partitions: int, epsilon: float) -> np.ndarray:
    """The paper's exponential mechanism (Algorithm 2, line 10, utility = vote count, sensitivity 1):
    P(anomalous) = exp(eps c_out / 2) / (exp(eps c_out / 2) + exp(eps c_in / 2))."""
    d = 2.0 * np.asarray(votes, dtype=np.float64) - float(partitions)
    return 1.0 / (1.0 + np.exp(-0.5 * float(epsilon) * d))


def test_closed_form_is_epsilon_dp_and_beats_the_exponential_mechanism() -> None:
    k, eps = 10, 0.7
    c = np.arange(k + 1)
    p = prob_anomalous(c, k, eps)
    for a, b in zip(p[:-1], p[1:], strict=True):  # neighbours: c_out moves by one vote
        for x, y in ((a, b), (1 - a, 1 - b)):
            assert abs(math.log(x) - math.log(y)) <= eps + 1e-12
    em = exponential_mechanism_prob(c, k, eps)
    majority = c > k / 2
    assert np.all(p[majority] >= em[majority]) and np.all(p[~majority] <= em[~majority])
    assert p[k // 2] == pytest.approx(0.5) and em[k // 2] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("k", "c_out", "epsilon"), [(10, 0, 0.5), (10, 6, 0.5), (10, 4, 2.0), (7, 7, 0.3), (4, 2, 1.0)]
)
def test_release_matches_the_closed_form(k: int, c_out: int, epsilon: float) -> None:
    n = 6000
    answers = VoteAggregation(k, epsilon).release(np.full(n, c_out))
    p = float(prob_anomalous(c_out, k, epsilon))
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(answers.mean() - p) <= 4.5 * sd + 1e-3


def test_release_refuses_bad_votes() -> None:
    agg = VoteAggregation(5, 1.0)
    for bad in (np.array([6]), np.array([-1]), np.array([0.5])):
        with pytest.raises(ValueError):
            agg.release(bad)
    assert agg.release(np.array([], dtype=np.int64)).size == 0


# -- sparse vector: exact law from the discrete Laplace pmf ---------------------------------------------


def _dlap_cdf(z: np.ndarray, scale: float) -> np.ndarray:
    """P(Z <= z) for the discrete Laplace with P(z) proportional to exp(-|z| / scale)."""
    p = math.exp(-1.0 / scale)
    z = np.asarray(z, dtype=np.float64)
    return np.where(z < 0, p ** (-z) / (1 + p), 1 - p ** (z + 1) / (1 + p))


def _dlap_pmf(z: np.ndarray, scale: float) -> np.ndarray:
    p = math.exp(-1.0 / scale)
    return (1 - p) / (1 + p) * p ** np.abs(z)


_RHO = np.arange(-400, 401)


def _instance_law(votes: list[int], threshold: float, eps: float) -> list[float]:
    """P(first flag at row j) for j = 0..m-1, then P(no flag): one AboveThreshold instance."""
    b_rho, b_nu = 2.0 / eps, 4.0 / eps
    w = _dlap_pmf(_RHO, b_rho)
    below = np.ones_like(w)
    out = []
    for v in votes:
        # not flagged iff v + nu < T + rho iff nu <= ceil(T + rho - v) - 1
        p_below = _dlap_cdf(np.ceil(threshold + _RHO - v) - 1, b_nu)
        out.append(float(np.sum(w * below * (1 - p_below))))
        below = below * p_below
    out.append(float(np.sum(w * below)))
    return out


def _svt_law(votes: list[int], threshold: float, eps: float, cutoff: int) -> dict[tuple[int, ...], float]:
    """Exact law of Sparse(cutoff): outcome = the answers (FLAGGED/NOT_FLAGGED/NOT_ANSWERED) per row."""
    m = len(votes)
    law: dict[tuple[int, ...], float] = {}

    def walk(start: int, prefix: tuple[int, ...], prob: float, flags: int) -> None:
        if start == m:
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        probs = _instance_law(votes[start:], threshold, eps)
        for j, pj in enumerate(probs[:-1]):
            head = prefix + (NOT_FLAGGED,) * j + (FLAGGED,)
            if flags + 1 == cutoff:
                done = head + (NOT_ANSWERED,) * (m - len(head))
                law[done] = law.get(done, 0.0) + prob * pj
            else:
                walk(start + j + 1, head, prob * pj, flags + 1)
        tail = prefix + (NOT_FLAGGED,) * (m - start)
        law[tail] = law.get(tail, 0.0) + prob * probs[-1]

    walk(0, (), 1.0, 0)
    return law


def _instances(outcome: tuple[int, ...]) -> int:
    """Instances that answered a row: one per flag, plus one if rows were answered after the last flag."""
    answered = [a for a in outcome if a != NOT_ANSWERED]
    flags = answered.count(FLAGGED)
    trailing = len(answered) - (max(i for i, a in enumerate(answered) if a == FLAGGED) + 1 if flags else 0)
    return flags + (1 if trailing else 0)


@pytest.mark.parametrize("cutoff", [1, 2])
def test_svt_loss_is_at_most_epsilon_per_instance_on_every_neighbouring_stream(cutoff: int) -> None:
    k, eps, threshold = 3, 1.0, 1.5
    worst = 0.0
    for votes in itertools.product(range(k + 1), repeat=3):
        law = _svt_law(list(votes), threshold, eps, cutoff)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
        for shift in itertools.product((-1, 0, 1), repeat=3):  # one part changes: every count by <= 1
            other = [v + s for v, s in zip(votes, shift, strict=True)]
            if min(other) < 0 or max(other) > k:
                continue
            law2 = _svt_law(other, threshold, eps, cutoff)
            for outcome, p in law.items():
                loss = abs(math.log(p) - math.log(law2[outcome])) / _instances(outcome)
                worst = max(worst, loss)
                assert _instances(outcome) <= cutoff
    assert worst <= eps + 1e-9
    assert worst > 0.5 * eps  # the bound is not vacuous


def test_svt_release_matches_the_exact_law() -> None:
    votes, threshold, eps, cutoff = [2, 0, 3, 1], 1.5, 1.5, 2
    svt = SparseVector(3, eps, threshold, cutoff)
    law = _svt_law(votes, threshold, eps, cutoff)
    n = 4000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        r = svt.release(np.array(votes))
        key = tuple(int(a) for a in r.answers)
        counts[key] = counts.get(key, 0) + 1
        assert r.instances == _instances(key) and r.flags == key.count(FLAGGED) and r.answered == 4 - key.count(-1)
    assert set(counts) <= set(law)
    tv = 0.5 * sum(abs(counts.get(o, 0) / n - p) for o, p in law.items())
    assert tv < 0.05


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0])
def test_svt_noise_is_certified_by_opendp(epsilon: float) -> None:
    rho, nu = svt_noise(epsilon)
    assert epsilon / 2 * (1 - 1e-6) <= rho.map(1) <= epsilon / 2  # threshold shifted by <= 1
    assert epsilon / 2 * (1 - 1e-6) <= nu.map(2) <= epsilon / 2  # a query shifted by <= 2


def test_svt_events_and_cutoff() -> None:
    svt = SparseVector(10, 0.5, 5.0, 3)
    assert svt.reserve_event(100) == RepeatedEvent(PureDPEvent(0.5), 3)
    assert svt.reserve_event(2) == RepeatedEvent(PureDPEvent(0.5), 2)
    r = svt.release(np.full(50, 10))  # unanimous anomalies: flags come fast, then the call halts
    assert r.flags <= 3 and r.instances <= 3
    if r.flags == 3:
        last = int(np.flatnonzero(r.answers == FLAGGED)[-1])
        assert np.all(r.answers[last + 1 :] == NOT_ANSWERED)
    assert compose_epsilon([svt.event(r.instances)], 1e-5) <= compose_epsilon([svt.reserve_event(50)], 1e-5)
    quiet = SparseVector(10, 0.5, 5.0, 3).release(np.zeros(200, dtype=np.int64))  # normal rows are mostly free
    assert quiet.answered >= 1 and quiet.instances <= 3


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(partitions=0, epsilon=1.0, threshold=0.0, max_flags=1),
        dict(partitions=5, epsilon=0.0, threshold=2.0, max_flags=1),
        dict(partitions=5, epsilon=1.0, threshold=6.0, max_flags=1),
        dict(partitions=5, epsilon=1.0, threshold=2.0, max_flags=0),
    ],
)
def test_bad_svt_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SparseVector(**kwargs)
