"""Shared helpers for the model tests: float64, one thread, autograd Jacobian references."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

torch.set_num_threads(1)


def jacobian_logdets(f: Callable[[Tensor], tuple[Tensor, Tensor]], x: Tensor) -> Tensor:
    """log|det J_f(x_i)| per example, from torch.autograd.functional.jacobian (the reference)."""
    out = []
    for xi in x:
        jac = torch.autograd.functional.jacobian(lambda v: f(v[None])[0][0], xi)
        out.append(torch.linalg.slogdet(jac)[1])
    return torch.stack(out)


def perturb(module: torch.nn.Module, std: float = 0.3, seed: int = 0) -> None:
    """Move every parameter off its (identity) initialisation so the checks are not trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p) * std)


@pytest.fixture(autouse=True)
def _float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
