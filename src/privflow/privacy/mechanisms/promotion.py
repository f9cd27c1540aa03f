"""The promotion comparison: is a new model version better than the one holding the alias?

The criterion is the one the selection stage uses (DP-GAN note, Boob et al. 2018, section
4): the per-row validation log-likelihood clipped to the public bounds [low, high]. Here it
is a difference between two models on the same rows,

    S(D) = sum_{x in V(D)} clip(log p_new(x)) - clip(log p_champion(x)),

and each term lies in [-(high - low), high - low]: adding or removing one row moves S by at
most high - low, which is both its L1 and its L2 sensitivity. S is released once with the
Laplace (pure epsilon) or the Gaussian mechanism; its event is `PromotionMechanism.event`.
It is a SUM, not a mean: dividing by the private row count would leak it.

Versions trained through different DP marginals (privflow/data/copula.py) encode rows differently,
so their log-likelihoods include each version's own log cell masses (tens of nats per row);
they are compared by `difference_statistic`, S(D) = sum_i clip(log p_new(x_i) - log
p_champion(x_i), -c, c): one row moves S by at most c (the selection stage's relative score,
`report_noisy_max.relative_loglik_scores`, bounds its terms the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import Event
from privflow.privacy.mechanisms.gaussian import gaussian_event, gaussian_mechanism
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism


@dataclass(frozen=True)
class PromotionMechanism:
    """Public settings of the comparison's release (its own small epsilon, apart from training's).

    `delta` is used by the Gaussian mechanism only (the Laplace release is pure epsilon-DP).
    """

    epsilon: float = 0.05
    mechanism: Literal["laplace", "gaussian"] = "laplace"
    delta: float = 1e-7

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"promotion epsilon must be a finite positive number, got {self.epsilon!r}")
        if self.mechanism not in ("laplace", "gaussian"):
            raise ValueError(f"promotion mechanism must be 'laplace' or 'gaussian', got {self.mechanism!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"promotion delta must lie in (0, 1), got {self.delta!r}")

    def noise_multiplier(self) -> float:
        """Noise scale / sensitivity: 1/epsilon for Laplace; the analytic Gaussian calibration."""
        if self.mechanism == "laplace":
            return 1.0 / self.epsilon
        return gaussian_noise_for_epsilon(self.epsilon, self.delta)

    def event(self) -> Event:
        """The privacy event of one comparison."""
        nm = self.noise_multiplier()
        return laplace_event(nm) if self.mechanism == "laplace" else gaussian_event(nm)


def mixture_loglik(per_checkpoint: np.ndarray) -> np.ndarray:
    """log of the equal-weight mixture of k checkpoints: logsumexp over k minus log k.

    The released sampler draws equal shares from its checkpoints (privflow/serving/sampler.py), so
    this is the density of what a version actually releases. Input [k, rows]; output [rows].
    """
    ll = np.asarray(per_checkpoint, dtype=np.float64)
    if ll.ndim != 2 or ll.shape[0] < 1:
        raise ValueError(f"need [checkpoints, rows], got shape {ll.shape}")
    top = np.max(ll, axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    return safe + np.log(np.mean(np.exp(ll - safe), axis=0))


def margin_statistic(ll_new: np.ndarray, ll_old: np.ndarray, low: float, high: float) -> tuple[float, float]:
    """(S, sensitivity): S = sum_i clip(ll_new_i) - clip(ll_old_i), clipped to [low, high].

    One row adds or removes one term in [-(high-low), high-low], so the sensitivity (L1 and
    L2 alike for a scalar) is high - low. NaN/-inf count as `low`, +inf as `high`, so a broken
    model cannot raise it.
    """
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got low={low}, high={high}")
    a = np.asarray(ll_new, dtype=np.float64)
    b = np.asarray(ll_old, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two 1-d arrays of equal length, got {a.shape} and {b.shape}")

    def clip(v: np.ndarray) -> np.ndarray:
        return np.clip(np.nan_to_num(v, nan=low, posinf=high, neginf=low), low, high)

    return float(np.sum(clip(a) - clip(b))), float(high - low)


def difference_statistic(ll_new: np.ndarray, ll_old: np.ndarray, clip: float) -> tuple[float, float]:
    """(S, sensitivity): S = sum_i clip(ll_new_i - ll_old_i, -clip, clip); sensitivity `clip`.

    A row both versions give no mass adds 0; one only the champion covers adds -clip (and the
    reverse +clip), so a broken model cannot raise the sensitivity.
    """
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a finite positive number, got {clip!r}")
    a = np.nan_to_num(np.asarray(ll_new, dtype=np.float64), nan=-np.inf)
    b = np.nan_to_num(np.asarray(ll_old, dtype=np.float64), nan=-np.inf)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two 1-d arrays of equal length, got {a.shape} and {b.shape}")
    with np.errstate(invalid="ignore"):
        d = a - b
    d = np.where(np.isneginf(a) & np.isneginf(b), 0.0, d)
    d = np.where(np.isposinf(a) & np.isposinf(b), 0.0, d)
    d = np.clip(np.nan_to_num(d, nan=0.0, posinf=clip, neginf=-clip), -clip, clip)
    return float(np.sum(d)), float(clip)


def release_margin(statistic: float, sensitivity: float, mechanism: PromotionMechanism) -> float:
    """The noisy margin: S plus exact (OpenDP) Laplace or Gaussian noise scaled to the sensitivity.

    No caller-supplied generator can reach the noise: it comes from the exact samplers' OS entropy.
    """
    nm = mechanism.noise_multiplier()
    if mechanism.mechanism == "laplace":
        return float(laplace_mechanism(np.array([statistic]), sensitivity, nm)[0])
    return float(gaussian_mechanism(np.array([statistic]), sensitivity, nm)[0])


__all__ = ["PromotionMechanism", "margin_statistic", "mixture_loglik", "release_margin"]
