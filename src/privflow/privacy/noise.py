"""One place for randomness that touches private values: exact samplers and secret generators.

Exact samplers (docs/architecture.md, privacy rule 6). Textbook floating-point noise (x +
rng.normal(), x + rng.laplace()) leaks through the gaps and the non-uniform spacing of the
doubles it can produce (Mironov 2012, "On significance of the least significant bits for
differential privacy"). The statistics' noise therefore comes from OpenDP 0.16's
measurements, which sample the discrete Laplace / discrete Gaussian on a grid of 2^k from
OS entropy and round the input to that grid (Canonne, Kamath & Steinke 2020). Their
privacy maps include the rounding; `calibrated` widens the scale by ulps until OpenDP's
own map of the stated sensitivity is within the budget our privacy event claims, so the
event is never stronger than what OpenDP certifies.

Secret generators: every torch generator whose draws touch private rows or the update
(dequantization noise, Poisson sampling, DP-SGD noise, sparsification) is seeded from
`secrets.randbits(63)` and never from a public seed, and independent generators get
independent seeds (never seed, seed + 1, ...). `independent_seeds` gives a test-only
deterministic override through numpy's SeedSequence.spawn.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:  # torch only where a generator is made: planning (pre-flight) imports this module without it
    import torch
    from torch import Tensor, nn

    from privflow.data.chunked import DiskRows
    from privflow.models.base import FlowModel, LogProbModel

_MAX_WIDEN = 64


@lru_cache(maxsize=1)
def opendp_parts() -> Any:
    """The parts of OpenDP used here as one namespace, like ``opendp.prelude`` without its extras
    (``opendp.prelude`` imports scikit-learn through ``opendp.extras.sklearn``, which slows
    every run's start for nothing privflow uses)."""
    from types import SimpleNamespace

    import opendp.measurements
    from opendp.domains import atom_domain, vector_domain
    from opendp.measures import max_divergence
    from opendp.metrics import l1_distance, l2_distance, linf_distance, symmetric_distance
    from opendp.mod import enable_features

    enable_features("contrib")
    return SimpleNamespace(
        m=opendp.measurements,
        atom_domain=atom_domain,
        vector_domain=vector_domain,
        l1_distance=l1_distance,
        l2_distance=l2_distance,
        linf_distance=linf_distance,
        symmetric_distance=symmetric_distance,
        max_divergence=max_divergence,
    )


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def calibrated(build: Callable[[float], Any], d_in: float, budget: float, scale: float) -> Any:
    """The measurement at the smallest scale >= `scale` (by ulps) whose OpenDP map(d_in) <= budget.

    OpenDP rounds the sensitivity and the map's arithmetic upwards; that can cost an ulp
    or two over the textbook value, which the wider scale pays for.
    """
    for _ in range(_MAX_WIDEN):
        meas = build(scale)
        if meas.map(d_in) <= budget:
            return meas
        scale = math.nextafter(scale, math.inf) * (1.0 + 4.0 * np.finfo(float).eps)
    raise RuntimeError(f"could not calibrate an OpenDP measurement to {budget} at d_in={d_in}")


@lru_cache(maxsize=256)
def gaussian_measurement(l2_sensitivity: float, noise_multiplier: float) -> Any:
    """OpenDP Gaussian on float vectors (L2 distance), std ~ noise_multiplier * l2_sensitivity.

    Calibrated so that OpenDP's zCDP map of `l2_sensitivity` is at most rho =
    1 / (2 noise_multiplier^2), the zCDP of ``GaussianEvent(noise_multiplier)``.
    """
    _check_positive("l2_sensitivity", l2_sensitivity)
    _check_positive("noise_multiplier", noise_multiplier)
    dp = opendp_parts()
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)
    rho = 1.0 / (2.0 * noise_multiplier * noise_multiplier)
    return calibrated(
        lambda s: dp.m.make_gaussian(*space, scale=s), float(l2_sensitivity), rho, noise_multiplier * l2_sensitivity
    )


@lru_cache(maxsize=256)
def laplace_measurement(l1_sensitivity: float, noise_multiplier: float) -> Any:
    """OpenDP Laplace on float vectors (L1 distance), scale ~ noise_multiplier * l1_sensitivity.

    Calibrated so that OpenDP's pure-DP map of `l1_sensitivity` is at most 1/noise_multiplier,
    the epsilon of ``LaplaceEvent(noise_multiplier)``.
    """
    _check_positive("l1_sensitivity", l1_sensitivity)
    _check_positive("noise_multiplier", noise_multiplier)
    dp = opendp_parts()
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float)
    return calibrated(
        lambda s: dp.m.make_laplace(*space, scale=s),
        float(l1_sensitivity),
        1.0 / noise_multiplier,
        noise_multiplier * l1_sensitivity,
    )


@lru_cache(maxsize=256)
def noisy_max_measurement(sensitivity: float, epsilon: float, monotone: bool) -> Any:
    """OpenDP Report-Noisy-Max (exponential noise) over float scores, epsilon-DP per pick.

    Scale 2*sensitivity/epsilon, or sensitivity/epsilon for monotone scores (OpenDP's
    ``linf_distance(monotonic=True)``); calibrated so that OpenDP's map is at most epsilon.
    """
    _check_positive("sensitivity", sensitivity)
    _check_positive("epsilon", epsilon)
    dp = opendp_parts()
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float, monotonic=bool(monotone))
    base = (1.0 if monotone else 2.0) * sensitivity / epsilon
    return calibrated(
        lambda s: dp.m.make_noisy_max(*space, dp.max_divergence(), scale=s), float(sensitivity), float(epsilon), base
    )


def _finite_vector(value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("a mechanism's input must be finite (clip or bound it first)")
    return arr


def exact_gaussian(value: np.ndarray, l2_sensitivity: float, noise_multiplier: float) -> np.ndarray:
    """value + exact Gaussian noise of std noise_multiplier * l2_sensitivity, same shape."""
    arr = _finite_vector(value)
    meas = gaussian_measurement(float(l2_sensitivity), float(noise_multiplier))
    if arr.size == 0:
        return arr.copy()
    return np.asarray(meas(arr.ravel().tolist()), dtype=np.float64).reshape(arr.shape)


def exact_laplace(value: np.ndarray, l1_sensitivity: float, noise_multiplier: float) -> np.ndarray:
    """value + exact Laplace noise of scale noise_multiplier * l1_sensitivity, same shape."""
    arr = _finite_vector(value)
    meas = laplace_measurement(float(l1_sensitivity), float(noise_multiplier))
    if arr.size == 0:
        return arr.copy()
    return np.asarray(meas(arr.ravel().tolist()), dtype=np.float64).reshape(arr.shape)


def exact_noisy_max(scores: np.ndarray, sensitivity: float, epsilon: float, monotone: bool) -> int:
    """Index of the noisy maximum of a non-empty finite score vector (one epsilon-DP pick)."""
    arr = _finite_vector(scores)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"scores must be a non-empty 1-d array, got shape {arr.shape}")
    return int(noisy_max_measurement(float(sensitivity), float(epsilon), bool(monotone))(arr.tolist()))


# -- secret generators -------------------------------------------------------------------------


def secret_seed() -> int:
    """63 bits from the OS CSPRNG (never from a public seed)."""
    return secrets.randbits(63)


def independent_seeds(count: int, override: int | None = None) -> list[int]:
    """`count` independent 63-bit seeds: from the OS CSPRNG, or (tests only) spawned from `override`.

    Spawned SeedSequence children are statistically independent streams, unlike the
    related seeds s, s+1, s+2 that torch's Mersenne Twister seeding does not decorrelate.
    """
    if override is None:
        return [secret_seed() for _ in range(count)]
    children = np.random.SeedSequence(int(override)).spawn(count)
    return [int(c.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)) for c in children]


def secret_generator(device: torch.device | str = "cpu", seed: int | None = None) -> torch.Generator:
    """A torch generator on `device` seeded from the OS CSPRNG (or from `seed`, tests only)."""
    import torch

    return torch.Generator(device=device).manual_seed(secret_seed() if seed is None else int(seed))


def dequantization_noise(model: nn.Module, n: int, like: Tensor, generator: torch.Generator) -> Tensor | None:
    """The model's dequantization noise for n rows drawn from `generator` (None: the model has none).

    Passing it explicitly to ``log_prob(x, noise)`` keeps the global torch RNG out of any
    computation on private rows.
    """
    deq = getattr(model, "dequantizer", None)
    if deq is None or not hasattr(deq, "noise"):
        return None
    return deq.noise(n, like, generator)


def preprocess_noise(model: FlowModel, n: int, like: Tensor, generator: torch.Generator) -> Tensor | None:
    """The uniform dequantization noise ``model.preprocess(x, noise)`` uses (None: no categoricals)."""
    uniform = getattr(model, "uniform", None)
    if uniform is None or not hasattr(uniform, "noise"):
        return None
    return uniform.noise(n, like, generator)


def log_prob_with(model: LogProbModel, x: Tensor, noise: Tensor | None) -> Tensor:
    """``model.log_prob(x, noise)``, or ``model.log_prob(x)`` for a model without dequantization."""
    return model.log_prob(x) if noise is None else model.log_prob(x, noise)


def preprocess_private(model: FlowModel, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``model.preprocess`` on private rows with its noise from a secret generator, not the global RNG."""
    gen = generator if generator is not None else secret_generator()
    noise = preprocess_noise(model, int(x.shape[0]), x, gen)
    return model.preprocess(x) if noise is None else model.preprocess(x, noise)


def row_loglik(
    model: nn.Module, x: np.ndarray | DiskRows, batch: int = 4096, generator: torch.Generator | None = None
) -> np.ndarray:
    """Per-row log-likelihoods under one model, in batches (bounded memory); [] for no rows.

    The dequantization noise comes from `generator` (default: a fresh secret one), never from
    the global torch RNG, whose state would otherwise depend on the private row count.
    """
    if len(x) == 0:
        return np.empty(0, dtype=np.float32)
    import torch

    gen = generator if generator is not None else secret_generator()
    parts = []
    with torch.no_grad():
        for i in range(0, len(x), batch):  # slices: x may be rows on disk (privflow.data.chunked.DiskRows)
            chunk = torch.as_tensor(x[i : i + batch], dtype=torch.float32)
            # `model` is a flow (LogProbModel), typed nn.Module as its callers hold it
            parts.append(
                log_prob_with(cast("LogProbModel", model), chunk, dequantization_noise(model, len(chunk), chunk, gen))
            )
    return torch.cat(parts).numpy()


__all__ = [
    "calibrated",
    "dequantization_noise",
    "exact_gaussian",
    "exact_laplace",
    "exact_noisy_max",
    "gaussian_measurement",
    "independent_seeds",
    "laplace_measurement",
    "log_prob_with",
    "noisy_max_measurement",
    "opendp_parts",
    "preprocess_noise",
    "preprocess_private",
    "row_loglik",
    "secret_generator",
    "secret_seed",
]
