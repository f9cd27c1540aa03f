"""Base distributions of the flows: standard normal, and a diagonal mixture of Gaussians.

The mixture is DP-NF's data-dependent prior (Waites & Cummings 2021, App. B.2): its weights,
means and standard deviations come from DP-EM (privacy/) and are set, never trained. They are
non-trainable tensors held as buffers of this parameter-free module, so they travel in the
``state_dict`` (a rebuilt model loads them back); opacus only rejects buffers in modules that
own trainable parameters, which this one does not.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

_LOG_2PI = math.log(2.0 * math.pi)


class StandardNormal(nn.Module):
    """N(0, I_d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def log_prob(self, z: Tensor) -> Tensor:
        return -0.5 * (z.pow(2).sum(1) + self.d * _LOG_2PI)

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> Tensor:
        return torch.randn(n, self.d, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)


class MixtureOfGaussians(nn.Module):
    """sum_k w_k N(mu_k, diag(sigma_k^2)); starts as K copies of N(0, I) until ``set``."""

    weights: Tensor
    means: Tensor
    stds: Tensor

    def __init__(self, d: int, components: int) -> None:
        super().__init__()
        self.d = d
        self.components = components
        self.register_buffer("weights", torch.full((components,), 1.0 / components))
        self.register_buffer("means", torch.zeros(components, d))
        self.register_buffer("stds", torch.ones(components, d))

    @torch.no_grad()
    def set(self, weights: Tensor, means: Tensor, stds: Tensor, min_std: float = 1e-3) -> None:
        """Install mixture parameters (weights renormalised to sum 1, stds floored)."""
        k = weights.shape[0]
        if means.shape != (k, self.d) or stds.shape != (k, self.d):
            raise ValueError(
                f"expected means/stds of shape ({k}, {self.d}), got {tuple(means.shape)}, {tuple(stds.shape)}"
            )
        w = weights.to(self.weights).clamp_min(0.0)
        if not float(w.sum()) > 0.0:
            raise ValueError("mixture weights must have a positive sum")
        self.components = k
        self.weights = w / w.sum()
        self.means = means.to(self.means).clone()
        self.stds = stds.to(self.stds).clamp_min(min_std).clone()

    def log_prob(self, z: Tensor) -> Tensor:
        diff = (z[:, None, :] - self.means) / self.stds  # [n, K, d]
        comp = -0.5 * (diff.pow(2) + _LOG_2PI).sum(-1) - torch.log(self.stds).sum(-1)
        return torch.logsumexp(comp + torch.log(self.weights), dim=1)

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> Tensor:
        k = torch.multinomial(self.weights.cpu().double(), n, replacement=True, generator=generator)
        eps = torch.randn(n, self.d, generator=generator, dtype=torch.float64)
        z = self.means.cpu().double()[k] + self.stds.cpu().double()[k] * eps
        return z.to(dtype=dtype, device=device)

    def _load_from_state_dict(
        self,
        state_dict,
        prefix,
        local_metadata,
        strict,
        missing_keys,  # type: ignore[override]
        unexpected_keys,
        error_msgs,
    ) -> None:
        """Accept a saved mixture with a different number of components (resize before copying)."""
        key = prefix + "weights"
        if key in state_dict and state_dict[key].shape[0] != self.weights.shape[0]:
            k = state_dict[key].shape[0]
            self.components = k
            self.weights = torch.empty(k, dtype=self.weights.dtype, device=self.weights.device)
            self.means = torch.empty(k, self.d, dtype=self.means.dtype, device=self.means.device)
            self.stds = torch.empty(k, self.d, dtype=self.stds.dtype, device=self.stds.device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
