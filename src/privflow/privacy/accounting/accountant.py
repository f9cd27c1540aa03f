"""Accountants: compose a list of privacy events into one (epsilon, delta).

The reported epsilon comes from `PLDAccountant` (dp-accounting's privacy-loss
distributions, pessimistic discretisation: a true upper bound). `RDPAccountant`
(dp-accounting, looser) is kept as a cross-check, and `PRVAccountant` (Microsoft's
prv-accountant, an independent code base) recomputes the same events to check the
reported figure (they agree within 1%). Adjacency is add/remove one row.
"""

from __future__ import annotations

import functools
import math
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from privflow.privacy.accounting.composed_cache import ComposedCache, cache_key, default_path
from privflow.privacy.accounting.events import (
    ApproxDPEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    PoissonGaussianEvent,
    PureDPEvent,
    flatten,
)

# The PLD of one Gaussian (or Laplace) event is a grid over its privacy-loss range: about
# (20/sigma + 1/sigma^2) / discretization points for a Gaussian (the range up to ten standard
# deviations out), 2/(b * discretization) for a Laplace of scale b. A tiny noise multiplier
# would ask for billions of points (gigabytes) before composing anything; refuse past this.
MAX_PLD_POINTS = 20_000_000


_MAX_PURE_EPSILON = 500.0


class PLDTooLarge(ValueError):
    """An event's privacy-loss distribution would need more than MAX_PLD_POINTS grid points."""


def pld_points(event: Event, discretization: float) -> float:
    """Estimated grid size of one event's PLD at `discretization` (see MAX_PLD_POINTS)."""
    if isinstance(event, GaussianEvent | PoissonGaussianEvent):
        s = event.noise_multiplier
        return (20.0 / s + 1.0 / (s * s)) / discretization
    if isinstance(event, LaplaceEvent):
        return 2.0 / (event.noise_multiplier * discretization)
    return 2.0


_RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


class Accountant(ABC):
    """Composes events; every subclass answers the same questions the same way."""

    name: str
    # the distribution that composes, whose version is part of a remembered answer's key (None:
    # answers are not kept on disk)
    library: str | None = None

    def epsilon(self, events: Sequence[Event], delta: float) -> float:
        """Smallest epsilon such that the composition is (epsilon, delta)-DP."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {delta}")
        pairs = flatten(list(events))
        if any(isinstance(e, NonPrivateEvent) for e, _ in pairs):
            return math.inf
        pairs = [(e, n) for e, n in pairs if not (isinstance(e, PoissonGaussianEvent) and e.steps == 0)]
        if not pairs:
            return 0.0
        key = (type(self), self._settings(), tuple(pairs), float(delta))
        try:
            hash(key)
        except TypeError:  # an event that is not a frozen value: compute, do not remember
            return float(self._epsilon(pairs, delta))
        with _COMPOSED_LOCK:
            cached = _COMPOSED.get(key)
            if cached is not None:
                _COMPOSED.move_to_end(key)
                return cached
        disk = _DISK if self.library is not None else None
        disk_key = cache_key(self.name, str(self.library), self._settings(), pairs, delta) if disk is not None else ""
        stored = disk.get(disk_key) if disk is not None else None
        value = stored if stored is not None else float(self._epsilon(pairs, delta))
        if disk is not None and stored is None:
            disk.put(disk_key, value)
        with _COMPOSED_LOCK:
            _COMPOSED[key] = value
            if len(_COMPOSED) > _COMPOSED_MAX:
                _COMPOSED.popitem(last=False)
        return value

    def _settings(self) -> tuple[object, ...]:
        """What besides the events and delta decides this accountant's answer (the cache key)."""
        return ()

    @abstractmethod
    def _epsilon(self, pairs: list[tuple[Event, int]], delta: float) -> float: ...


# Composed epsilons by (accountant, its settings, events, delta). An accountant's answer is a
# deterministic function of these, and events are frozen values, so a repeat is looked up:
# the plan is made in pre-flight and again in the flow, and its calibration composes the same
# lists several times (the final check, the plan's total). Floats only: a few KB at most.
_COMPOSED: OrderedDict[tuple[object, ...], float] = OrderedDict()
_COMPOSED_MAX = 1024
_COMPOSED_LOCK = threading.Lock()
_DISK: ComposedCache | None = None  # the same, across processes (`remember_on_disk`)


def remember_on_disk(path: Path | None | Literal["default"] = "default") -> None:
    """Keep composed epsilons in a file as well (privacy/accounting/composed_cache.py): the CLI's runs do,
    so a scheduled run with an unchanged plan skips its calibration's compositions. The
    default is `composed_cache.default_path()`; None stops it."""
    global _DISK
    if path == "default":
        path = default_path()
    _DISK = ComposedCache(path) if path is not None else None


def _pld_of(event: Event, h: float):  # noqa: ANN202 - dp-accounting's own type
    """One event's PLD at discretization h. Small ones are cached (`_small_pld`): a calibration
    composes the same fixed stages at every bisection step, and PLD objects are immutable
    (compose returns new ones). Self-composed DP-SGD PLDs are large and have their own small
    cache (`_poisson_pld`): kept among the small ones, every point of a run's epsilon curve
    would stay resident."""
    if isinstance(event, PoissonGaussianEvent):
        _check_points(event, h)
        return _poisson_pld(event, h)
    return _small_pld(event, h)


def _check_points(event: Event, h: float) -> None:
    points = pld_points(event, h)
    if not points <= MAX_PLD_POINTS:
        raise PLDTooLarge(
            f"The privacy-loss distribution of {event!r} would need about {points:.3g} grid points "
            f"(limit {MAX_PLD_POINTS:.0e}): its noise is too small to account for at discretization {h:g}. "
            "Use more noise (a smaller epsilon or a larger share for this stage)."
        )


@functools.lru_cache(maxsize=32)
def _small_pld(event: Event, h: float):  # noqa: ANN202
    """The PLD of one event other than DP-SGD's (a few KB), cached."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    _check_points(event, h)
    if isinstance(event, GaussianEvent):
        return pld.from_gaussian_mechanism(event.noise_multiplier, value_discretization_interval=h)
    if isinstance(event, LaplaceEvent):
        return pld.from_laplace_mechanism(event.noise_multiplier, value_discretization_interval=h)
    if isinstance(event, PureDPEvent):
        if event.epsilon > _MAX_PURE_EPSILON:  # exp(epsilon) overflows a double past ~709
            raise PLDTooLarge(
                f"A pure-DP event of epsilon={event.epsilon:g} is beyond what can be accounted for "
                f"(limit {_MAX_PURE_EPSILON:g}); no run may spend that much on one release."
            )
        params = common.DifferentialPrivacyParameters(event.epsilon, 0.0)
        return pld.from_privacy_parameters(params, value_discretization_interval=h)
    if isinstance(event, ApproxDPEvent):  # the worst (epsilon, delta) pair: delta as mass at infinite loss
        if event.epsilon > _MAX_PURE_EPSILON:
            raise PLDTooLarge(
                f"An (epsilon, delta) event of epsilon={event.epsilon:g} is beyond what can be accounted for "
                f"(limit {_MAX_PURE_EPSILON:g}); no run may spend that much on one release."
            )
        params = common.DifferentialPrivacyParameters(event.epsilon, event.delta)
        return pld.from_privacy_parameters(params, value_discretization_interval=h)
    raise TypeError(f"PLD accountant cannot compose {event!r}")


@functools.lru_cache(maxsize=4)  # self-composed DP-SGD PLDs are large; a bisection makes many distinct ones
def _poisson_pld(event: PoissonGaussianEvent, h: float):  # noqa: ANN202
    return _one_step_pld(event.sample_rate, event.noise_multiplier, h).self_compose(event.steps)


@functools.lru_cache(maxsize=8)
def _one_step_pld(sample_rate: float, noise_multiplier: float, h: float):  # noqa: ANN202
    """One Poisson-subsampled Gaussian step's PLD, cached apart from its self-compositions:
    building it costs more than a self-composition, and the epsilon curve (one
    composition per checkpoint), the ledger's history (the same stage over several runs) and
    the settlement compose the same step at different step counts."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(noise_multiplier, sampling_prob=sample_rate, value_discretization_interval=h)


class PLDAccountant(Accountant):
    """Privacy-loss-distribution composition (Koskela et al.; dp-accounting), the reported figure."""

    name = "pld"
    library = "dp-accounting"

    def __init__(self, discretization: float = 1e-4) -> None:
        self.discretization = discretization

    def _settings(self) -> tuple[object, ...]:
        return (float(self.discretization),)

    def _pld(self, event: Event):  # noqa: ANN202 - dp-accounting's own type
        return _pld_of(event, self.discretization)

    def _epsilon(self, pairs: list[tuple[Event, int]], delta: float) -> float:
        total = None
        for event, count in pairs:
            p = self._pld(event)
            if count > 1:
                p = p.self_compose(count)
            total = p if total is None else total.compose(p)
        if total is None:  # `epsilon` answers 0 for no events before it asks here
            raise ValueError("the PLD accountant composes at least one event")
        return max(0.0, total.get_epsilon_for_delta(delta))


def _rr_rdp(epsilon: float, orders: np.ndarray) -> np.ndarray:
    """RDP of binary randomized response at epsilon: by data processing, a bound for any
    epsilon-DP mechanism (every such pair is a post-processing of it, Kairouz et al. 2015)."""
    p = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    a = orders
    log_terms = np.logaddexp(a * math.log(p) + (1 - a) * math.log1p(-p), a * math.log1p(-p) + (1 - a) * math.log(p))
    return np.minimum(log_terms / (a - 1), epsilon)


class RDPAccountant(Accountant):
    """Renyi-DP composition (Mironov 2017; dp-accounting), looser than PLD: a cross-check."""

    name = "rdp"
    library = "dp-accounting"

    def _epsilon(self, pairs: list[tuple[Event, int]], delta: float) -> float:
        from dp_accounting import dp_event as dpe
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        acc = rdp.RdpAccountant(orders=list(_RDP_ORDERS))
        extra = np.zeros(len(_RDP_ORDERS))
        for event, count in pairs:
            if isinstance(event, GaussianEvent):
                acc.compose(dpe.GaussianDpEvent(event.noise_multiplier), count)
            elif isinstance(event, LaplaceEvent):
                acc.compose(dpe.LaplaceDpEvent(event.noise_multiplier), count)
            elif isinstance(event, PoissonGaussianEvent):
                sampled = dpe.PoissonSampledDpEvent(event.sample_rate, dpe.GaussianDpEvent(event.noise_multiplier))
                acc.compose(dpe.SelfComposedDpEvent(sampled, event.steps), count)
            elif isinstance(event, PureDPEvent):
                extra += count * _rr_rdp(event.epsilon, np.asarray(_RDP_ORDERS, dtype=float))
            else:  # an ApproxDPEvent's delta has no Renyi bound: the PLD and PRV accountants compose it
                raise TypeError(f"RDP accountant cannot compose {event!r}")
        total = np.asarray(acc._rdp, dtype=float) + extra  # noqa: SLF001 - the accountant keeps its curve here
        eps, _ = rdp.compute_epsilon(list(_RDP_ORDERS), total, delta)
        return max(0.0, eps)


class PRVAccountant(Accountant):
    """Privacy-random-variable composition (Gopi et al. 2021; prv-accountant): an independent check."""

    name = "prv"
    library = "prv-accountant"

    def __init__(self, eps_error: float = 0.001, delta_error: float = 1e-10) -> None:
        self.eps_error = eps_error
        self.delta_error = delta_error

    def _settings(self) -> tuple[object, ...]:
        return (float(self.eps_error), float(self.delta_error))

    def _epsilon(self, pairs: list[tuple[Event, int]], delta: float) -> float:
        import prv_accountant as prv

        prvs, counts = [], []
        for event, count in pairs:
            if isinstance(event, GaussianEvent):
                prvs.append(prv.GaussianMechanism(noise_multiplier=event.noise_multiplier))
            elif isinstance(event, LaplaceEvent):
                prvs.append(prv.LaplaceMechanism(mu=1.0 / event.noise_multiplier))
            elif isinstance(event, PoissonGaussianEvent):
                prvs.append(
                    prv.PoissonSubsampledGaussianMechanism(
                        sampling_probability=event.sample_rate, noise_multiplier=event.noise_multiplier
                    )
                )
                count *= event.steps
            elif isinstance(event, PureDPEvent):
                prvs.append(prv.PureDPMechanism(eps=event.epsilon))
            elif isinstance(event, ApproxDPEvent):
                prvs.append(prv.ApproximateDPMechanism(epsilon=event.epsilon, delta=event.delta))
            else:
                raise TypeError(f"PRV accountant cannot compose {event!r}")
            counts.append(count)
        acc = prv.PRVAccountant(
            prvs=prvs, max_self_compositions=counts, eps_error=self.eps_error, delta_error=self.delta_error
        )
        _, _, upper = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        return max(0.0, float(upper))


__all__ = [
    "ACCOUNTANTS",
    "MAX_PLD_POINTS",
    "Accountant",
    "PLDAccountant",
    "PLDTooLarge",
    "PRVAccountant",
    "RDPAccountant",
    "pld_points",
    "remember_on_disk",
]

ACCOUNTANTS: dict[str, type[Accountant]] = {"pld": PLDAccountant, "rdp": RDPAccountant, "prv": PRVAccountant}
