"""Report-Noisy-Max over candidates (Boob et al. 2018, section 4) and its privacy event.

Sensitivity: every score may move by at most `sensitivity` when one row is added or
removed. Each pick adds exponential noise of scale 2*sensitivity/epsilon to every score and
reports the argmax: Report-Noisy-Max with exponential noise, which has the law of
permute-and-flip (McKenna & Sheldon 2020; Ding et al. 2021) and is epsilon-DP per pick.
When scores are monotone (for every neighbouring pair all scores move the same way, as
`clipped_loglik_scores` guarantees), scale sensitivity/epsilon suffices at the same epsilon.
The sampler is OpenDP's exact one (`privacy.noise.exact_noisy_max`, ``make_noisy_max`` with
``linf_distance(monotonic=...)`` and ``max_divergence``), not floating-point Gumbel draws
(Mironov 2012); OpenDP's map of `sensitivity` is kept at most epsilon (tested).

Top-k picks by peeling: k sequential picks, each on the candidates not yet chosen. Each is
an epsilon-DP mechanism whose input set depends only on earlier outputs, so the k picks are
an adaptive composition: ``RepeatedEvent(PureDPEvent(epsilon), k)``, which the PLD
accountant composes (exactly what OpenDP certifies per pick, k times).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from privflow.privacy.accounting.events import PureDPEvent, RepeatedEvent
from privflow.privacy.noise import exact_noisy_max


def report_noisy_max(
    scores: np.ndarray,
    sensitivity: float,
    epsilon: float,
    k: int = 1,
    monotone: bool = False,
) -> list[int]:
    """Indices of k distinct candidates by k peeled exponential-noise noisy-max picks, best first.

    Pass monotone=True only for scores that all move the same way when a row is added or
    removed; the noise scale is then halved at the same epsilon. Costs `rnm_event(epsilon, k)`.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"scores must be a non-empty 1-d array, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite (clip them first, e.g. with clipped_loglik_scores)")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be a finite positive number, got {sensitivity!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
    if not 1 <= k <= s.size:
        raise ValueError(f"k must lie in [1, {s.size}], got {k}")
    remaining = list(range(s.size))
    picks: list[int] = []
    for _ in range(k):
        j = exact_noisy_max(s[remaining], float(sensitivity), float(epsilon), bool(monotone))
        picks.append(remaining.pop(j))
    return picks


def rnm_event(epsilon: float, k: int = 1) -> RepeatedEvent:
    """k peeled noisy-max picks of epsilon each, composed adaptively."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return RepeatedEvent(PureDPEvent(float(epsilon)), int(k))


def clipped_loglik_scores(loglik: np.ndarray, low: float, high: float) -> tuple[np.ndarray, float]:
    """Per-checkpoint score = sum over validation rows of (clip(loglik, low, high) - low).

    loglik[t, i] is checkpoint t's log-likelihood of private row i. Adding a row adds one
    term in [0, high - low] to every score and removing one takes it away, so the sensitivity
    is high - low. The SUM, not the mean: a mean divides by m, the private number of rows,
    whose change moves every term; using m as if public would leak it. Ranking is the same
    either way. A NaN log-likelihood counts as `low` (the worst score), so a broken
    checkpoint cannot raise the sensitivity.
    """
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got low={low}, high={high}")
    ll = np.asarray(loglik, dtype=np.float64)
    if ll.ndim != 2:
        raise ValueError(f"loglik must be [checkpoints, rows], got shape {ll.shape}")
    clipped = np.clip(np.nan_to_num(ll, nan=low, posinf=high, neginf=low), low, high) - low
    return clipped.sum(axis=1), float(high - low)


_SCORE_CHUNK_ROWS = 65_536  # rows scored at a time: the sums are over rows, so chunks add up


def relative_loglik_scores(loglik: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
    """Per-checkpoint score = sum over rows of clip(loglik[t, i] - ref_i, -clip, clip), where
    ref_i is the median of row i's log-likelihoods over the checkpoints.

    Why: checkpoints of one run differ by a few hundredths of a nat per row while a row's
    absolute log-likelihood spans tens of nats, so `clipped_loglik_scores` needs a sensitivity
    of (high - low) ~ 30 and its noise swamps every difference. What differs between
    checkpoints is each row's log-likelihood relative to the others' on the same row; clipped
    to +-clip it has sensitivity `clip` (DP-GAN note, section 4: score what tells candidates
    apart, with a tight bound). Adding or removing row i adds or removes the one term
    clip(loglik[t, i] - ref_i) in [-clip, clip] to every score t, because ref_i is a function
    of row i's own column only: L-infinity sensitivity `clip`. The terms may have either sign,
    so the scores are not monotone (pass monotone=False). A NaN log-likelihood counts as -clip.
    """
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a finite positive number, got {clip!r}")
    ll = np.asarray(loglik, dtype=np.float64)
    if ll.ndim != 2:
        raise ValueError(f"loglik must be [checkpoints, rows], got shape {ll.shape}")
    scores = np.zeros(ll.shape[0])
    for start in range(0, ll.shape[1], _SCORE_CHUNK_ROWS):  # rows apart: a few [checkpoints, chunk] temporaries
        finite = ll[:, start : start + _SCORE_CHUNK_ROWS]
        finite = np.where(np.isfinite(finite), finite, np.nan)
        with warnings.catch_warnings():  # a row that is NaN in every checkpoint: ref 0, every term -clip
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = np.nan_to_num(np.nanmedian(finite, axis=0), nan=0.0)
        scores += np.clip(np.nan_to_num(finite - ref[None, :], nan=-clip), -clip, clip).sum(axis=1)
    return scores, float(clip)


__all__ = ["clipped_loglik_scores", "relative_loglik_scores", "report_noisy_max", "rnm_event"]
