"""DP-HFlow (Lee et al. 2022): heterogeneous flow for tabular data.

dequantization -> fixed logit map -> ActNorm (DP-initialised, DP-NF App. B.1) -> ``blocks`` x
[linear flow (LU, eq. 2; low-rank, eq. 1; or none), conditional autoregressive
rational-quadratic spline, reverse permutation]. One MADE NN_nu is shared by all blocks and
conditioned on a learned embedding q(j) of the block index ("Conditional Spline Flow":
theta^j = NN_nu(x, q(j))), which cuts the parameter count by a factor ~ blocks.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from privflow.models.base import TabularFlow
from privflow.models.layers import ActNorm, BlockEmbedding, LowRankLinear, LULinear
from privflow.models.made import MADE, IncrementalMADE
from privflow.models.spline import SplineInverseTable, rational_quadratic_spline, spline_params_per_feature

# Rows per pass of the sampling inverse: its buffers (two hidden layers, the spline table: ~0.8 KB a
# row for the default model) stay in cache better. Chosen by timing chunk sizes on one thread:
# larger chunks fall out of cache, and in smaller ones each pass's fixed cost dominates.
SAMPLE_CHUNK = 8192


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
        """Sequential inversion: d passes of the MADE, dimension i fixed at pass i (without
        autograd: incrementally, ``SplineSampler``)."""
        if torch.is_grad_enabled():  # keep the plain form where gradients are needed (tests, autograd)
            context = self._context(block, z[:1]).expand(z.shape[0], -1)  # the same for every example
            x = torch.zeros_like(z)
            for i in range(self.d):
                p = self.made(x, context)[:, i]
                out, _ = self._spline(z[:, i], p, inverse=True)
                x = x.clone()
                x[:, i] = out
            return x
        return SplineSampler(self, z.shape[0], z).invert(z.T.contiguous(), block)[1:].T


class SplineSampler:
    """The spline's inverse for sampling n examples, transposed (features first, examples last).

    The shared MADE is inverted incrementally (``IncrementalMADE``: each hidden unit computed
    once per block) and writes each pass's raw spline parameters straight into the table that
    ``SplineInverseTable`` inverts from; the buffers are allocated once and reused by every pass
    of every block. Built from the current weights.
    """

    def __init__(self, spline: ConditionalSplineAutoregressive, n: int, like: Tensor) -> None:
        self.d = spline.d
        self.table = SplineInverseTable(spline.bins, n, like, bound=spline.bound)
        self.made = IncrementalMADE(spline.made, spline.embedding.weight.to(like), self.table.raw_rows())
        self.x_a = self.made.start(n, like, self.table.raw)
        self.x_rows = list(self.x_a[1:].unbind())

    def invert(self, z_t: Tensor, block: int) -> Tensor:
        """z_t [d, n] -> x_a [1 + d, n]: row 0 ones, rows 1 .. d the inverse (a buffer the next
        call overwrites)."""
        for i, (z_i, x_i) in enumerate(zip(z_t.unbind(), self.x_rows, strict=True)):
            self.made.step(i, context=block)
            self.table(z_i, out=x_i)
        return self.x_a


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
                perm = perm[cast(LULinear, self.linears[j]).perm.cpu()]
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
        if not torch.is_grad_enabled():
            return self._sample_inverse(z)
        h = z
        for j in reversed(range(self.blocks)):
            h = self.spline.inverse(h.flip(1), j)
            if self.linears is not None:
                h = cast("LULinear | LowRankLinear", self.linears[j]).inverse(h)  # nn.ModuleList gives nn.Module
        return self.actnorm.inverse(h)

    def _after_spline_inverse(self, j: int, like: Tensor) -> Tensor:
        """M [d, 1 + d] with M @ [1; x] = what block j's inverse does after its spline: the linear
        flow's inverse, then the reversal (j > 0) or the first ActNorm's inverse (j = 0). All of it
        is affine, so M is read off the map at 0 and at the unit vectors."""
        probe = torch.cat([torch.zeros(1, self.d, dtype=like.dtype, device=like.device), torch.eye(self.d).to(like)])
        h = cast("LULinear | LowRankLinear", self.linears[j]).inverse(probe) if self.linears is not None else probe
        h = self.actnorm.inverse(h) if j == 0 else h.flip(1)
        return torch.cat([h[:1].T, (h[1:] - h[:1]).T], dim=1)

    def _sample_inverse(self, z: Tensor) -> Tensor:
        """``body_inverse`` for sampling, features first, in chunks of at most ``SAMPLE_CHUNK``
        rows: each block is the spline's incremental inverse (``SplineSampler``), then one product
        for the linear flow, the reversal and, last, the ActNorm."""
        maps = [self._after_spline_inverse(j, z) for j in range(self.blocks)]
        samplers: dict[int, SplineSampler] = {}
        parts = []
        for chunk in z.split(SAMPLE_CHUNK):
            n = chunk.shape[0]
            sampler = samplers[n] = samplers.get(n) or SplineSampler(self.spline, n, z)
            u = chunk.flip(1).T.contiguous()
            for j in reversed(range(self.blocks)):
                torch.mm(maps[j], sampler.invert(u, j), out=u)
            parts.append(u)
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).T
