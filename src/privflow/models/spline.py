"""Monotonic rational-quadratic spline (Durkan et al. 2019, "Neural Spline Flows").

Elementwise bijection on [-B, B] with K bins, identity outside (linear tails, boundary
derivatives fixed to 1 so the map is C^1 at +-B). DP-HFlow, Architecture, "Autoregressive
Spline Transformation": S_k(x) = y_k + h_k [D_k xi^2 + d_k xi (1 - xi)] / [D_k + (d_{k+1} + d_k - 2 D_k) xi (1 - xi)].

Written without data-dependent indexing (``torch.where``/``gather`` only) so that it also runs
under ``torch.func.vmap`` for per-example gradients.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

DEFAULT_MIN_BIN_WIDTH = 1e-3
DEFAULT_MIN_BIN_HEIGHT = 1e-3
DEFAULT_MIN_DERIVATIVE = 1e-3
_LOG2E = 1.0 / math.log(2.0)  # e^v = 2^(v log2 e)


def _identity_shift(min_derivative: float) -> float:
    """c with min_derivative + softplus(0 + c) = 1, so zero raw parameters give the identity."""
    return math.log(math.expm1(1.0 - min_derivative))


def spline_params_per_feature(bins: int) -> int:
    """Number of raw parameters per dimension: K widths, K heights, K - 1 interior derivatives."""
    return 3 * bins - 1


def _knots(unnormalized: Tensor, bound: float, min_size: float) -> Tensor:
    """Knot positions [..., K+1] from -B to B: bin sizes are a softmax floored at min_size."""
    bins = unnormalized.shape[-1]
    if min_size * bins > 1.0:
        raise ValueError("minimal bin size too large for the number of bins")
    # softmax written out: torch.softmax over a short last axis (K ~ 8) is much slower on CPU. The
    # shift is detached (softmax does not depend on it), so gradients are those of softmax.
    e = torch.exp(unnormalized - unnormalized.detach().amax(dim=-1, keepdim=True))
    sizes = min_size + (1.0 - min_size * bins) * (e / e.sum(dim=-1, keepdim=True))
    cum = torch.cumsum(sizes, dim=-1)
    cum = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1], torch.ones_like(cum[..., :1])], dim=-1)
    return 2.0 * bound * cum - bound  # exactly -B and B at the ends


def _bin_index(locations: Tensor, x: Tensor) -> Tensor:
    """Index k of the bin with locations[k] <= x < locations[k+1], clamped to [0, K-1]."""
    bins = locations.shape[-1] - 1
    idx = torch.searchsorted(locations, x[..., None], right=True)[..., 0] - 1
    return idx.clamp(0, bins - 1)


def _pick(t: Tensor, idx: Tensor) -> Tensor:
    return torch.gather(t, -1, idx[..., None])[..., 0]


def rational_quadratic_spline(
    x: Tensor,
    unnormalized_widths: Tensor,
    unnormalized_heights: Tensor,
    unnormalized_derivatives: Tensor,
    inverse: bool = False,
    bound: float = 4.0,
    min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
    min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
    min_derivative: float = DEFAULT_MIN_DERIVATIVE,
) -> tuple[Tensor, Tensor]:
    """Apply the spline (or its inverse) elementwise; returns (outputs, log|dy/dx|) per element.

    Shapes: x [...], widths/heights [..., K], derivatives [..., K-1] (interior knots).
    All-zero raw parameters give exactly the identity. The inverse clamps its in-bin root and
    discriminant, so it never produces NaN for finite inputs.
    """
    inside = (x >= -bound) & (x <= bound)
    xc = x.clamp(-bound, bound)

    cumwidths = _knots(unnormalized_widths, bound, min_bin_width)
    cumheights = _knots(unnormalized_heights, bound, min_bin_height)
    idx = _bin_index(cumheights if inverse else cumwidths, xc)
    # Only the bin's own quantities are needed: gather first, then compute on [...] not [..., K].
    x_k, x_k1 = _pick(cumwidths, idx), _pick(cumwidths, idx + 1)
    y_k, y_k1 = _pick(cumheights, idx), _pick(cumheights, idx + 1)
    w_k, h_k = x_k1 - x_k, y_k1 - y_k
    # Raw derivatives padded with 0 at +-B: min_derivative + softplus(0 + shift) = 1 (linear tails).
    raw = F.pad(unnormalized_derivatives, (1, 1))
    shift = _identity_shift(min_derivative)
    d_k = min_derivative + F.softplus(_pick(raw, idx) + shift)
    d_k1 = min_derivative + F.softplus(_pick(raw, idx + 1) + shift)
    s_k = h_k / w_k  # Delta_k
    curv = d_k + d_k1 - 2.0 * s_k

    if not inverse:
        xi = ((xc - x_k) / w_k).clamp(0.0, 1.0)
        t = xi * (1.0 - xi)
        denom = s_k + curv * t
        y = y_k + h_k * (s_k * xi.pow(2) + d_k * t) / denom
        dnum = s_k.pow(2) * (d_k1 * xi.pow(2) + 2.0 * s_k * t + d_k * (1.0 - xi).pow(2))
        logdet = torch.log(dnum) - 2.0 * torch.log(denom)
    else:
        dy = xc - y_k
        a = h_k * (s_k - d_k) + dy * curv
        b = h_k * d_k - dy * curv
        c = -s_k * dy
        disc = (b.pow(2) - 4.0 * a * c).clamp_min(0.0)
        xi = (2.0 * c / (-b - torch.sqrt(disc))).clamp(0.0, 1.0)
        y = xi * w_k + x_k
        t = xi * (1.0 - xi)
        denom = s_k + curv * t
        dnum = s_k.pow(2) * (d_k1 * xi.pow(2) + 2.0 * s_k * t + d_k * (1.0 - xi).pow(2))
        logdet = -(torch.log(dnum) - 2.0 * torch.log(denom))

    out = torch.where(inside, y, x)
    logdet = logdet.masked_fill(~inside, 0.0)
    return out, logdet


class SplineInverseTable:
    """The inverse of ``rational_quadratic_spline`` for sampling, one feature of n examples at a
    time, read from a table that the MADE's last layer writes into (models.made.IncrementalMADE).

    Same formulas as the reference inverse, arranged for few, cheap kernels (on CPU a kernel
    launch costs about as much as the arithmetic on a row of n): one softmax pass over widths and
    heights together (exp2 of the scaled logits: faster than exp), the cumulative sums
    as K row additions, the bin found by counting knots in float, the bin's six values in one
    flat ``index_select`` (faster than a gather across rows), and everything after that on
    rows of n. The bin's knots are normalised after the selection. No log-determinant.

    Rows of ``table`` [5K + 3, n], K bins (``raw`` is what the MADE writes, see ``raw_rows``):

    - 0 .. K, K+1 .. 2K+1: cumulative exp-widths and exp-heights (0 first, the sum last), scratch;
    - 2K+2: c (the raw derivative at -B, 0, plus the identity shift c); 2K+3 .. 3K+1: the K-1 raw
      interior derivatives + c; 3K+2: c (the derivative at +B: a constant row of the MADE's output);
    - 3K+3 .. 4K+2, 4K+3 .. 5K+2: raw widths, raw heights, times log2 e (overwritten by their
      exponentials).
    """

    def __init__(
        self,
        bins: int,
        n: int,
        like: Tensor,
        bound: float = 4.0,
        min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
        min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
        min_derivative: float = DEFAULT_MIN_DERIVATIVE,
    ) -> None:
        k = self.bins = bins
        if max(min_bin_width, min_bin_height) * bins > 1.0:
            raise ValueError("minimal bin size too large for the number of bins")
        self.bound, self.min_derivative = bound, min_derivative
        self.shift = _identity_shift(min_derivative)
        kw: dict[str, Any] = {"dtype": like.dtype, "device": like.device}
        self.table = torch.empty(5 * k + 3, n, **kw)
        self.table[0].zero_()
        self.table[k + 1].zero_()
        self.table[2 * k + 2].fill_(self.shift)
        self.raw = self.table[2 * k + 3 :]
        self.below = torch.empty(k - 1, n, **kw)
        mins = torch.tensor([min_bin_width, min_bin_height], **kw)
        # knot r = -B + 2B (min r + (1 - min K) C_r / C_K): the per-example part is C_r * scale / C_K
        self.scale = (2.0 * bound * (1.0 - mins * k))[:, None]
        self.knot_step = (2.0 * bound * mins)[:, None]  # [2, 1]: times the bin index; the bin's least size
        self.interior_heights = -bound + 2.0 * bound * min_bin_height * torch.arange(1, k, **kw)[:, None]
        # flat positions at bin index 0 of C_w, C_h (the bin's lower knots), e_w, e_h (its sizes), raw d_k, d_k+1
        rows = torch.tensor([0, k + 1, 3 * k + 3, 4 * k + 3, 2 * k + 2, 2 * k + 3], device=like.device)
        positions = rows[:, None] * n + torch.arange(n, device=like.device)  # [6, n]
        # int32 index arithmetic is faster than int64; int64 where the table outgrows it
        self.index_dtype = torch.int32 if self.table.numel() < 2**31 else torch.int64
        self.flat = positions.to(self.index_dtype)
        # views of the table, made once: each would otherwise cost its overhead on every call
        t = self.table
        self.flat_table = t.view(-1)
        self.exp = t[3 * k + 3 :].view(2, k, n)
        cum = t[: 2 * k + 2].view(2, k + 1, n)
        self.cumulate = [(cum[:, j], self.exp[:, j], cum[:, j + 1]) for j in range(k)]
        self.sums = cum[:, k]
        self.interior = cum[1, 1:k]

    def raw_rows(self) -> list[tuple[int, float, float]]:
        """What each row of ``raw`` holds, as (index of the raw parameter in the reference layout
        of K widths, K heights and K - 1 derivatives, or -1 for none; scale; offset): row = scale *
        parameter + offset. Widths and heights come scaled by log2 e (the softmax is then an exp2),
        derivatives shifted by the identity shift (both folded into the MADE's last layer)."""
        k = self.bins
        derivatives = [(2 * k + j, 1.0, self.shift) for j in range(k - 1)] + [(-1, 1.0, self.shift)]
        return derivatives + [(j, _LOG2E, 0.0) for j in range(2 * k)]

    def __call__(self, x: Tensor, out: Tensor) -> Tensor:
        """x [n] -> out [n]: the inverse at the parameters in ``raw`` (which it overwrites)."""
        n, bound = x.shape[0], self.bound
        e = self.exp
        e.sub_(e.amax(1, keepdim=True)).exp2_()  # 2^(log2 e (raw - max)) = e^(raw - max)
        for total, term, running in self.cumulate:
            torch.add(total, term, out=running)
        r = torch.div(self.scale, self.sums)  # [2, n]: scale / sum, widths and heights
        xc = x.clamp(-bound, bound)
        # the bin: how many interior height knots are <= xc (knot 0 = -B always is)
        below = torch.le(torch.addcmul(self.interior_heights, self.interior, r[1]), xc, out=self.below)
        idx = below.sum(0)
        at = torch.add(self.flat, idx.to(self.index_dtype), alpha=n).view(-1)
        cum, size, raw_d = self.flat_table.index_select(0, at).view(3, 2, n)
        # knot = -B + step * idx + C * r, bin size = step + e * r (widths, heights)
        x_k, y_k = torch.mul(idx, self.knot_step).sub_(bound).addcmul_(cum, r).unbind()
        w_k, h_k = torch.addcmul(self.knot_step, size, r).unbind()
        d_k, d_k1 = F.softplus(raw_d).add_(self.min_derivative).unbind()
        s_k = h_k / w_k
        curv = torch.add(d_k, d_k1).sub_(s_k, alpha=2.0)
        dy = xc - y_k
        a = torch.sub(s_k, d_k).mul_(h_k).addcmul_(dy, curv)
        b = torch.mul(h_k, d_k).addcmul_(dy, curv, value=-1.0)
        q2 = torch.mul(s_k, dy).mul_(2.0)  # -2c in a xi^2 + b xi + c = 0; the stable root 2c / (-b - sqrt(b^2 - 4ac))
        root = torch.mul(b, b).addcmul_(a, q2, value=2.0).clamp_min_(0.0).sqrt_().add_(b)
        xi = torch.div(q2, root).clamp_(0.0, 1.0)
        return torch.where(x == xc, torch.addcmul(x_k, xi, w_k), x, out=out)  # identity outside [-B, B]
