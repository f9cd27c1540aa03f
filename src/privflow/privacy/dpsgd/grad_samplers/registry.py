"""Registries beside opacus' GRAD_SAMPLERS: fast clipping ops and structural parameter counts.

* ``GHOST_OPS[type]``: layers whose per-example gradient norms and clipped sums can be formed
  from the stored activations and output gradients without materialising per-example
  gradients (fast gradient clipping, Lee & Kifer 2021, as DP-HFlow's "Fast Per-example
  Gradient Computation" section uses it). Layers without an entry are materialised through
  their opacus grad sampler.
* ``FREE_NUMEL[type]``: how many entries of each parameter can be non-zero in a gradient
  (a MADE mask or a triangular factor fixes the others at 0); the "parameter complexity"
  used to split the clipping threshold and the m of stochastic sparsification.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from torch import Tensor, nn

L = TypeVar("L", bound=nn.Module, contravariant=True)  # the layer type a GhostOps is registered for


@dataclass
class Call:
    """One forward call of a layer: its (detached) inputs and, after backward, its output grads."""

    activations: list[Any]
    kwargs: dict[str, Any]
    backprops: Any = None


class GhostOps(Protocol[L]):
    """Fast clipping operations for one layer type L (all calls of one step at once); the registry
    holds them as ``GhostOps[Any]`` and asks each only about layers of its own type."""

    def applicable(self, layer: L, calls: Sequence[Call]) -> bool: ...

    def sq_norms(self, layer: L, calls: Sequence[Call]) -> dict[nn.Parameter, Tensor]:
        """Per-example squared norm [n] of each parameter's gradient summed over the calls."""
        ...

    def unit_stats(self, layer: L, calls: Sequence[Call]) -> dict[nn.Parameter, tuple[Tensor, Tensor]] | None:
        """Per-example, per-row (L1 norm, squared L2 norm), each [n, rows]; None: materialise."""
        ...

    def weighted_sum(
        self, layer: L, calls: Sequence[Call], weights: dict[nn.Parameter, Tensor]
    ) -> dict[nn.Parameter, Tensor]:
        """sum_i w_i * grad_i, with w [n] (one per example) or [n, rows] (one per example and row)."""
        ...

    def materialise(self, layer: L, calls: Sequence[Call], sl: slice | None = None) -> dict[nn.Parameter, Tensor]:
        """Per-example gradients [c, *shape] of examples ``sl``, summed over the calls."""
        ...

    def free_entries(self, layer: L, calls: Sequence[Call], sl: slice) -> Tensor:
        """The per-example gradient entries that can be non-zero, [c, m]: the layer's trainable
        parameters in registration order, each in the order of ``free_index`` (stochastic
        sparsification selects among them)."""
        ...

    def free_index(self, layer: L) -> dict[nn.Parameter, Tensor | None]:
        """Flat indices of the entries ``free_entries`` returns (None: all of them, in order)."""
        ...


class SampledOps(Protocol[L]):
    """The ghost ops of a layer type with CPU kernels for stochastic sparsification (the masked
    linear layer's): the ops that define ``sampled_entries`` define ``sparsified_sum`` with it."""

    def sampled_entries(self, layer: L, calls: Sequence[Call], positions: Tensor) -> Tensor | None:
        """The per-example gradient entries [n, S] at ``positions`` of the free entries; None
        where the kernels do not apply."""
        ...

    def sparsified_sum(self, layer: L, calls: Sequence[Call], tau: Tensor, gamma: Tensor, clip: float) -> Tensor:
        """sum_i clip_C(T_{tau_i, gamma_i}(v_i)) over the examples' free entries."""
        ...


GHOST_OPS: dict[type, GhostOps[Any]] = {}
FREE_NUMEL: dict[type, Callable[[nn.Module], dict[nn.Parameter, int]]] = {}


def register_ghost(cls: type) -> Callable[[Any], Any]:
    def deco(ops: Any) -> Any:
        GHOST_OPS[cls] = ops() if isinstance(ops, type) else ops
        return ops

    return deco


def register_free_numel(cls: type) -> Callable[[Any], Any]:
    def deco(fn: Callable[[nn.Module], dict[nn.Parameter, int]]) -> Any:
        FREE_NUMEL[cls] = fn
        return fn

    return deco


def free_numel(layer: nn.Module) -> dict[nn.Parameter, int]:
    """Structurally free gradient entries of each directly owned trainable parameter."""
    fn = FREE_NUMEL.get(type(layer))
    if fn is not None:
        return fn(layer)
    return {p: p.numel() for p in layer.parameters(recurse=False) if p.requires_grad}
