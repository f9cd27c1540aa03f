"""The registered clipping strategies: flat, per-layer, per-unit, stochastic sparsification
(DP-HFlow, "Per-layer Clipping" and "Fine-grained Gradient Clipping"), and the unclipped
"none" used for consistency checks. Each has a fast path and a reference path; both keep
every example's clipped gradient norm <= C (module docstrings of flat / per_layer /
per_unit / sparsify), so the noise calibrated to C is right for all of them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from privflow.privacy.dpsgd.clipping._fast import (
    add_into,
    free_index,
    gammas,
    layer_sq,
    layer_sum,
    per_unit_layer,
    positions,
    sparsify_layer,
    thresholds,
)
from privflow.privacy.dpsgd.clipping.flat import clip_flat, flat_factors
from privflow.privacy.dpsgd.clipping.per_layer import clip_per_layer, per_layer_factors
from privflow.privacy.dpsgd.clipping.per_unit import clip_per_unit
from privflow.privacy.dpsgd.clipping.registry import StepContext, register_clipping
from privflow.privacy.dpsgd.clipping.sparsify import clip_sparsify

Sums = dict[nn.Parameter, Tensor]


def _active_thresholds(ctx: StepContext) -> list[float]:
    return thresholds(ctx.layers, ctx.max_grad_norm, [layer for layer, _ in ctx.active])


class _NormScaled:
    """Strategies whose clip factor is a function of per-example (per-layer) norms only: the
    norms come from ghost norms, the sum is one weighted product per layer."""

    bounded = True

    def factors(self, ctx: StepContext, sq: Tensor) -> list[Tensor]:
        raise NotImplementedError

    def fast(self, ctx: StepContext) -> tuple[Sums | None, Tensor | None]:
        out: Sums = {}
        if not ctx.active:
            return out, None
        norms = [layer_sq(layer, c, ctx.n, ctx.method) for layer, c in ctx.active]  # type: ignore[arg-type]
        sq = torch.stack([v for v, _ in norms], 1)
        bad = ~torch.isfinite(sq.sum(1))
        if bool(bad.any()):
            return None, bad
        for (layer, c), w, (_, kept) in zip(ctx.active, self.factors(ctx, sq), norms, strict=False):
            add_into(out, layer_sum(layer, c, ctx.n, ctx.method, w, kept))  # type: ignore[arg-type]
        return out, None


@register_clipping("flat")
class Flat(_NormScaled):
    def factors(self, ctx: StepContext, sq: Tensor) -> list[Tensor]:
        f = flat_factors(sq, ctx.max_grad_norm)
        return [f] * len(ctx.active)

    def reference(self, ctx: StepContext, grads: list[list[Tensor]]) -> list[list[Tensor]]:
        return clip_flat(grads, ctx.max_grad_norm)


@register_clipping("per_layer")
class PerLayer(_NormScaled):
    def factors(self, ctx: StepContext, sq: Tensor) -> list[Tensor]:
        f = per_layer_factors(sq, _active_thresholds(ctx))
        return [f[:, i] for i in range(len(ctx.active))]

    def reference(self, ctx: StepContext, grads: list[list[Tensor]]) -> list[list[Tensor]]:
        return clip_per_layer(grads, _active_thresholds(ctx))


@register_clipping("per_unit")
class PerUnit:
    bounded = True

    def fast(self, ctx: StepContext) -> tuple[Sums | None, Tensor | None]:
        out: Sums = {}
        for (layer, c), t in zip(ctx.active, _active_thresholds(ctx), strict=False):
            add_into(out, per_unit_layer(layer, c, ctx.n, ctx.method, t))  # type: ignore[arg-type]
        return out, None

    def reference(self, ctx: StepContext, grads: list[list[Tensor]]) -> list[list[Tensor]]:
        return clip_per_unit(grads, _active_thresholds(ctx))


@register_clipping("sparsify")
class Sparsify:
    """One uniform draw per example and layer, all drawn at once per step ([layers, n]), then
    each long layer's tau positions (``sparsify.threshold_positions``)."""

    bounded = True

    def fast(self, ctx: StepContext) -> tuple[Sums | None, Tensor | None]:
        out: Sums = {}
        layers = [layer for layer, _ in ctx.active]
        gs = gammas(ctx.n, len(layers), ctx.generator, ctx.device, ctx.dtype)
        pos = positions(layers, ctx.generator, ctx.device)
        for (layer, c), t, gamma, p in zip(ctx.active, _active_thresholds(ctx), gs, pos, strict=True):
            add_into(out, sparsify_layer(layer, c, ctx.n, ctx.method, t, ctx.sparsity, gamma, p))  # type: ignore[arg-type]
        return out, None

    def reference(self, ctx: StepContext, grads: list[list[Tensor]]) -> list[list[Tensor]]:
        layers = [layer for layer, _ in ctx.active]
        device = grads[0][0].device
        gs = gammas(ctx.n, len(layers), ctx.generator, device, grads[0][0].dtype)
        pos = positions(layers, ctx.generator, device)
        index = [[free_index(layer).get(p) for p in layer.params] for layer in layers]
        return clip_sparsify(grads, _active_thresholds(ctx), ctx.sparsity, gs, pos, index)


@register_clipping("none")
class Unclipped:
    """The plain sum of per-example gradients (checks only: no bound, not trainable)."""

    bounded = False

    def fast(self, ctx: StepContext) -> tuple[Sums | None, Tensor | None]:
        out: Sums = {}
        ones = torch.ones(ctx.n, dtype=ctx.dtype, device=ctx.device)
        for layer, c in ctx.active:
            add_into(out, layer_sum(layer, c, ctx.n, ctx.method, ones))  # type: ignore[arg-type]
        return out, None

    def reference(self, ctx: StepContext, grads: list[list[Tensor]]) -> list[list[Tensor]]:
        return [list(layer) for layer in grads]
