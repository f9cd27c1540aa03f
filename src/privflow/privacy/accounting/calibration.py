"""Exact noise calibration for one Gaussian release: the analytic Gaussian mechanism.

Balle & Wang (2018), "Improving the Gaussian mechanism for differential privacy",
Theorem 8: a Gaussian mechanism with L2 sensitivity 1 and noise std sigma is
(epsilon, delta)-DP if and only if

    delta >= Phi(1/(2 sigma) - epsilon sigma) - e^epsilon Phi(-1/(2 sigma) - epsilon sigma).

The right-hand side falls in both sigma and epsilon, so bisection on this exact formula
gives the smallest multiplier for a target (epsilon, delta), and the smallest epsilon for a
given multiplier. The classical sigma = sqrt(2 ln(1.25/delta))/epsilon is looser and only
valid for epsilon < 1. The privacy-loss distribution of the Gaussian is symmetric, so the
same formula holds under add/remove adjacency.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy.special import log_ndtr, ndtr

_BISECTION_STEPS = 200


def gaussian_delta(epsilon: float, noise_multiplier: float) -> float:
    """The exact delta(epsilon) of a Gaussian mechanism (Balle & Wang 2018, Thm. 8)."""
    s = float(noise_multiplier)
    a = 1.0 / (2.0 * s)
    first = ndtr(a - epsilon * s)
    # e^eps * Phi(-a - eps*s) in log space: the factor e^eps overflows long before the product does.
    exponent = float(epsilon + log_ndtr(-a - epsilon * s))
    second = math.exp(exponent) if exponent < 709.0 else math.inf  # never an OverflowError
    return max(0.0, float(first - second))


def _check(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


def gaussian_noise_for_epsilon(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier (noise std / L2 sensitivity) whose Gaussian release is (epsilon, delta)-DP.

    Bisection on sigma; the upper end of the final bracket is returned, so the result always
    satisfies the exact condition (never a hair under the needed noise).
    """
    _check(delta)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon}")
    hi = _smallest_meeting(lambda sigma: gaussian_delta(epsilon, sigma) <= delta, 1e-6, 1e12)
    if math.isinf(hi):
        raise ValueError(f"no Gaussian noise multiplier reaches epsilon={epsilon}, delta={delta}")
    return hi


def epsilon_for_gaussian(noise_multiplier: float, delta: float) -> float:
    """Smallest epsilon at which one Gaussian release with this multiplier is (epsilon, delta)-DP.

    Bisection on epsilon; the upper end of the final bracket is returned (a valid guarantee).
    """
    _check(delta)
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be a finite positive number, got {noise_multiplier}")
    if gaussian_delta(0.0, noise_multiplier) <= delta:
        return 0.0
    return _smallest_meeting(lambda eps: gaussian_delta(eps, noise_multiplier) <= delta, 0.0, 1e9)


def _smallest_meeting(ok: Callable[[float], bool], lo: float, limit: float) -> float:
    """Smallest x >= lo with ok(x), for ok monotone (False then True): doubling to bracket,
    then bisection; returns the bracket's upper end (the safe side), or inf past `limit`."""
    hi = 1.0
    while not ok(hi):
        lo, hi = hi, hi * 2.0
        if hi > limit:
            return math.inf
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(hi, 1e-12):
            break
    return hi


__all__ = ["epsilon_for_gaussian", "gaussian_delta", "gaussian_noise_for_epsilon"]
