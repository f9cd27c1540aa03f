"""DP-EM for a diagonal Gaussian mixture, the DP-MoG prior of DP-NF (Waites & Cummings 2021, B.2).

Park et al. (2017), DP-EM: the E-step runs in-process on the private rows, and each M-step
uses only noisy sufficient statistics. Sensitivity: rows are clipped to the public box
[-clip, clip]^d; one iteration releases, per component k, [sum_i r_ik, sum_i r_ik x_i/clip,
sum_i r_ik x_i^2/clip^2] in ONE Gaussian release. One row adds r_k*[1, c/clip, c^2/clip^2]
per component with sum_k r_k = 1, so its squared L2 norm is at most
sum_k r_k^2 (1 + 2d) <= 1 + 2d: sensitivity sqrt(1 + 2d). The responsibilities of a row
depend only on that row and the previous (already released) parameters, so the T iterations
compose adaptively: `RepeatedEvent(GaussianEvent(sigma), T)`. The noise is
`gaussian_mechanism`'s exact sampler (OpenDP); only the starting point uses a numpy
generator, seeded from public randomness (never from the rows), which is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import logsumexp

from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import RepeatedEvent
from privflow.privacy.mechanisms.dp_stats import clipped_rows
from privflow.privacy.mechanisms.gaussian import gaussian_event, gaussian_mechanism


@dataclass(frozen=True)
class MoGParams:
    """A diagonal Gaussian mixture: weights[K] (sum 1), means[K, d], stds[K, d]."""

    weights: np.ndarray
    means: np.ndarray
    stds: np.ndarray


def init_mog(k: int, d: int, clip: float, rng: np.random.Generator) -> MoGParams:
    """Starting point from public randomness only: means uniform in the box, std clip/2, equal weights."""
    if k < 1 or d < 1:
        raise ValueError(f"need k >= 1 and d >= 1, got k={k}, d={d}")
    means = rng.uniform(-clip, clip, size=(k, d))
    return MoGParams(np.full(k, 1.0 / k), means, np.full((k, d), clip / 2.0))


def responsibilities(c: np.ndarray, params: MoGParams) -> np.ndarray:
    """E-step: r[i, k] = P(component k | row i) under `params` (rows already clipped)."""
    z = (c[:, None, :] - params.means[None]) / params.stds[None]
    log_pdf = (
        -0.5 * np.sum(z * z, axis=2)
        - np.sum(np.log(params.stds), axis=1)[None]
        - 0.5 * c.shape[1] * math.log(2 * math.pi)
    )
    log_joint = log_pdf + np.log(params.weights)[None]
    return np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))


def em_statistics(x: np.ndarray, params: MoGParams, clip: float) -> np.ndarray:
    """Noiseless sufficient statistics [K, 1 + 2d]: per component [sum r, sum r c/clip, sum r c^2/clip^2]."""
    c = clipped_rows(x, clip)
    r = responsibilities(c, params)
    u = c / clip
    return np.concatenate([r.sum(axis=0)[:, None], r.T @ u, r.T @ (u * u)], axis=1)


def em_sensitivity(d: int) -> float:
    """Joint L2 sensitivity of `em_statistics` under add/remove of one row: sqrt(1 + 2d)."""
    return math.sqrt(1.0 + 2.0 * d)


def m_step(
    noisy: np.ndarray,
    previous: MoGParams,
    clip: float,
    min_count: float,
    min_std: float,
    weight_floor: float,
) -> MoGParams:
    """Post-processing of one noisy release into mixture parameters.

    A component whose noisy count is below `min_count` (public, set from the noise scale)
    keeps its previous mean and std: its statistics would be mostly noise. Weights are
    floored and renormalised, means clipped to the box, stds kept in [min_std, clip].
    """
    d = (noisy.shape[1] - 1) // 2
    counts = noisy[:, 0]
    safe = np.maximum(counts, min_count)[:, None]
    means = np.clip(clip * noisy[:, 1 : 1 + d] / safe, -clip, clip)
    second = np.clip(clip * clip * noisy[:, 1 + d :] / safe, 0.0, clip * clip)
    stds = np.sqrt(np.clip(second - means * means, min_std * min_std, clip * clip))
    keep = counts < min_count
    means[keep] = previous.means[keep]
    stds[keep] = previous.stds[keep]
    positive = np.maximum(counts, 0.0)
    total = positive.sum()
    weights = positive / total if total > 0 else np.full(counts.size, 1.0 / counts.size)
    weights = np.maximum(weights, weight_floor)
    return MoGParams(weights / weights.sum(), means, stds)


EM_CHUNK_ROWS = 65_536  # rows whose statistics are computed at a time (they are sums over rows)


def dp_em_mog(
    x: Any,
    k: int,
    iterations: int,
    clip: float,
    noise_multiplier: float,
    *,
    init_seed: int | None = None,
    min_std: float | None = None,
) -> MoGParams:
    """T iterations of DP-EM; costs `dp_mog_event(noise_multiplier, iterations)`.

    init_seed (public, optional) seeds only `init_mog`'s starting point; None draws it from
    OS entropy. The noise of every release comes from the exact sampler either way.

    min_std (public, default clip/20) floors every component's std: a prior narrower than
    the noise can resolve would be an artefact of the noise, and the flow refines it anyway.

    x: [n, d] rows, an array or anything sliced like one (rows on disk, privflow/data/chunked.py):
    the statistics of each iteration are summed over chunks of rows, never all rows at once.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    n, d = int(x.shape[0]), int(x.shape[1])
    params = init_mog(k, d, clip, np.random.default_rng(init_seed))
    sens = em_sensitivity(d)
    # Public guards set from the noise scale: a component needs a noisy count of ten noise
    # stds before its statistics are used (relative error of its moments then <= 10%).
    min_count = max(10.0 * noise_multiplier * sens, 1.0)
    floor = 5e-2 * clip if min_std is None else float(min_std)
    for _ in range(iterations):
        stats = np.zeros((k, 1 + 2 * d))
        for start in range(0, n, EM_CHUNK_ROWS):
            stats += em_statistics(np.asarray(x[start : start + EM_CHUNK_ROWS], dtype=np.float64), params, clip)
        noisy = gaussian_mechanism(stats, sens, noise_multiplier)
        params = m_step(noisy, params, clip, min_count, floor, 1e-2 / k)
    return params


def dp_mog_event(noise_multiplier: float, iterations: int) -> RepeatedEvent:
    """T Gaussian releases at the same multiplier."""
    return RepeatedEvent(gaussian_event(noise_multiplier), int(iterations))


def noise_for_epsilon(epsilon: float, delta: float, iterations: int) -> float:
    """Multiplier for a standalone (epsilon, delta) over T iterations.

    T Gaussian releases at multiplier s compose exactly to one at s / sqrt(T) (Dong, Roth &
    Su 2019, GDP composition), so s = sqrt(T) * (analytic Gaussian multiplier).
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    return math.sqrt(iterations) * gaussian_noise_for_epsilon(epsilon, delta)


__all__ = [
    "MoGParams",
    "dp_em_mog",
    "dp_mog_event",
    "em_sensitivity",
    "em_statistics",
    "init_mog",
    "m_step",
    "noise_for_epsilon",
    "responsibilities",
]
