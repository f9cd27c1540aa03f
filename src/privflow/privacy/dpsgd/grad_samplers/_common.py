"""Helpers shared by the per-layer grad samplers.

Convention for ``backprops`` (what a grad sampler receives besides the activations):
opacus' hooks pass only the gradient of a module's *first* output. The flow layers return
``(z, logdet[n])`` and the log-determinant also depends on their parameters, so our
recorder (``privacy.dpsgd.grad_samplers.tape``) passes the tuple ``(dL/dz, dL/dlogdet)``. A plain
tensor is accepted too and then means ``dL/dlogdet = 0`` (what opacus' own hooks would give;
that is exact only when the log-determinant does not reach the loss).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

V = TypeVar("V")

ACCELERATOR_CHUNK_ELEMENTS = 1 << 25  # per-example gradient entries per chunk off the CPU: 128 MB
# in float32, a few such temporaries at once. There a chunk costs kernel launches, not cache misses:
# the CPU's cache-sized chunks (2^20-2^21 entries) split the shared MADE's entries into dozens of
# chunks at a large batch, and the sparsified step then cost several times the non-private one on
# a GPU (benchmarks/results/dp_step_cuda_4096_a7975ba.md, before this constant)


def examples_per_chunk(device: torch.device, entries: int, on_cpu: int) -> int:
    """How many examples' per-example gradients (``entries`` each) to materialise at a time:
    ``on_cpu`` entries in all on the CPU (sized for its cache), ``ACCELERATOR_CHUNK_ELEMENTS``
    on a GPU, where fewer, larger chunks launch fewer kernels; at least one example."""
    budget = on_cpu if device.type == "cpu" else ACCELERATOR_CHUNK_ELEMENTS
    return max(1, budget // max(1, entries))


class StepMemo(Generic[V]):
    """Per-layer memo of a value computed from one step's recorded tensors: a step asks for the
    same stacks for the norms and again for the clipped sum. Keyed by the identity of those
    tensors, which the memo holds (so an identity cannot be reused while it is kept)."""

    def __init__(self) -> None:
        self._memo: weakref.WeakKeyDictionary[Any, tuple[list[Tensor], V]] = weakref.WeakKeyDictionary()

    def get(self, layer: Any, key: list[Tensor], compute: Callable[[], V]) -> V:
        hit = self._memo.get(layer)
        if hit is not None and len(hit[0]) == len(key) and all(a is b for a, b in zip(hit[0], key, strict=True)):
            return hit[1]
        value = compute()
        self._memo[layer] = (key, value)
        return value


def step_key(calls: Sequence[Any]) -> list[Tensor]:
    """The recorded tensors of one step's calls (inputs and output gradients): what a
    ``StepMemo`` is keyed by."""
    out: list[Tensor] = []
    for c in calls:
        out += [a for a in c.activations if isinstance(a, Tensor)]
        bp = c.backprops if isinstance(c.backprops, (tuple, list)) else (c.backprops,)
        out += [b for b in bp if isinstance(b, Tensor)]
    return out


def weighted(grads: dict[Any, Tensor], weights: dict[Any, Tensor]) -> dict[Any, Tensor]:
    """sum_i w_i grad_i of materialised per-example gradients [c, *shape], w [c] (per example)
    or [c, rows] (per example and row of the parameter's first axis)."""
    out = {}
    for p, g in grads.items():
        w = weights[p]
        if w.dim() == 1:
            out[p] = torch.einsum("n,n...->...", w.to(g.dtype), g)
        else:
            rows = w.shape[1]
            out[p] = (g.reshape(g.shape[0], rows, -1) * w[..., None]).sum(0).reshape(g.shape[1:])
    return out


def split_backprops(backprops: Any) -> tuple[Tensor, Tensor | None]:
    """Return (gradient w.r.t. the main output, gradient w.r.t. logdet or None)."""
    if isinstance(backprops, (tuple, list)):
        gz = backprops[0]
        gld = backprops[1] if len(backprops) > 1 else None
        return gz, gld
    return backprops, None


def logdet_term(gld: Tensor | None, n: int, like: Tensor) -> Tensor | None:
    """dL/dlogdet as a float column vector of length n (None when it does not reach the loss)."""
    if gld is None:
        return None
    return gld.reshape(n).to(like.dtype)


def accepts_tuple(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a grad sampler that understands ``(dL/dz, dL/dlogdet)`` backprops."""
    fn._pf_accepts_tuple = True  # type: ignore[attr-defined]
    return fn


def single_tensor_calls(calls: Sequence[Any]) -> bool:
    """Every call took one 2-D tensor input [n, in] and gave a 2-D output gradient [n, out],
    with the same n: the form the fast clipping ops of linear layers read."""
    sizes = set()
    for c in calls:
        if len(c.activations) != 1 or not isinstance(c.activations[0], Tensor) or c.kwargs:
            return False
        a = c.activations[0]
        g, _ = split_backprops(c.backprops)
        if a.dim() != 2 or g.dim() != 2 or a.shape[0] != g.shape[0]:
            return False
        sizes.add(a.shape[0])
    return len(sizes) == 1


@cache
def _pairs(j: int) -> tuple[Tensor, Tensor]:
    iu, iv = torch.triu_indices(j, j)
    return iu, iv


def call_pairs(j: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Pairs u <= v of J calls and their weights (1 on the diagonal, 2 off it): a Gram sum
    sum_{u,v} f(u, v) of a symmetric f is sum over these pairs of weight * f(u, v)."""
    iu, iv = _pairs(j)
    w = torch.where(iu == iv, 1.0, 2.0).to(device=device, dtype=dtype)
    return iu.to(device), iv.to(device), w


def row_view(g: Tensor) -> Tensor:
    """[n, *shape] -> [n, rows, rest]: the units of a parameter are the rows of its first axis."""
    if g.dim() == 1:
        return g.reshape(g.shape[0], 1, 1)
    if g.dim() == 2:
        return g.reshape(g.shape[0], g.shape[1], 1)
    return g.reshape(g.shape[0], g.shape[1], -1)


def row_stats(g: Tensor) -> tuple[Tensor, Tensor]:
    """Per-example, per-row (L1 norm, squared L2 norm), each [n, rows] (DP-HFlow per-unit clipping)."""
    r = row_view(g)
    return r.abs().sum(2), r.pow(2).sum(2)


def flat_select(v: Tensor, idx: Tensor | None) -> Tensor:
    """Per-example gradients [n, *shape] as [n, numel], restricted to flat indices ``idx`` (None: all)."""
    flat = v.reshape(v.shape[0], -1)
    return flat if idx is None else flat.index_select(1, idx)


def call_sum(ts: Sequence[Tensor]) -> Tensor:
    """The sum over a layer's calls of per-call tensors [n, ...] (the first itself for one call),
    accumulated in place (no stacked copy)."""
    if len(ts) == 1:
        return ts[0]
    out = ts[0] + ts[1]
    for t in ts[2:]:
        out.add_(t)
    return out
