"""DP-HFlow (Lee et al. 2022): heterogeneous flow for tabular data.

dequantization -> fixed logit map -> ActNorm (DP-initialised, DP-NF App. B.1) -> ``blocks`` x
[linear flow (LU, eq. 2; low-rank, eq. 1; or none), conditional autoregressive
rational-quadratic spline, reverse permutation]. One MADE NN_nu is shared by all blocks and
conditioned on a learned embedding q(j) of the block index ("Conditional Spline Flow":
theta^j = NN_nu(x, q(j))), which cuts the parameter count by a factor ~ blocks.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from privflow.models.base import TabularFlow
from privflow.models.layers import ActNorm, BlockEmbedding, LowRankLinear, LULinear
from privflow.models.made import MADE, IncrementalMADE
from privflow.models.spline import rational_quadratic_spline, rq_spline_inverse_t, spline_params_per_feature


class ConditionalSplineAutoregressive(nn.Module):
    """g_spl(x)_i = S_i(x_i; theta_i), theta = NN_nu(x, q(j)) with MADE masks (theta_i sees x_<i)."""

    def __init__(
        self,
        d: int,
        blocks: int,
        hidden: int,
        bins: int = 8,
        bound: float = 4.0,
        embed_dim: int = 8,
        hidden_layers: int = 2,
    ) -> None:
        super().__init__()
        self.d = d
        self.bins = bins
        self.bound = bound
        self.embedding = BlockEmbedding(blocks, embed_dim)
        self.made = MADE(
            d, hidden, spline_params_per_feature(bins), context_features=embed_dim, hidden_layers=hidden_layers
        )

    def _context(self, block: int, like: Tensor) -> Tensor:
        # Tensor-form call so opacus' activation hooks see a tensor (see BlockEmbedding).
        return self.embedding(torch.full((like.shape[0],), block, dtype=torch.long, device=like.device))

    def _spline(self, x: Tensor, p: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        k = self.bins
        return rational_quadratic_spline(
            x, p[..., :k], p[..., k : 2 * k], p[..., 2 * k :], inverse=inverse, bound=self.bound
        )

    def forward(self, x: Tensor, block: int) -> tuple[Tensor, Tensor]:
        z, ld = self._spline(x, self.made(x, self._context(block, x)), inverse=False)
        return z, ld.sum(1)

    def inverse(self, z: Tensor, block: int) -> Tensor:
        """Sequential inversion: d passes of the MADE, dimension i fixed at pass i."""
        context = self._context(block, z[:1])  # one row: the context is the same for every example
        if torch.is_grad_enabled():  # keep the plain form where gradients are needed (tests, autograd)
            x = torch.zeros_like(z)
            context = context.expand(z.shape[0], -1)
            for i in range(self.d):
                p = self.made(x, context)[:, i]
                out, _ = self._spline(z[:, i], p, inverse=True)
                x = x.clone()
                x[:, i] = out
            return x
        # Sampling: incremental MADE (each hidden unit computed once, models.made.IncrementalMADE)
        # Transposed layout (features first): every pass reads and writes contiguous rows.
        inc = IncrementalMADE(self.made, context)
        z_t = z.T.contiguous()
        x_t = torch.zeros_like(z_t)
        hs = inc.start(z.shape[0], z)
        k = self.bins
        for i in range(self.d):
            p = inc.step(i, x_t, hs)  # [3K - 1, n]: bins-first, for rq_spline_inverse_t
            x_t[i] = rq_spline_inverse_t(z_t[i], p[:k], p[k : 2 * k], p[2 * k :], bound=self.bound)
        return x_t.T


class DPHFlow(TabularFlow):
    """DP-HFlow body on top of ``TabularFlow``'s dequantization / logit map / prior."""

    def __init__(
        self,
        cardinalities: list[int | None],
        blocks: int = 4,
        hidden: int = 64,
        spline_bins: int = 8,
        spline_bound: float = 4.0,
        linear: Literal["lu", "lowrank", "none"] = "lu",
        rank: int = 1,
        embed_dim: int = 8,
        hidden_layers: int = 2,
        dequantization: Literal["uniform", "variational"] = "uniform",
        prior: Literal["normal", "mog"] = "normal",
        mog_components: int = 5,
        logit_alpha: float = 0.01,
        deq_components: int = 4,
        seed: int = 0,
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
        self.blocks = blocks
        self.actnorm = ActNorm(self.d)
        if linear == "lu":
            self.linears: nn.ModuleList | None = nn.ModuleList(LULinear(self.d, seed=seed + j) for j in range(blocks))
        elif linear == "lowrank":
            self.linears = nn.ModuleList(LowRankLinear(self.d, rank=rank, seed=seed + j) for j in range(blocks))
        elif linear == "none":
            self.linears = None
        else:
            raise ValueError(f"unknown linear flow '{linear}'")
        self.spline = ConditionalSplineAutoregressive(
            self.d, blocks, hidden, spline_bins, spline_bound, embed_dim, hidden_layers
        )

    def first_actnorm(self) -> ActNorm:
        return self.actnorm

    def base_permutation(self) -> list[int]:
        """LU starts at W = P (lower = upper = 0, log_diag = 0) and low-rank at W = I (A = 0)."""
        perm = torch.arange(self.d)
        for j in range(self.blocks):
            if self.linears is not None and isinstance(self.linears[j], LULinear):
                perm = perm[self.linears[j].perm.cpu()]
            perm = perm.flip(0)
        return perm.tolist()

    def body_forward(self, y: Tensor) -> tuple[Tensor, Tensor]:
        h, logdet = self.actnorm(y)
        for j in range(self.blocks):
            if self.linears is not None:
                h, ld = self.linears[j](h)
                logdet = logdet + ld
            h, ld = self.spline(h, j)
            logdet = logdet + ld
            h = h.flip(1)
        return h, logdet

    def body_inverse(self, z: Tensor) -> Tensor:
        h = z
        for j in reversed(range(self.blocks)):
            h = self.spline.inverse(h.flip(1), j)
            if self.linears is not None:
                h = self.linears[j].inverse(h)
        return self.actnorm.inverse(h)
