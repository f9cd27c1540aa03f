"""Helpers shared by the per-layer grad samplers.

Convention for ``backprops`` (what a grad sampler receives besides the activations):
opacus' hooks pass only the gradient of a module's *first* output. The flow layers return
``(z, logdet[n])`` and the log-determinant also depends on their parameters, so our
recorder (``privacy.grad_samplers.tape``) passes the tuple ``(dL/dz, dL/dlogdet)``. A plain
tensor is accepted too and then means ``dL/dlogdet = 0`` (what opacus' own hooks would give;
that is exact only when the log-determinant does not reach the loss).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


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


def as_float(x: Tensor, like: Tensor) -> Tensor:
    return x.to(like.dtype) if x.dtype != like.dtype else x


def zeros_like_param(p: Tensor, n: int) -> Tensor:
    return torch.zeros((n,) + tuple(p.shape), dtype=p.dtype, device=p.device)


def accepts_tuple(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a grad sampler that understands ``(dL/dz, dL/dlogdet)`` backprops."""
    fn._pf_accepts_tuple = True  # type: ignore[attr-defined]
    return fn
