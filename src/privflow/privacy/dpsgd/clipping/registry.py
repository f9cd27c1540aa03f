"""Registry of clipping strategies (like ``grad_samplers.registry``): decorator-registered,
looked up by name, so the engine and the trainer hold no if/elif ladder over strategies.

A strategy provides the fast path (``fast``: norms and sums from activations and output
gradients where possible) and the reference path (``reference``: clip materialised
per-example gradients). Both must bound every example's total clipped gradient norm by C
(``bounded``), except the unclipped ``"none"`` used for checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from privflow.privacy.dpsgd.clipping.structure import LayerInfo
from privflow.privacy.dpsgd.grad_samplers.registry import Call


@dataclass
class StepContext:
    """One batch's recorded layer calls and the public clipping settings."""

    active: list[tuple[LayerInfo, Sequence[Call]]]  # layers called in this batch, with their calls
    layers: Sequence[LayerInfo]  # all layers (the threshold split is over all of them)
    n: int
    method: str
    max_grad_norm: float
    sparsity: float
    generator: torch.Generator | None
    dtype: torch.dtype
    device: torch.device


class ClippingStrategy(Protocol):
    bounded: bool

    def fast(self, ctx: StepContext) -> tuple[dict[nn.Parameter, Tensor] | None, Tensor | None]:
        """(sum_i clip(g_i) per parameter, None), or (None, bad [n]) when examples are non-finite."""
        ...

    def reference(self, ctx: StepContext, grads: list[list[Tensor]]) -> list[list[Tensor]]:
        """Clip materialised per-example gradients (per active layer, per parameter, [n, *shape])."""
        ...


CLIPPING_STRATEGIES: dict[str, ClippingStrategy] = {}


def register_clipping(name: str) -> Callable[[Any], Any]:
    """Class decorator: ``@register_clipping("flat") class Flat: ...`` registers an instance."""

    def deco(cls: Any) -> Any:
        CLIPPING_STRATEGIES[name] = cls() if isinstance(cls, type) else cls
        return cls

    return deco


def get_clipping(name: str) -> ClippingStrategy:
    try:
        return CLIPPING_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown clipping strategy {name!r}; known: {sorted(CLIPPING_STRATEGIES)}") from None


def bounded_clippings() -> tuple[str, ...]:
    """Names of the strategies that bound each example's contribution by C (trainable)."""
    return tuple(k for k, v in CLIPPING_STRATEGIES.items() if v.bounded)
