"""The Laplace mechanism and its privacy event.

Sensitivity: the caller states the L1 sensitivity of `value` under add/remove of one row
(the largest ||f(D) - f(D')||_1); Laplace noise of scale b = noise_multiplier * l1_sensitivity
per coordinate makes the release (1/noise_multiplier)-DP (Dwork et al. 2006),
`LaplaceEvent(noise_multiplier)`.

The noise is OpenDP's exact sampler (`privacy.noise.exact_laplace`: the discrete Laplace
on a 2^k grid, Ghosh, Roughgarden & Sundararajan 2012), not floating-point ``rng.laplace``
(Mironov 2012). OpenDP's epsilon for the stated sensitivity, grid rounding included, is
kept at most 1/noise_multiplier (the scale is widened by ulps where needed); the tests
compare the event with OpenDP's map.
"""

from __future__ import annotations

import numpy as np

from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.mechanisms.gaussian import check_scale
from privflow.privacy.noise import exact_laplace


def laplace_mechanism(value: np.ndarray, l1_sensitivity: float, noise_multiplier: float) -> np.ndarray:
    """value + Laplace(0, noise_multiplier * l1_sensitivity) per coordinate, exact sampler;
    epsilon = 1/noise_multiplier."""
    check_scale("l1_sensitivity", l1_sensitivity)
    check_scale("noise_multiplier", noise_multiplier)
    return exact_laplace(np.asarray(value, dtype=np.float64), float(l1_sensitivity), float(noise_multiplier))


def laplace_event(noise_multiplier: float) -> LaplaceEvent:
    """The event of one `laplace_mechanism` call at this multiplier."""
    return LaplaceEvent(float(noise_multiplier))


__all__ = ["laplace_event", "laplace_mechanism"]
