"""The suite's noise is reproducible (tests/seeded_noise.py), and a `real_noise` test samples
from OpenDP."""

from __future__ import annotations

import numpy as np
import pytest

from privflow.privacy import noise


def test_a_reseeded_key_draws_the_same_noise_again(_seeded_noise) -> None:  # noqa: ANN001
    import secrets

    def draws() -> tuple:
        g = noise.exact_gaussian(np.zeros(4), 1.0, 2.0)
        return g, noise.exact_noisy_max(np.zeros(9), 1.0, 0.1, False), secrets.randbits(63)

    _seeded_noise.reseed("a key")
    first = draws()
    _seeded_noise.reseed("a key")
    again = draws()
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1:] == again[1:]
    _seeded_noise.reseed("another key")
    assert not np.array_equal(noise.exact_gaussian(np.zeros(4), 1.0, 2.0), first[0])


def test_the_standins_keep_the_measurements_privacy_maps() -> None:
    assert noise.gaussian_measurement(1.0, 2.0).map(1.0) <= 1.0 / 8.0
    assert noise.laplace_measurement(1.0, 2.0).map(1.0) <= 0.5


@pytest.mark.real_noise
def test_a_real_noise_test_draws_from_opendp() -> None:
    assert type(noise.gaussian_measurement(1.0, 2.0)).__module__.startswith("opendp")
    import secrets

    assert secrets.randbits.__module__ in ("random", "secrets")
