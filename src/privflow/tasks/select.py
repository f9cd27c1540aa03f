"""select: Report-Noisy-Max over checkpoints on the held-out log-likelihood.

DP-GAN note, section 4: score every checkpoint on held-out private rows and pick the
best k with the exponential mechanism. The default score is each row's log-likelihood
relative to its median over the checkpoints, clipped to +-relative_clip (sensitivity
relative_clip; `report_noisy_max.relative_loglik_scores`); the older absolute score clips
log-likelihoods to [score_low, score_high] (sensitivity high - low, about 30 nats, whose
noise hides the differences between checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from privflow.core.config import SelectConfig
from privflow.privacy.accounting.events import PureDPEvent, RepeatedEvent
from privflow.privacy.accounting.plan import StagePlan
from privflow.privacy.mechanisms import report_noisy_max
from privflow.privacy.noise import row_loglik

if TYPE_CHECKING:
    from privflow.data.chunked import DiskRows


def per_pick_epsilon(stage: StagePlan) -> float:
    event = stage.event
    if isinstance(event, RepeatedEvent):
        event = event.event
    if not isinstance(event, PureDPEvent):
        raise TypeError(f"selection must plan a pure-DP event, got {stage.event!r}")
    return event.epsilon


def loglik_matrix(
    make_model: Callable[[dict], torch.nn.Module], states: list[dict], x: np.ndarray | DiskRows
) -> np.ndarray:
    """[checkpoints, rows] per-row log-likelihoods (rows may be 0: then [checkpoints, 0])."""
    if not states:
        return np.empty((0, len(x)))
    return np.stack([row_loglik(make_model(state), x).astype(np.float64) for state in states])


def select_checkpoints(
    make_model: Callable[[dict], torch.nn.Module],
    checkpoints: list[tuple[int, dict]],
    x_val: np.ndarray | DiskRows,
    stage: StagePlan,
    cfg: SelectConfig,
) -> list[int]:
    """Indices into `checkpoints` of the k winners (k capped at the number of checkpoints).

    With no validation rows every score is 0 and the noisy picks are uniform; the selection
    still runs (and spends its planned epsilon), so whether rows exist never shows.
    """
    k = min(cfg.top_k, len(checkpoints))
    scores, sensitivity = checkpoint_scores(make_model, [s for _, s in checkpoints], x_val, cfg)
    # the clipped, shifted sums of the absolute score only grow when a row is added
    monotone = cfg.score != "relative"
    return report_noisy_max.report_noisy_max(scores, sensitivity, per_pick_epsilon(stage), k=k, monotone=monotone)


SCORE_CHUNK_ROWS = 65_536  # selection rows scored at a time


def checkpoint_scores(
    make_model: Callable[[dict], torch.nn.Module], states: list[dict], x: np.ndarray | DiskRows, cfg: SelectConfig
) -> tuple[np.ndarray, float]:
    """Each checkpoint's score (`cfg.score`) and the scores' sensitivity. Both scores are sums over
    rows of a term that depends on that row alone, so they are summed over chunks of rows: the
    [checkpoints, rows] log-likelihoods exist a chunk at a time, never for the whole split (which
    may be millions of rows on disk, privflow/data/chunked.py)."""

    def score(ll: np.ndarray) -> tuple[np.ndarray, float]:
        if cfg.score == "relative":
            return report_noisy_max.relative_loglik_scores(ll, cfg.relative_clip)
        return report_noisy_max.clipped_loglik_scores(ll, cfg.score_low, cfg.score_high)

    models = [make_model(state) for state in states]
    total, sensitivity = score(np.empty((len(states), 0)))
    for start in range(0, len(x), SCORE_CHUNK_ROWS):
        chunk = x[start : start + SCORE_CHUNK_ROWS]
        total = total + score(np.stack([row_loglik(m, chunk).astype(np.float64) for m in models]))[0]
    return total, sensitivity
