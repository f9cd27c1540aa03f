"""One DP-SGD gradient: the sum over a batch of clipped per-example gradients.

Two methods give the same result (tested to 1e-6 in float64):

* ``"hooks"`` (reference): every layer's per-example gradients are materialised by its
  opacus grad sampler (summed over repeated calls), then clipped by the strategy.
* ``"fast"``: linear layers (nn.Linear, MaskedLinear: almost all parameters of a flow)
  and LU linear flows never materialise them for flat and per-layer clipping. Their
  per-example norms come from the stored activations and output gradients
  (``grad_samplers.linear``: ||a|| ||g||, the Gram trick for repeated calls, on a mask's
  distinct rows; ``grad_samplers.lu_linear``: DP-HFlow eq. 3's triangles by cumulative
  sums), and the clipped sum is one weighted matrix product per call sum_i s_i g_i a_i^T
  (fast gradient clipping, Lee & Kifer 2021, cited by DP-HFlow "Fast Per-example Gradient
  Computation"). Per-unit clipping does the same with per-row weights; only the row L1
  norms of a layer called several times (the shared MADE) need its per-example gradient,
  formed group by group on the free entries of its mask (a staircase of column prefixes).
  ActNorm and the block embedding form their small per-example gradients once per step in
  a few whole-batch operations (``grad_samplers.small``); low-rank layers are materialised.
  LULinear's clipped sum is one d x d product per call. Stochastic sparsification needs
  every entry of every per-example gradient and is materialised in chunks, only the entries
  a mask or a triangle leaves free. On the CPU fused kernels (``privacy.dpsgd.cpu_kernels``) form
  a masked layer's entries row by row and sparsify, clip and sum them in one pass per
  example (storing none when tau comes from sampled positions), and give per-unit
  clipping's row norms and the squared norms of the masked layers and LULinear.

Loss convention: the per-example loss is -log_prob(x_i); gradients are of the SUM over the
batch (the trainer divides by the public expected batch size after adding noise).

Non-finite examples: an example whose loss, recorded activations / output gradients, or
per-example gradient norm is NaN or infinite would otherwise poison the sum (a NaN norm
skips clipping; 0 * inf = NaN in the fast weighted sums). Every such example is zeroed --
the batch is recomputed without it, so it contributes exactly nothing -- and counted in
``ClippedSum.nonfinite``. Losses and norms are checked on every step; the recorded tensors
only when the clipped sum comes out non-finite (any non-finite entry that reaches the sum
makes it so; one that does not reach it changes nothing). Dropping an example is a
per-example map to the zero gradient, whose norm is <= C, so the sensitivity and the noise
calibration are unchanged. The count is a curator-only diagnostic (it is computed on private rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import torch
from torch import Tensor, nn

from privflow.privacy.dpsgd.clipping import strategies as _strategies  # noqa: F401  (registers the strategies)
from privflow.privacy.dpsgd.clipping._fast import Method, add_into, layer_sq, layer_sum
from privflow.privacy.dpsgd.clipping.registry import StepContext, bounded_clippings, get_clipping
from privflow.privacy.dpsgd.clipping.structure import LayerInfo, model_layers
from privflow.privacy.dpsgd.grad_samplers import Tape, materialise
from privflow.privacy.dpsgd.grad_samplers.registry import Call

if TYPE_CHECKING:
    from privflow.models.base import LogProbModel

Clipping = Literal["flat", "per_layer", "per_unit", "sparsify", "none"]
CLIPPINGS = bounded_clippings()  # the registered strategies that bound each example by C


@dataclass
class ClippedSum:
    """The summed clipped gradient per parameter, the detached per-example losses [n] and the
    mask [n] of non-finite examples left out of the sum (curator-only diagnostics)."""

    grads: dict[nn.Parameter, Tensor]
    losses: Tensor
    nonfinite: Tensor | None = None

    @property
    def nonfinite_examples(self) -> int:
        """How many examples were zeroed because their loss or gradient was not finite."""
        return 0 if self.nonfinite is None else int(self.nonfinite.sum())


class GradientMismatch(RuntimeError):
    """Per-example gradients do not add up to the batch gradient: a layer use is not recorded."""


def clipped_gradient_sum(
    model: nn.Module,
    x: Tensor,
    *,
    clipping: Clipping,
    max_grad_norm: float,
    sparsity: float = 0.5,
    generator: torch.Generator | None = None,
    method: Method = "fast",
    check: bool = False,
    layers: Sequence[LayerInfo] | None = None,
    noise: Tensor | None = None,
) -> ClippedSum:
    """sum_i clip(grad of -log_prob(x_i)) for every trainable parameter (no noise added).

    ``clipping="none"`` returns the unclipped sum (for checks). ``check=True`` also computes
    the batch gradient by autograd and raises ``GradientMismatch`` if the unclipped sum of
    the recorded per-example gradients differs from it (a parameter used outside a
    recorded layer call, or a layer whose grad sampler misses a path). ``noise``: the
    model's dequantization noise for the rows (``log_prob(x, noise)``), so the caller's
    explicit generator, not the global RNG, supplies it. Examples with a non-finite loss or
    gradient contribute zero and are flagged in ``nonfinite`` (module docstring).
    """
    layers = list(layers) if layers is not None else model_layers(model)
    params = [p for layer in layers for p in layer.params]
    n = int(x.shape[0])
    keep = torch.ones(n, dtype=torch.bool, device=x.device)
    first_losses: Tensor | None = None
    grads: dict[nn.Parameter, Tensor] | None = None
    for _ in range(4):  # each pass can only drop rows; a second drop is already rare
        idx = keep.nonzero().squeeze(1)
        if idx.numel() == 0:
            grads = {}
            break
        sub = x if idx.numel() == n else x[idx]
        sub_noise = None if noise is None else (noise if idx.numel() == n else noise[idx])
        grads, losses, bad = _clipped_pass(
            cast("LogProbModel", model),
            sub,
            sub_noise,
            clipping,
            max_grad_norm,
            sparsity,
            generator,
            method,
            check,
            layers,
            params,
        )
        if first_losses is None:
            first_losses = losses
        if grads is not None:
            break
        keep[idx[bad]] = False
    if grads is None:
        raise RuntimeError("non-finite gradients persisted after leaving out every non-finite example")
    for p in params:  # layers never called (or without examples) contribute zero
        if p not in grads:
            grads[p] = torch.zeros_like(p)
    if first_losses is None:
        first_losses = torch.empty(0, dtype=x.dtype, device=x.device)
    return ClippedSum(grads, first_losses, ~keep)


def _nonfinite_rows(calls: Sequence[Sequence[Call]], n: int, device: torch.device) -> Tensor:
    """[n] mask of examples with a non-finite entry in any recorded per-example tensor
    (activations, keyword inputs, output gradients: first dimension n)."""
    bad = torch.zeros(n, dtype=torch.bool, device=device)
    tensors: list[Tensor] = []

    def collect(v: object) -> None:
        if isinstance(v, Tensor):
            if v.dim() > 0 and v.shape[0] == n and v.is_floating_point() and v.numel():
                tensors.append(v)
        elif isinstance(v, (list, tuple)):
            for item in v:
                collect(item)

    for layer_calls in calls:
        for call in layer_calls:
            collect(call.activations)
            collect(list(call.kwargs.values()))
            collect(call.backprops)
    if _all_finite(tensors):
        return bad

    for t in tensors:  # the tensors `collect` found: every per-example one
        bad.logical_or_(~torch.isfinite(t.reshape(n, -1)).all(1).to(device))
    return bad


def _all_finite(tensors: Sequence[Tensor]) -> bool:
    """Whether every entry is finite. Screened by one sum per tensor in its own dtype (a sum is
    finite whenever all its entries are; no per-entry masks); only a non-finite sum -- a
    non-finite entry, or an overflow of finite ones -- is checked entry by entry."""
    if not tensors or bool(torch.isfinite(torch.stack([t.sum() for t in tensors])).all()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _clipped_pass(
    model: LogProbModel,
    x: Tensor,
    noise: Tensor | None,
    clipping: str,
    max_grad_norm: float,
    sparsity: float,
    generator: torch.Generator | None,
    method: Method,
    check: bool,
    layers: Sequence[LayerInfo],
    params: Sequence[nn.Parameter],
) -> tuple[dict[nn.Parameter, Tensor] | None, Tensor, Tensor]:
    """One pass over the rows: (sums, losses, bad). sums is None when some examples are
    non-finite; `bad` [n] then names them and the caller recomputes without them."""
    strategy = get_clipping(clipping)
    with Tape([layer.module for layer in layers]) as tape:
        losses = -(model.log_prob(x) if noise is None else model.log_prob(x, noise))
        batch_grads = tape.backward(losses.sum(), params if check else ())
    n = x.shape[0]
    dtype = losses.dtype
    losses = losses.detach()
    calls = [tape.calls[layer.module] for layer in layers]
    bad = ~torch.isfinite(losses)
    if bool(bad.any()):
        return None, losses, bad
    active: list[tuple[LayerInfo, Sequence[Call]]] = [(layer, c) for layer, c in zip(layers, calls, strict=False) if c]
    ctx = StepContext(active, layers, n, method, max_grad_norm, sparsity, generator, dtype, x.device)
    if check:
        unclipped: dict[nn.Parameter, Tensor] = {}
        ones = torch.ones(n, dtype=dtype, device=x.device)
        for layer, c in active:
            add_into(unclipped, layer_sum(layer, c, n, method, ones))
        _compare(params, unclipped, batch_grads, layers)
    # a pass that finds non-finite rows is redone without them from the same draws (so the
    # result is the clean batch's, draw for draw)
    drawn = generator.get_state() if generator is not None else None
    if method == "hooks":
        out = _hooks(ctx, strategy)
    else:
        got, bad_rows = strategy.fast(ctx)
        if got is None:
            _restore(generator, drawn)
            return None, losses, bad_rows if bad_rows is not None else torch.zeros(n, dtype=torch.bool)
        out = got
    if not _all_finite(list(out.values())):
        # A non-finite recorded tensor reaches the sum (0 * inf is NaN in every product), so
        # the rows are screened only here, when the sum shows one: a screen of every recorded
        # tensor would be paid on every step for a rare event.
        bad = _nonfinite_rows(calls, n, losses.device)
        if bool(bad.any()):
            _restore(generator, drawn)
            return None, losses, bad
        # finite inputs, yet a per-example gradient overflowed: find it from exact norms
        sq = sum(layer_sq(layer, c, n, "hooks")[0] for layer, c in active)
        bad = ~torch.isfinite(torch.as_tensor(sq))
        if not bool(bad.any()):
            raise RuntimeError("the clipped sum is not finite although every example's gradient is")
        _restore(generator, drawn)
        return None, losses, bad
    return out, losses, torch.zeros(n, dtype=torch.bool, device=losses.device)


def _restore(generator: torch.Generator | None, state: Tensor | None) -> None:
    if generator is not None and state is not None:
        generator.set_state(state)


def _hooks(ctx: StepContext, strategy: object) -> dict[nn.Parameter, Tensor]:
    """Reference: materialise all per-example gradients, clip them, sum them."""
    if not ctx.active:
        return {}
    grads = []
    for layer, c in ctx.active:
        g = materialise(layer.module, c)
        grads.append([g[p] for p in layer.params])
    clipped = strategy.reference(ctx, grads)  # type: ignore[attr-defined]
    return {
        p: g.sum(0)
        for (layer, _), cl in zip(ctx.active, clipped, strict=False)
        for p, g in zip(layer.params, cl, strict=False)
    }


def _compare(
    params: Sequence[nn.Parameter],
    unclipped: dict[nn.Parameter, Tensor],
    batch_grads: Sequence[Tensor | None],
    layers: Sequence[LayerInfo],
) -> None:
    names = {p: f"{layer.name}.{k}" for layer in layers for k, p in layer.module.named_parameters(recurse=False)}
    for p, ref in zip(params, batch_grads, strict=False):
        ref = torch.zeros_like(p) if ref is None else ref
        got = unclipped.get(p, torch.zeros_like(p))
        err = float((got - ref).norm())
        scale = float(ref.norm()) + float(got.norm())
        if err > 1e-3 * scale + 1e-5:
            raise GradientMismatch(
                f"Parameter '{names.get(p, '?')}' gets a batch gradient that its per-example gradients "
                f"do not add up to (difference {err:.3g}, size {scale:.3g}). It is used outside its "
                "module's forward, or its layer's grad sampler misses a path (e.g. a log-determinant)."
            )
