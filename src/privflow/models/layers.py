"""Custom layers of the flows, written so that opacus and our own grad samplers accept them.

None of these modules registers a buffer (opacus rejects trainable modules that own buffers):
masks and permutations are plain tensor attributes, deterministic from the constructor
arguments (so a freshly built model matches a saved ``state_dict``), and ``_apply`` is
overridden so that ``.to(device/dtype)`` moves them with the parameters.

Each bijective layer has ``forward(x) -> (z, logdet[n])`` (data -> noise direction) and
``inverse(z) -> x``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn


class PlainTensors(nn.Module):
    """Mixin: plain (non-buffer, non-parameter) tensor attributes that follow ``.to()``."""

    _plain: tuple[str, ...] = ()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> nn.Module:  # type: ignore[override]
        super()._apply(fn, recurse)
        for name in self._plain:
            value = getattr(self, name)
            if isinstance(value, Tensor):
                moved = fn(value)
                # opacus' functorch fallback deep-copies the layer and moves it to "meta", then
                # calls it with real parameters: keep the constants real in that case.
                if moved.device.type != "meta":
                    object.__setattr__(self, name, moved)
        return self


class MaskedLinear(PlainTensors):
    """Linear layer with a fixed binary connectivity mask (MADE, Germain et al. 2015).

    y = x @ (weight * mask).T + bias; ``mask[out, in]`` is a plain attribute. Per-example
    gradients: grad_weight_i = (g_i outer x_i) * mask, grad_bias_i = g_i.
    """

    _plain = ("mask",)
    mask: Tensor  # [out, in], set in __init__ as a plain attribute (not a buffer)

    def __init__(self, in_features: int, out_features: int, mask: Tensor) -> None:
        super().__init__()
        if tuple(mask.shape) != (out_features, in_features):
            raise ValueError(f"mask shape {tuple(mask.shape)} != ({out_features}, {in_features})")
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        object.__setattr__(self, "mask", mask.detach().clone().to(self.weight.dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Same scheme as nn.Linear, with fan-in counted over the unmasked inputs."""
        fan_in = max(1, int(self.mask.sum(1).max().item())) if self.mask.numel() else 1
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        mask = self.mask.to(device=self.weight.device, dtype=self.weight.dtype)
        return nn.functional.linear(x, self.weight * mask, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class ActNorm(nn.Module):
    """Activation normalisation (Kingma & Dhariwal 2018): z = (x - loc) * exp(-log_scale).

    DP-NF (Waites & Cummings 2021, App. B.1) initialises the first one from DP estimates of
    the per-feature mean and standard deviation (``initialize``); never from raw data here.
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(d))
        self.log_scale = nn.Parameter(torch.zeros(d))

    @torch.no_grad()
    def initialize(self, mean: Tensor, std: Tensor, min_std: float = 1e-3) -> None:
        """Set loc = mean, scale = std (both already differentially private)."""
        self.loc.copy_(mean.to(self.loc))
        self.log_scale.copy_(torch.log(std.to(self.log_scale).clamp_min(min_std)))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = (x - self.loc) * torch.exp(-self.log_scale)
        logdet = (-self.log_scale.sum()).expand(x.shape[0])
        return z, logdet

    def inverse(self, z: Tensor) -> Tensor:
        return z * torch.exp(self.log_scale) + self.loc


class LULinear(PlainTensors):
    """Invertible linear map z = P L U x + b (DP-HFlow eq. 2; Kingma & Dhariwal 2018).

    L = I + strict_lower(lower), U = strict_upper(upper) + diag(exp(log_diag)), and P a
    permutation fixed from ``seed``: (P v)[i] = v[perm[i]]. log|det W| = sum(log_diag).
    Per-example gradients (eq. 3): dL/dL = P^T g (U x)^T, dL/dU = L^T P^T g x^T.
    """

    _plain = ("perm", "inv_perm")
    perm: Tensor  # [d], set in __init__ as plain attributes (not buffers)
    inv_perm: Tensor

    def __init__(self, d: int, seed: int = 0) -> None:
        super().__init__()
        self.d = d
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(d, generator=gen)
        object.__setattr__(self, "perm", perm)
        object.__setattr__(self, "inv_perm", torch.argsort(perm))
        # Identity-like start (nflows' LULinear identity_init): W = P, so only the mixing is learned.
        self.lower = nn.Parameter(torch.zeros(d, d))
        self.upper = nn.Parameter(torch.zeros(d, d))
        self.log_diag = nn.Parameter(torch.zeros(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def lower_matrix(self) -> Tensor:
        """L: unit lower triangular."""
        eye = torch.eye(self.d, dtype=self.lower.dtype, device=self.lower.device)
        return torch.tril(self.lower, -1) + eye

    def upper_matrix(self) -> Tensor:
        """U: strict upper part of ``upper`` plus diag(exp(log_diag))."""
        return torch.triu(self.upper, 1) + torch.diag(torch.exp(self.log_diag))

    def weight(self) -> Tensor:
        """W = P L U as a dense matrix."""
        return (self.lower_matrix() @ self.upper_matrix())[self.perm]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        ux = x @ self.upper_matrix().T
        lux = ux @ self.lower_matrix().T
        z = lux[:, self.perm.to(x.device)] + self.bias
        logdet = self.log_diag.sum().expand(x.shape[0])
        return z, logdet

    def inverse(self, z: Tensor) -> Tensor:
        y = (z - self.bias)[:, self.inv_perm.to(z.device)]  # P^{-1}(z - b) = L U x
        # Solve L v = y, then U x = v (columns are examples).
        v = torch.linalg.solve_triangular(self.lower_matrix(), y.T, upper=False, unitriangular=True)
        x = torch.linalg.solve_triangular(self.upper_matrix(), v, upper=True)
        return x.T


class LowRankLinear(nn.Module):
    """z = (diag(exp(log_s)) + A B) x + b (DP-HFlow eq. 1; Lu & Huang 2020).

    log|det W| = sum(log_s) + log|det(I_r + B diag(exp(-log_s)) A)| by the matrix determinant
    lemma; closed form for r = 1 (footnote 1). Inverse by the Woodbury identity.
    Per-example gradients (eq. 4): dL/dA = g (B x)^T, dL/dB = A^T g x^T, dL/ds = g * x.
    """

    def __init__(self, d: int, rank: int = 1, seed: int = 0) -> None:
        super().__init__()
        self.d = d
        self.rank = rank
        gen = torch.Generator().manual_seed(seed)
        # Start at W = I exactly (A = 0); B random so that dL/dA = g (B x)^T is non-zero.
        self.log_s = nn.Parameter(torch.zeros(d))
        self.A = nn.Parameter(torch.zeros(d, rank))
        self.B = nn.Parameter(torch.randn(rank, d, generator=gen) / math.sqrt(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def _capacitance(self) -> Tensor:
        """I_r + B diag(1/s) A."""
        eye = torch.eye(self.rank, dtype=self.A.dtype, device=self.A.device)
        return eye + (self.B * torch.exp(-self.log_s)) @ self.A

    def weight(self) -> Tensor:
        """W = diag(s) + A B as a dense matrix."""
        return torch.diag(torch.exp(self.log_s)) + self.A @ self.B

    def log_abs_det(self) -> Tensor:
        if self.rank == 1:
            c = 1.0 + (self.B[0] * torch.exp(-self.log_s) * self.A[:, 0]).sum()
            return self.log_s.sum() + torch.log(torch.abs(c))
        return self.log_s.sum() + torch.linalg.slogdet(self._capacitance())[1]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        bx = x @ self.B.T
        z = x * torch.exp(self.log_s) + bx @ self.A.T + self.bias
        return z, self.log_abs_det().expand(x.shape[0])

    def inverse(self, z: Tensor) -> Tensor:
        y = (z - self.bias) * torch.exp(-self.log_s)  # S^{-1} (z - b)
        t = torch.linalg.solve(self._capacitance(), (y @ self.B.T).T).T  # C^{-1} B S^{-1} y
        return y - (t @ self.A.T) * torch.exp(-self.log_s)


class BlockEmbedding(nn.Module):
    """Learned embedding q(j) of the block index (DP-HFlow, Conditional Spline Flow).

    Two call forms: ``forward(index: int, n: int)`` (contract form) returns weight[index]
    repeated n times; ``forward(index: LongTensor[n])`` returns weight[index] row-wise. The
    tensor form is what DPHFlow uses, so that opacus' activation hooks (which ``detach`` every
    forward input) see a tensor: per-example grad_i = one_hot(index_i) outer g_i.
    """

    def __init__(self, blocks: int, dim: int) -> None:
        super().__init__()
        self.blocks = blocks
        self.dim = dim
        self.weight = nn.Parameter(torch.randn(blocks, dim))

    def forward(self, index: int | Tensor, n: int | None = None) -> Tensor:
        if isinstance(index, Tensor) and index.dim() == 1:
            return self.weight[index]
        if n is None:
            raise ValueError("BlockEmbedding(index: int, n: int) needs n")
        return self.weight[int(index)].unsqueeze(0).expand(int(n), self.dim)
