"""Masked autoregressive flow (Papamakarios et al. 2017) as DP-NF uses it (Waites & Cummings
2021, Sec. 4 "Model Architecture"): blocks of [ActNorm, MADE affine transform, reversal]. The
first block's ActNorm is the one initialised from DP statistics (App. B.1).
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from privflow.models.base import TabularFlow
from privflow.models.layers import ActNorm
from privflow.models.made import MADE, IncrementalMADE


class MaskedAffineAutoregressive(nn.Module):
    """z_i = (x_i - mu_i(x_<i)) * exp(-alpha_i(x_<i)), log|dz/dx| = -sum_i alpha_i.

    alpha is soft-bounded, alpha = b tanh(raw / b), so that noisy DP updates cannot blow up
    the scales; zero raw outputs (the MADE's zero-initialised last layer) give the identity.
    """

    def __init__(self, d: int, hidden: int, hidden_layers: int = 2, scale_bound: float = 5.0) -> None:
        super().__init__()
        self.d = d
        self.scale_bound = scale_bound
        self.made = MADE(d, hidden, 2, hidden_layers=hidden_layers)

    def _params(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out = self.made(x)
        return out[..., 0], self._log_scale(out[..., 1])

    def _log_scale(self, raw: Tensor) -> Tensor:
        """alpha = b tanh(raw / b): soft-bounded, so noisy DP updates cannot blow up the scales."""
        return self.scale_bound * torch.tanh(raw / self.scale_bound)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        mu, alpha = self._params(x)
        return (x - mu) * torch.exp(-alpha), -alpha.sum(1)

    def inverse(self, z: Tensor) -> Tensor:
        """Sequential inversion: d passes of the MADE, dimension i fixed at pass i."""
        if not torch.is_grad_enabled():
            return self._sample_inverse(z)
        x = torch.zeros_like(z)
        for i in range(self.d):
            mu, alpha = self._params(x)
            x = x.clone()
            x[:, i] = z[:, i] * torch.exp(alpha[:, i]) + mu[:, i]  # MADE output i sees x_<i only
        return x

    def _sample_inverse(self, z: Tensor) -> Tensor:
        """``inverse`` for sampling, features first: the MADE inverted incrementally (each hidden
        unit once, ``IncrementalMADE``) instead of d full passes; the same formulas."""
        made = IncrementalMADE(self.made)
        params = torch.empty(2, z.shape[0], dtype=z.dtype, device=z.device)
        mu, raw = params.unbind()  # each pass writes the MADE's two outputs here
        x_a = made.start(z.shape[0], z, params)
        for i, (z_i, x_i) in enumerate(zip(z.T.contiguous().unbind(), x_a[1:].unbind(), strict=True)):
            made.step(i)
            torch.addcmul(mu, z_i, torch.exp(self._log_scale(raw)), out=x_i)
        return x_a[1:].T


class MAF(TabularFlow):
    """DP-NF's backbone: ``blocks`` x [ActNorm, masked affine autoregressive, reverse]."""

    def __init__(
        self,
        cardinalities: list[int | None],
        blocks: int = 4,
        hidden: int = 64,
        hidden_layers: int = 2,
        dequantization: Literal["uniform", "variational"] = "uniform",
        prior: Literal["normal", "mog"] = "normal",
        mog_components: int = 5,
        logit_alpha: float = 0.01,
        deq_components: int = 4,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            cardinalities,
            hidden=hidden,
            dequantization=dequantization,
            prior=prior,
            mog_components=mog_components,
            logit_alpha=logit_alpha,
            deq_components=deq_components,
            config=config,
        )
        self.actnorms = nn.ModuleList(ActNorm(self.d) for _ in range(blocks))
        self.transforms = nn.ModuleList(
            MaskedAffineAutoregressive(self.d, hidden, hidden_layers) for _ in range(blocks)
        )

    def first_actnorm(self) -> ActNorm:
        return cast(ActNorm, self.actnorms[0])

    def base_permutation(self) -> list[int]:
        perm = list(range(self.d))
        for _ in self.transforms:
            perm = perm[::-1]
        return perm

    def body_forward(self, y: Tensor) -> tuple[Tensor, Tensor]:
        logdet = torch.zeros(y.shape[0], dtype=y.dtype, device=y.device)
        h = y
        for act, tr in zip(self.actnorms, self.transforms, strict=False):
            h, ld_a = act(h)
            h, ld_t = tr(h)
            h = h.flip(1)
            logdet = logdet + ld_a + ld_t
        return h, logdet

    def body_inverse(self, z: Tensor) -> Tensor:
        h = z
        for act, tr in zip(reversed(self.actnorms), reversed(self.transforms), strict=False):
            h = cast(ActNorm, act).inverse(cast(MaskedAffineAutoregressive, tr).inverse(h.flip(1)))
        return h
