"""The Gaussian mechanism and its privacy event.

Sensitivity: the caller states the L2 sensitivity of `value` under add/remove of one row
(the largest ||f(D) - f(D')||_2); noise of std noise_multiplier * l2_sensitivity is added
to every coordinate, which is what `GaussianEvent(noise_multiplier)` accounts for.
"""

from __future__ import annotations

import math

import numpy as np

from privacy.events import GaussianEvent


def _check_scale(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def gaussian_mechanism(
    value: np.ndarray, l2_sensitivity: float, noise_multiplier: float, rng: np.random.Generator
) -> np.ndarray:
    """value + N(0, (noise_multiplier * l2_sensitivity)^2 I): (eps, delta)-DP per `gaussian_event`."""
    _check_scale("l2_sensitivity", l2_sensitivity)
    _check_scale("noise_multiplier", noise_multiplier)
    arr = np.asarray(value, dtype=np.float64)
    return arr + rng.normal(0.0, noise_multiplier * l2_sensitivity, size=arr.shape)


def gaussian_event(noise_multiplier: float) -> GaussianEvent:
    """The event of one `gaussian_mechanism` call at this multiplier."""
    return GaussianEvent(float(noise_multiplier))


__all__ = ["gaussian_event", "gaussian_mechanism"]
