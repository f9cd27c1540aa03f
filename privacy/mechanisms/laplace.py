"""The Laplace mechanism and its privacy event.

Sensitivity: the caller states the L1 sensitivity of `value` under add/remove of one row
(the largest ||f(D) - f(D')||_1); Laplace noise of scale b = noise_multiplier * l1_sensitivity
per coordinate makes the release (1/noise_multiplier)-DP, `LaplaceEvent(noise_multiplier)`.
"""

from __future__ import annotations

import numpy as np

from privacy.events import LaplaceEvent
from privacy.mechanisms.gaussian import _check_scale


def laplace_mechanism(
    value: np.ndarray, l1_sensitivity: float, noise_multiplier: float, rng: np.random.Generator
) -> np.ndarray:
    """value + Laplace(0, noise_multiplier * l1_sensitivity) per coordinate: epsilon = 1/noise_multiplier."""
    _check_scale("l1_sensitivity", l1_sensitivity)
    _check_scale("noise_multiplier", noise_multiplier)
    arr = np.asarray(value, dtype=np.float64)
    return arr + rng.laplace(0.0, noise_multiplier * l1_sensitivity, size=arr.shape)


def laplace_event(noise_multiplier: float) -> LaplaceEvent:
    """The event of one `laplace_mechanism` call at this multiplier."""
    return LaplaceEvent(float(noise_multiplier))


__all__ = ["laplace_event", "laplace_mechanism"]
