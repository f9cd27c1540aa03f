"""Reproducible noise for the test suite: the same draws on every run of a test.

The product's noise comes from OpenDP's exact samplers (OS entropy, no seed) and from torch
generators seeded by `secrets.randbits`. A test that asserts what a noisy release is close to
then fails now and then, on no change of code (a spike's mass 0.094 against 0.105 +- 0.01 once
in many CI runs). Here every OpenDP measurement the product builds keeps its privacy map (tests
of calibration read the real one) but draws its noise from a numpy generator of the same law and
scale, and `secrets.randbits` draws from a `random.Random`; both are reseeded from the test's id
before each test and from a constant after it, so that session- and module-scoped fixtures built
between tests draw the same noise too, whatever ran before them.

Tests of the samplers' own law carry the `real_noise` mark and draw from OpenDP (each such check
fails by chance with probability 1e-6, `tests/stats_checks.FALSE_ALARM`).
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

BETWEEN_TESTS = "between tests"


class SeededNoise:
    """One numpy and one Python generator, reseeded by key."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.py = random.Random(0)
        self.originals: list[tuple[Any, str, Any]] = []  # (module, name, the product's own)
        self.reseed(BETWEEN_TESTS)

    def reseed(self, key: str) -> None:
        seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
        self.rng = np.random.default_rng(seed)
        self.py = random.Random(seed)


class _Standin:
    """An OpenDP measurement's privacy map with a seeded draw of the same law."""

    def __init__(self, real: Any, draw: Callable[[Any], Any]) -> None:
        self._real, self._draw = real, draw

    def map(self, d_in: Any) -> Any:
        return self._real.map(d_in)

    def __call__(self, arg: Any) -> Any:
        return self._draw(arg)


@contextmanager
def seeded(noise: SeededNoise) -> Iterator[None]:
    """Install the seeded draws for the duration of the block."""
    from privflow.privacy import noise as product
    from privflow.privacy.mechanisms import dp_ad

    real_gauss, real_lap = product.gaussian_measurement, product.laplace_measurement
    real_max = product.noisy_max_measurement
    real_int_lap = dp_ad._int_laplace

    def gaussian_measurement(l2_sensitivity: float, noise_multiplier: float) -> _Standin:
        scale = float(noise_multiplier) * float(l2_sensitivity)
        real = real_gauss(l2_sensitivity, noise_multiplier)
        return _Standin(real, lambda v: (np.asarray(v) + noise.rng.normal(0.0, scale, len(v))).tolist())

    def laplace_measurement(l1_sensitivity: float, noise_multiplier: float) -> _Standin:
        scale = float(noise_multiplier) * float(l1_sensitivity)
        real = real_lap(l1_sensitivity, noise_multiplier)
        return _Standin(real, lambda v: (np.asarray(v) + noise.rng.laplace(0.0, scale, len(v))).tolist())

    def noisy_max_measurement(sensitivity: float, epsilon: float, monotone: bool) -> _Standin:
        scale = (1.0 if monotone else 2.0) * float(sensitivity) / float(epsilon)
        real = real_max(sensitivity, epsilon, monotone)
        return _Standin(real, lambda v: int(np.argmax(np.asarray(v) + noise.rng.exponential(scale, len(v)))))

    def int_laplace(d_in: int, budget: float) -> _Standin:
        scale = float(d_in) / float(budget)
        real = real_int_lap(d_in, budget)

        def draw(v: Any) -> list[int]:  # the discrete Laplace as the difference of two geometrics
            p = 1.0 - np.exp(-1.0 / scale)
            n = len(v)
            return (np.asarray(v, dtype=np.int64) + noise.rng.geometric(p, n) - noise.rng.geometric(p, n)).tolist()

        return _Standin(real, draw)

    standins = [
        (product, "gaussian_measurement", gaussian_measurement),
        (product, "laplace_measurement", laplace_measurement),
        (product, "noisy_max_measurement", noisy_max_measurement),
        (dp_ad, "noisy_max_measurement", noisy_max_measurement),
        (dp_ad, "_int_laplace", int_laplace),
        (secrets, "randbits", lambda k: noise.py.getrandbits(k)),
    ]
    noise.originals = [(module, name, getattr(module, name)) for module, name, _ in standins]
    with pytest.MonkeyPatch.context() as mp:
        for module, name, standin in standins:
            mp.setattr(module, name, standin)
        yield


@contextmanager
def real(noise: SeededNoise) -> Iterator[None]:
    """The product's own samplers for the duration of the block (inside `seeded`)."""
    with pytest.MonkeyPatch.context() as mp:
        for module, name, original in noise.originals:
            mp.setattr(module, name, original)
        yield
