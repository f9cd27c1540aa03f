"""Frozen privacy-event records: what a mechanism cost, in a form any accountant can compose.

Events carry only mechanism parameters (noise multipliers, sample rates, counts), never
data, so a run's privacy can be recomputed later from its JSON record alone. The unit of
privacy is one row, adjacency add/remove one row (docs/architecture.md, privacy rule 1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class GaussianEvent:
    """Gaussian mechanism: noise std = noise_multiplier * L2 sensitivity."""

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float

    def __post_init__(self) -> None:
        _positive(self, "noise_multiplier")


@dataclass(frozen=True)
class LaplaceEvent:
    """Laplace mechanism: noise scale b = noise_multiplier * L1 sensitivity (epsilon = 1/multiplier)."""

    kind: ClassVar[str] = "laplace"
    noise_multiplier: float

    def __post_init__(self) -> None:
        _positive(self, "noise_multiplier")


@dataclass(frozen=True)
class PoissonGaussianEvent:
    """DP-SGD: `steps` Gaussian steps, each on a Poisson sample of rate `sample_rate`."""

    kind: ClassVar[str] = "poisson_gaussian"
    sample_rate: float
    noise_multiplier: float
    steps: int

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate}")
        _positive(self, "noise_multiplier")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")


@dataclass(frozen=True)
class PureDPEvent:
    """An epsilon-DP mechanism with delta = 0 (Report-Noisy-Max with Gumbel noise)."""

    kind: ClassVar[str] = "pure_dp"
    epsilon: float

    def __post_init__(self) -> None:
        _positive(self, "epsilon")


@dataclass(frozen=True)
class ApproxDPEvent:
    """An (epsilon, delta)-DP mechanism stated by its guarantee alone: a thresholded histogram (the
    threshold's delta), or a group of releases bounded by basic composition (privacy/mechanisms/dp_histogram.py)."""

    kind: ClassVar[str] = "approx_dp"
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        _positive(self, "epsilon")
        if not (isinstance(self.delta, int | float) and 0 <= self.delta < 1):
            raise ValueError(f"ApproxDPEvent.delta must lie in [0, 1), got {self.delta!r}")


@dataclass(frozen=True)
class RepeatedEvent:
    """The same event applied `count` times in sequence (DP-EM iterations, top-k selection)."""

    kind: ClassVar[str] = "repeated"
    event: Event
    count: int

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")


@dataclass(frozen=True)
class NonPrivateEvent:
    """A step that read private rows without a mechanism: the total becomes infinite."""

    kind: ClassVar[str] = "non_private"
    reason: str


Event = (
    GaussianEvent | LaplaceEvent | PoissonGaussianEvent | PureDPEvent | ApproxDPEvent | RepeatedEvent | NonPrivateEvent
)

_KINDS: dict[str, type] = {
    cls.kind: cls
    for cls in (
        GaussianEvent,
        LaplaceEvent,
        PoissonGaussianEvent,
        PureDPEvent,
        ApproxDPEvent,
        RepeatedEvent,
        NonPrivateEvent,
    )
}


def _positive(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{type(obj).__name__}.{name} must be a finite positive number, got {value!r}")


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with a 'kind' tag; nested events are converted recursively."""
    out: dict[str, Any] = {"kind": event.kind}
    for f in fields(event):
        value = getattr(event, f.name)
        out[f.name] = event_to_dict(value) if f.name == "event" else value
    return out


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of `event_to_dict`; raises ValueError on an unknown kind."""
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown privacy event kind {kind!r}")
    if "event" in data:
        data["event"] = event_from_dict(data["event"])
    return _KINDS[kind](**data)


def events_to_json(events: list[Event]) -> str:
    return json.dumps([event_to_dict(e) for e in events])


def events_from_json(text: str) -> list[Event]:
    return [event_from_dict(d) for d in json.loads(text)]


def flatten(events: list[Event]) -> list[tuple[Event, int]]:
    """(base event, count) pairs with nested repetitions multiplied out."""
    out: list[tuple[Event, int]] = []
    for e in events:
        if isinstance(e, RepeatedEvent):
            out.extend((inner, n * e.count) for inner, n in flatten([e.event]))
        else:
            out.append((e, 1))
    return [(e, n) for e, n in out if n > 0]


__all__ = [
    "ApproxDPEvent",
    "Event",
    "GaussianEvent",
    "LaplaceEvent",
    "NonPrivateEvent",
    "PoissonGaussianEvent",
    "PureDPEvent",
    "RepeatedEvent",
    "event_from_dict",
    "event_to_dict",
    "events_from_json",
    "events_to_json",
    "flatten",
]
