"""The Gaussian mechanism and its privacy event.

Sensitivity: the caller states the L2 sensitivity of `value` under add/remove of one row
(the largest ||f(D) - f(D')||_2); noise of std noise_multiplier * l2_sensitivity is added
to every coordinate, which is what `GaussianEvent(noise_multiplier)` accounts for
(zCDP rho = 1 / (2 noise_multiplier^2), Bun & Steinke 2016; its exact (epsilon, delta)
curve, Balle & Wang 2018, is what the PLD accountant composes).

The noise is OpenDP's exact sampler (`privacy.noise.exact_gaussian`: the discrete
Gaussian on a 2^k grid, Canonne, Kamath & Steinke 2020), not floating-point
``rng.normal`` (Mironov 2012). OpenDP certifies rho for the stated sensitivity, including
its rounding to the grid; the scale is widened by ulps where needed so that its rho never
exceeds the event's, which tests/privacy/test_mechanisms.py checks against OpenDP's map.
"""

from __future__ import annotations

import math

import numpy as np

from privflow.privacy.accounting.events import GaussianEvent
from privflow.privacy.noise import exact_gaussian


def check_scale(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def gaussian_mechanism(value: np.ndarray, l2_sensitivity: float, noise_multiplier: float) -> np.ndarray:
    """value + N(0, (noise_multiplier * l2_sensitivity)^2 I) from an exact sampler: `gaussian_event`."""
    check_scale("l2_sensitivity", l2_sensitivity)
    check_scale("noise_multiplier", noise_multiplier)
    return exact_gaussian(np.asarray(value, dtype=np.float64), float(l2_sensitivity), float(noise_multiplier))


def gaussian_event(noise_multiplier: float) -> GaussianEvent:
    """The event of one `gaussian_mechanism` call at this multiplier."""
    return GaussianEvent(float(noise_multiplier))


__all__ = ["check_scale", "gaussian_event", "gaussian_mechanism"]
