"""Record every call of every parameter-owning layer in one forward, then its output gradients.

This is opacus' hooks mode (forward hook stores the inputs of each call; one grad sampler
per layer type turns inputs and output gradients into per-example gradients, summed over
the calls of a layer used several times) with three changes the flows need:

* every tensor output is kept, so the ``(z, logdet)`` layers get ``dL/dlogdet`` as well
  (opacus passes only the first output's gradient and would drop the log-determinant term);
* non-tensor inputs are kept as they are (``BlockEmbedding(index: int, n: int)``);
* output gradients come from one ``torch.autograd.grad`` call on the recorded outputs, so
  autograd never forms the (unclipped) parameter gradients it would otherwise accumulate.

Per-example gradients then come from opacus' GRAD_SAMPLERS registry (ours are registered
there by ``privacy.dpsgd.grad_samplers``); a layer without one falls back to torch.func
(vmap of a vector-Jacobian product over the examples), as opacus' functorch mode does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from opacus.grad_sample import GradSampleHooks
from torch import Tensor, nn

from privflow.privacy.dpsgd.grad_samplers.registry import Call


def param_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules that directly own at least one trainable parameter, in registration order."""
    out = []
    for name, m in model.named_modules():
        if any(p.requires_grad for p in m.parameters(recurse=False)):
            out.append((name, m))
    return out


def _detach(v: Any) -> Any:
    return v.detach() if isinstance(v, Tensor) else v


class Tape:
    """Context manager: ``with Tape(layers) as tape: loss = f(x); tape.backward(loss)``."""

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        self.layers = list(layers)
        self.calls: dict[nn.Module, list[Call]] = {m: [] for m in self.layers}
        self._outputs: list[tuple[Call, int, Tensor, int]] = []  # (call, position, tensor, n_outputs)
        self._handles: list[Any] = []
        self.enabled = True

    def __enter__(self) -> Tape:
        for m in self.layers:
            self._handles.append(m.register_forward_hook(self._hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self.enabled or not torch.is_grad_enabled():
            return
        outs = output if isinstance(output, (tuple, list)) else (output,)
        call = Call([_detach(a) for a in args], {k: _detach(v) for k, v in kwargs.items()})
        tensors = [(i, t) for i, t in enumerate(outs) if isinstance(t, Tensor)]
        if not any(t.requires_grad for _, t in tensors):
            return
        self.calls[module].append(call)
        call.backprops = [None] * len(outs) if isinstance(output, (tuple, list)) else None
        for i, t in tensors:
            self._outputs.append((call, i, t, len(outs) if isinstance(output, (tuple, list)) else 0))

    def backward(self, loss: Tensor, extra: Sequence[Tensor] = ()) -> list[Tensor | None]:
        """Fill each call's output gradients of ``loss`` (a scalar: the SUM of per-example losses).

        ``extra`` tensors (e.g. parameters, for a consistency check) get their gradients
        returned from the same backward pass.
        """
        live = [(c, i, t, k) for c, i, t, k in self._outputs if t.requires_grad]
        targets = [t for _, _, t, _ in live] + list(extra)
        grads = torch.autograd.grad(loss, targets, allow_unused=True) if targets else ()
        for (call, i, t, k), g in zip(live, grads, strict=False):
            g = torch.zeros_like(t) if g is None else g
            if k == 0:
                call.backprops = g
            else:
                call.backprops[i] = g
        for calls in self.calls.values():
            for call in calls:
                if isinstance(call.backprops, list):
                    call.backprops = tuple(call.backprops)
        self._outputs.clear()
        return list(grads[len(live) :])


def slice_call(call: Call, sl: slice, n: int) -> Call:
    """The same call restricted to examples ``sl`` (tensors whose first dim is n are sliced)."""

    def cut(v: Any) -> Any:
        return v[sl] if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == n else v

    bp = call.backprops
    bp = tuple(cut(b) for b in bp) if isinstance(bp, tuple) else cut(bp)
    return Call([cut(a) for a in call.activations], {k: cut(v) for k, v in call.kwargs.items()}, bp)


def batch_size(calls: Sequence[Call]) -> int:
    bp = calls[0].backprops
    first = next(b for b in (bp if isinstance(bp, tuple) else (bp,)) if isinstance(b, Tensor))
    return int(first.shape[0])


def _functorch_grad_sample(layer: nn.Module, call: Call) -> dict[nn.Parameter, Tensor]:
    """Per-example vector-Jacobian products by torch.func, for layers without a grad sampler."""
    from torch.func import functional_call, grad, vmap

    names = [k for k, p in layer.named_parameters(recurse=False) if p.requires_grad]
    params = {k: getattr(layer, k).detach() for k in names}
    bp = call.backprops if isinstance(call.backprops, tuple) else (call.backprops,)
    n = batch_size([call])
    args = call.activations
    batched = [isinstance(a, Tensor) and a.dim() > 0 and a.shape[0] == n for a in args]

    def one(p: dict[str, Tensor], xs: list[Any], gs: tuple[Any, ...]) -> Tensor:
        full = [x.unsqueeze(0) if b else x for x, b in zip(xs, batched, strict=False)]
        out = functional_call(layer, p, tuple(full), call.kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        total = torch.zeros((), dtype=next(iter(p.values())).dtype, device=next(iter(p.values())).device)
        for o, g in zip(outs, gs, strict=False):
            if isinstance(o, Tensor) and isinstance(g, Tensor):
                total = total + (o.squeeze(0) * g).sum()
        return total

    in_dims = (None, [0 if b else None for b in batched], tuple(0 if isinstance(g, Tensor) else None for g in bp))
    per = vmap(grad(one), in_dims=in_dims)(params, list(args), bp)
    return {getattr(layer, k): per[k] for k in names}


def grad_sample(layer: nn.Module, call: Call) -> dict[nn.Parameter, Tensor]:
    """Per-example gradients of one call: the registered opacus grad sampler, else torch.func."""
    fn = GradSampleHooks.GRAD_SAMPLERS.get(type(layer))
    if fn is None:
        return _functorch_grad_sample(layer, call)
    bp = call.backprops
    if isinstance(bp, tuple) and not getattr(fn, "_pf_accepts_tuple", False):
        bp = bp[0]  # a foreign sampler (e.g. opacus' nn.Linear one) sees the first output only
    return fn(layer, call.activations, bp)


def materialise(layer: nn.Module, calls: Sequence[Call], sl: slice | None = None) -> dict[nn.Parameter, Tensor]:
    """Per-example gradients [c, *shape] of every trainable parameter, summed over all calls."""
    n = batch_size(calls)
    total: dict[nn.Parameter, Tensor] = {}
    for call in calls:
        part = grad_sample(layer, slice_call(call, sl, n) if sl is not None else call)
        for p, g in part.items():
            total[p] = total[p] + g if p in total else g
    return total
