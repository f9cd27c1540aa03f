"""DP per-feature clipped mean and standard deviation for activation-norm initialisation.

DP-NF (Waites & Cummings 2021), Appendix B.1, Algorithm 4, with the Gaussian mechanism in
place of Laplace. Sensitivity: each coordinate is clipped to [-clip, clip] and the released
vector is [count, sum(x)/clip, sum(x^2)/clip^2] (1 + 2d numbers, one Gaussian release).
Adding or removing one row moves the count by 1, each scaled sum by at most 1 and each scaled
sum of squares by at most 1, so the joint L2 sensitivity is sqrt(1 + 2d). Dividing by clip
and clip^2 only rescales coordinates (public constants), so that no block's noise is set by
another block's larger range. Mean and std are post-processing of the noisy vector.
The noise is `gaussian_mechanism`'s exact sampler (OpenDP), so no generator is passed in.
"""

from __future__ import annotations

import math

import numpy as np

from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import GaussianEvent
from privflow.privacy.mechanisms.gaussian import gaussian_event, gaussian_mechanism


def clipped_rows(x: np.ndarray, clip: float) -> np.ndarray:
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a finite positive number, got {clip!r}")
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"x must be [rows, features], got shape {arr.shape}")
    # NaN -> 0 is a per-row map, so it cannot raise the sensitivity.
    return np.clip(np.nan_to_num(arr, nan=0.0, posinf=clip, neginf=-clip), -clip, clip)


def mean_std_statistics(x: np.ndarray, clip: float) -> np.ndarray:
    """The noiseless vector [n, sum(c)/clip, sum(c^2)/clip^2], c = x clipped to [-clip, clip]."""
    c = clipped_rows(x, clip) / clip
    return np.concatenate([[float(c.shape[0])], c.sum(axis=0), (c * c).sum(axis=0)])


def mean_std_sensitivity(d: int) -> float:
    """Joint L2 sensitivity of `mean_std_statistics` under add/remove of one row: sqrt(1 + 2d)."""
    return math.sqrt(1.0 + 2.0 * d)


def release_mean_std_statistics(x: np.ndarray, clip: float, noise_multiplier: float) -> np.ndarray:
    """One Gaussian release of `mean_std_statistics` (the only step that reads the rows)."""
    return release_statistics(mean_std_statistics(x, clip), noise_multiplier)


def release_statistics(stats: np.ndarray, noise_multiplier: float) -> np.ndarray:
    """One Gaussian release of a noiseless `mean_std_statistics` vector (a caller may sum it over
    chunks of rows: the sum of the chunks' vectors is the table's)."""
    stats = np.asarray(stats, dtype=np.float64)
    d = (stats.size - 1) // 2
    return gaussian_mechanism(stats, mean_std_sensitivity(d), noise_multiplier)


def mean_std_from_statistics(
    noisy: np.ndarray,
    clip: float,
    std_floor: float | None = None,
    noise_multiplier: float | None = None,
    prior_std: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Post-processing: mean clipped to [-clip, clip]; std in [std_floor, clip] (public bounds).

    The count is floored at 1 so a tiny or negative noisy count cannot divide by zero.

    With the release's `noise_multiplier` and a public `prior_std`, each estimate is shrunk
    towards the public prior (mean 0, std `prior_std`) by its own noise: weight
    tau^2 / (tau^2 + se^2), se the noise's standard deviation on that estimate (sigma *
    sensitivity * clip / count for the mean, * clip^2 / count for the variance). On a large
    table se is small and the release stands; on a few hundred rows the noise is larger than
    the domain, and the unshrunk mean lands on +-clip with the floor std, which made the start
    model (and the fallback to it) one row at the bounds.
    """
    noisy = np.asarray(noisy, dtype=np.float64)
    d = (noisy.size - 1) // 2
    floor = 1e-2 * clip if std_floor is None else float(std_floor)
    if not 0 < floor <= clip:
        raise ValueError(f"std_floor must lie in (0, clip], got {floor}")
    count = max(float(noisy[0]), 1.0)
    mean = np.clip(clip * noisy[1 : 1 + d] / count, -clip, clip)
    second = np.clip(clip * clip * noisy[1 + d :] / count, 0.0, clip * clip)
    var = np.clip(second - mean * mean, floor * floor, clip * clip)
    if noise_multiplier is not None and prior_std is not None:
        noise = float(noise_multiplier) * mean_std_sensitivity(d)
        tau2 = float(prior_std) ** 2
        se_mean, se_var = clip * noise / count, clip * clip * noise / count
        mean = mean * (tau2 / (tau2 + se_mean**2))
        w = tau2 * tau2 / (tau2 * tau2 + se_var**2)
        var = np.clip(w * var + (1.0 - w) * tau2, floor * floor, clip * clip)
    return mean, np.sqrt(var)


def dp_mean_std(
    x: np.ndarray,
    clip: float,
    noise_multiplier: float,
    *,
    std_floor: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """DP per-feature (mean[d], std[d]) of x clipped to [-clip, clip]; costs `dp_stats_event(noise_multiplier)`."""
    noisy = release_mean_std_statistics(x, clip, noise_multiplier)
    return mean_std_from_statistics(noisy, clip, std_floor)


def dp_stats_event(noise_multiplier: float) -> GaussianEvent:
    """One Gaussian release."""
    return gaussian_event(noise_multiplier)


def noise_for_epsilon(epsilon: float, delta: float) -> float:
    """Multiplier for a standalone (epsilon, delta) on this one release (analytic Gaussian)."""
    return gaussian_noise_for_epsilon(epsilon, delta)


__all__ = [
    "clipped_rows",
    "dp_mean_std",
    "dp_stats_event",
    "mean_std_from_statistics",
    "mean_std_sensitivity",
    "mean_std_statistics",
    "noise_for_epsilon",
    "release_mean_std_statistics",
    "release_statistics",
]
