"""One DP-SGD gradient: the sum over a batch of clipped per-example gradients.

Two methods give the same result (tested to 1e-6 in float64):

* ``"hooks"`` (reference): every layer's per-example gradients are materialised by its
  opacus grad sampler (summed over repeated calls), then clipped by the strategy.
* ``"fast"``: linear layers (nn.Linear, MaskedLinear: almost all parameters of a flow)
  never materialise them for flat and per-layer clipping. Their per-example norms come
  from the stored activations and output gradients (``grad_samplers.linear``: ||a|| ||g||,
  the Gram trick for repeated calls), and the clipped sum is one weighted matrix product
  sum_i s_i g_i a_i^T (fast gradient clipping, Lee & Kifer 2021, cited by DP-HFlow "Fast
  Per-example Gradient Computation"). Per-unit clipping does the same with per-row
  weights; only the row L1 norms of a layer called several times (the shared MADE) need
  its per-example gradient, formed in small chunks of examples by one batched product and
  reduced at once. Small layers (LU, low-rank, actnorm, embedding) are materialised.
  Stochastic sparsification needs every entry of every per-example gradient and is
  always materialised in chunks, leaving out entries a mask fixes at zero.

Loss convention: the per-example loss is -log_prob(x_i); gradients are of the SUM over the
batch (the trainer divides by the public expected batch size after adding noise).

Non-finite examples: an example whose loss, recorded activations / output gradients, or
per-example gradient norm is NaN or infinite would otherwise poison the sum (a NaN norm
skips clipping; 0 * inf = NaN in the fast weighted sums). Every such example is zeroed
before clipping -- the batch is recomputed without it, so it contributes exactly nothing --
and counted in ``ClippedSum.nonfinite``. Dropping an example is a per-example map to the
zero gradient, whose norm is <= C, so the sensitivity and the noise calibration are
unchanged. The count is a curator-only diagnostic (it is computed on private rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from privflow.privacy.clipping.flat import clip_flat, flat_factors
from privflow.privacy.clipping.per_layer import clip_per_layer, layer_thresholds, per_layer_factors
from privflow.privacy.clipping.per_unit import clip_per_unit, unit_factors
from privflow.privacy.clipping.sparsify import clip_sparsify, sparsify_clipped_sum, sparsify_k
from privflow.privacy.clipping.structure import LayerInfo, model_layers
from privflow.privacy.grad_samplers import GHOST_OPS, Tape, materialise
from privflow.privacy.grad_samplers.registry import Call

Clipping = Literal["flat", "per_layer", "per_unit", "sparsify", "none"]
Method = Literal["fast", "hooks"]
CLIPPINGS = ("flat", "per_layer", "per_unit", "sparsify")

_CHUNK_ELEMENTS = 1 << 20  # per-example gradient entries per chunk: small chunks stay in cache and
# reuse freed memory (a fresh 40 MB tensor costs more in page faults than its arithmetic)


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


def _chunks(n: int, layer: LayerInfo) -> list[slice]:
    size = max(1, _CHUNK_ELEMENTS // max(1, sum(p.numel() for p in layer.params)))
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def _ghost(layer: LayerInfo, calls: Sequence[Call], method: Method) -> object | None:
    if method != "fast":
        return None
    ops = GHOST_OPS.get(type(layer.module))
    return ops if ops is not None and ops.applicable(layer.module, calls) else None


def _materialise(layer: LayerInfo, calls: Sequence[Call], sl: slice, method: Method) -> dict[nn.Parameter, Tensor]:
    ops = _ghost(layer, calls, method)
    if ops is not None:
        return ops.materialise(layer.module, calls, sl)  # type: ignore[attr-defined]
    return materialise(layer.module, calls, sl)


def _weighted(grads: dict[nn.Parameter, Tensor], weights: dict[nn.Parameter, Tensor]) -> dict[nn.Parameter, Tensor]:
    """sum_i w_i grad_i for materialised grads, w [c] or [c, rows]."""
    out = {}
    for p, g in grads.items():
        w = weights[p]
        if w.dim() == 1:
            out[p] = torch.einsum("n,n...->...", w.to(g.dtype), g)
        else:
            rows = w.shape[1]
            out[p] = (g.reshape(g.shape[0], rows, -1) * w[..., None]).sum(0).reshape(g.shape[1:])
    return out


def _add(acc: dict[nn.Parameter, Tensor], part: dict[nn.Parameter, Tensor]) -> None:
    for p, g in part.items():
        acc[p] = acc[p] + g if p in acc else g


def _layer_sq(
    layer: LayerInfo, calls: Sequence[Call], n: int, method: Method
) -> tuple[Tensor, dict[nn.Parameter, Tensor] | None]:
    """Per-example squared norm [n] of the layer's gradient, and the materialised per-example
    gradients when they fit in one chunk (kept for the weighted sum that follows)."""
    ops = _ghost(layer, calls, method)
    if ops is not None:
        return sum(ops.sq_norms(layer.module, calls).values()), None  # type: ignore[attr-defined]
    chunks = _chunks(n, layer)
    parts, kept = [], None
    for sl in chunks:
        g = _materialise(layer, calls, sl, method)
        parts.append(sum(v.reshape(v.shape[0], -1).pow(2).sum(1) for v in g.values()))
        kept = g if len(chunks) == 1 else None
    return torch.cat(parts), kept


def _layer_sum(
    layer: LayerInfo, calls: Sequence[Call], n: int, method: Method, w: Tensor,
    kept: dict[nn.Parameter, Tensor] | None = None,
) -> dict[nn.Parameter, Tensor]:
    """sum_i w_i grad_i of the layer for a per-example weight w [n]."""
    if kept is not None:
        return _weighted(kept, {p: w for p in kept})
    ops = _ghost(layer, calls, method)
    if ops is not None:
        return ops.weighted_sum(layer.module, calls, {p: w for p in layer.params})  # type: ignore[attr-defined]
    acc: dict[nn.Parameter, Tensor] = {}
    for sl in _chunks(n, layer):
        g = _materialise(layer, calls, sl, method)
        _add(acc, _weighted(g, {p: w[sl] for p in g}))
    return acc


def _per_unit_layer(
    layer: LayerInfo, calls: Sequence[Call], n: int, method: Method, thr: float
) -> dict[nn.Parameter, Tensor]:
    ops = _ghost(layer, calls, method)
    stats = ops.unit_stats(layer.module, calls) if ops is not None else None  # type: ignore[attr-defined]
    if stats is not None:
        l1 = torch.cat([stats[p][0] for p in layer.params], 1)
        sq = torch.cat([stats[p][1] for p in layer.params], 1)
        f = unit_factors(l1, sq, thr)
        weights, start = {}, 0
        for p in layer.params:
            rows = stats[p][0].shape[1]
            weights[p] = f[:, start : start + rows]
            start += rows
        return ops.weighted_sum(layer.module, calls, weights)  # type: ignore[attr-defined]
    acc: dict[nn.Parameter, Tensor] = {}
    for sl in _chunks(n, layer):
        g = _materialise(layer, calls, sl, method)
        clipped = clip_per_unit([[g[p] for p in layer.params]], [thr])[0]
        _add(acc, {p: c.sum(0) for p, c in zip(layer.params, clipped)})
    return acc


def _sparsify_layer(
    layer: LayerInfo, calls: Sequence[Call], n: int, method: Method, thr: float, sparsity: float, gamma: Tensor
) -> dict[nn.Parameter, Tensor]:
    """sum_i clip_{C_l}(T(g_i)) for one layer, in chunks of examples. Structurally zero
    entries (a MADE mask) are left out of the selection: they are 0 and stay 0 under T, and
    the k-th largest entry is the same with or without them (k <= free entries)."""
    ops = _ghost(layer, calls, method)
    cols = ops.free_columns(layer.module) if ops is not None else {}  # type: ignore[attr-defined]
    k = sparsify_k(layer.complexity, sparsity)
    total: Tensor | None = None
    for sl in _chunks(n, layer):
        if ops is not None:
            g = ops.materialise(layer.module, calls, sl, apply_mask=False)  # type: ignore[attr-defined]
        else:
            g = materialise(layer.module, calls, sl)
        parts = []
        for p in layer.params:
            v = g[p].reshape(g[p].shape[0], -1)
            idx = cols.get(p)
            parts.append(v if idx is None else torch.index_select(v, 1, idx))
        part = sparsify_clipped_sum(torch.cat(parts, 1) if len(parts) > 1 else parts[0], k, gamma[sl], thr)
        total = part if total is None else total + part
    out, start = {}, 0
    assert total is not None
    for p in layer.params:
        idx = cols.get(p)
        size = p.numel() if idx is None else idx.numel()
        piece = total[start : start + size]
        if idx is not None:
            piece = torch.zeros(p.numel(), dtype=piece.dtype, device=piece.device).index_copy_(0, idx, piece)
        out[p] = piece.reshape(p.shape)
        start += size
    return out


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
            model, sub, sub_noise, clipping, max_grad_norm, sparsity, generator, method, check, layers, params
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

    def visit(v: object) -> None:
        if isinstance(v, Tensor):
            if v.dim() > 0 and v.shape[0] == n and v.is_floating_point() and v.numel():
                bad.logical_or_(~torch.isfinite(v.reshape(n, -1)).all(1).to(device))
        elif isinstance(v, (list, tuple)):
            for item in v:
                visit(item)

    for layer_calls in calls:
        for call in layer_calls:
            visit(call.activations)
            visit(list(call.kwargs.values()))
            visit(call.backprops)
    return bad


def _clipped_pass(
    model: nn.Module,
    x: Tensor,
    noise: Tensor | None,
    clipping: Clipping,
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
    with Tape([layer.module for layer in layers]) as tape:
        losses = -(model.log_prob(x) if noise is None else model.log_prob(x, noise))
        batch_grads = tape.backward(losses.sum(), params if check else ())
    n = x.shape[0]
    dtype = losses.dtype
    losses = losses.detach()
    calls = [tape.calls[layer.module] for layer in layers]
    bad = ~torch.isfinite(losses) | _nonfinite_rows(calls, n, losses.device)
    if bool(bad.any()):
        return None, losses, bad
    out: dict[nn.Parameter, Tensor] = {}
    active = [(layer, c) for layer, c in zip(layers, calls) if c]
    if check:
        unclipped: dict[nn.Parameter, Tensor] = {}
        ones = torch.ones(n, dtype=dtype, device=x.device)
        for layer, c in active:
            _add(unclipped, _layer_sum(layer, c, n, method, ones))
        _compare(params, unclipped, batch_grads, layers)
    if clipping == "none":
        ones = torch.ones(n, dtype=dtype, device=x.device)
        for layer, c in active:
            _add(out, _layer_sum(layer, c, n, method, ones))
    elif method == "hooks":
        out = _hooks(active, n, clipping, max_grad_norm, layers, sparsity, generator)
    elif clipping in ("flat", "per_layer"):
        if active:
            norms = [_layer_sq(layer, c, n, method) for layer, c in active]
            sq = torch.stack([v for v, _ in norms], 1)
            bad = ~torch.isfinite(sq.sum(1))
            if bool(bad.any()):
                return None, losses, bad
            if clipping == "flat":
                f = flat_factors(sq, max_grad_norm)
                ws = [f] * len(active)
            else:
                thr = _thresholds(layers, max_grad_norm, [layer for layer, _ in active])
                f = per_layer_factors(sq, thr)
                ws = [f[:, i] for i in range(len(active))]
            for (layer, c), w, (_, kept) in zip(active, ws, norms):
                _add(out, _layer_sum(layer, c, n, method, w, kept))
    elif clipping == "per_unit":
        thr = _thresholds(layers, max_grad_norm, [layer for layer, _ in active])
        for (layer, c), t in zip(active, thr):
            _add(out, _per_unit_layer(layer, c, n, method, t))
    elif clipping == "sparsify":
        thr = _thresholds(layers, max_grad_norm, [layer for layer, _ in active])
        gammas = _gammas(n, len(active), generator, x.device, dtype)
        for (layer, c), t, gamma in zip(active, thr, gammas):
            _add(out, _sparsify_layer(layer, c, n, method, t, sparsity, gamma))
    else:
        raise ValueError(f"unknown clipping strategy {clipping!r}")
    if not all(bool(torch.isfinite(g).all()) for g in out.values()):
        # finite inputs, yet a per-example gradient overflowed: find it from exact norms
        sq = sum(_layer_sq(layer, c, n, "hooks")[0] for layer, c in active)
        bad = ~torch.isfinite(torch.as_tensor(sq))
        if not bool(bad.any()):
            raise RuntimeError("the clipped sum is not finite although every example's gradient is")
        return None, losses, bad
    return out, losses, torch.zeros(n, dtype=torch.bool, device=losses.device)


def _thresholds(layers: Sequence[LayerInfo], max_grad_norm: float, active: Sequence[LayerInfo]) -> list[float]:
    """Thresholds of the active layers, from the split over ALL layers (a fixed, public split)."""
    all_thr = dict(zip((id(layer) for layer in layers), layer_thresholds(layers, max_grad_norm)))
    return [all_thr[id(layer)] for layer in active]


def _gammas(n: int, count: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype) -> list[Tensor]:
    gen_device = generator.device if generator is not None else device
    u = 1.0 - torch.rand((count, n), generator=generator, device=gen_device, dtype=dtype).to(device)  # (0, 1]
    return list(u)


def _hooks(
    active: Sequence[tuple[LayerInfo, Sequence[Call]]],
    n: int,
    clipping: str,
    max_grad_norm: float,
    layers: Sequence[LayerInfo],
    sparsity: float,
    generator: torch.Generator | None,
) -> dict[nn.Parameter, Tensor]:
    """Reference: materialise all per-example gradients, clip them, sum them."""
    if not active:
        return {}
    grads = []
    for layer, c in active:
        g = materialise(layer.module, c)
        grads.append([g[p] for p in layer.params])
    act = [layer for layer, _ in active]
    if clipping == "flat":
        clipped = clip_flat(grads, max_grad_norm)
    elif clipping == "per_layer":
        clipped = clip_per_layer(grads, _thresholds(layers, max_grad_norm, act))
    elif clipping == "per_unit":
        clipped = clip_per_unit(grads, _thresholds(layers, max_grad_norm, act))
    elif clipping == "sparsify":
        dtype = grads[0][0].dtype
        gammas = _gammas(n, len(act), generator, grads[0][0].device, dtype)
        clipped = clip_sparsify(grads, _thresholds(layers, max_grad_norm, act), sparsity, [l.complexity for l in act], gammas)
    else:
        raise ValueError(f"unknown clipping strategy {clipping!r}")
    return {p: g.sum(0) for layer, cl in zip(act, clipped) for p, g in zip(layer.params, cl)}


def _compare(
    params: Sequence[nn.Parameter],
    unclipped: dict[nn.Parameter, Tensor],
    batch_grads: Sequence[Tensor | None],
    layers: Sequence[LayerInfo],
) -> None:
    names = {p: f"{layer.name}.{k}" for layer in layers for k, p in layer.module.named_parameters(recurse=False)}
    for p, ref in zip(params, batch_grads):
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
