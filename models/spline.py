"""Monotonic rational-quadratic spline (Durkan et al. 2019, "Neural Spline Flows").

Elementwise bijection on [-B, B] with K bins, identity outside (linear tails, boundary
derivatives fixed to 1 so the map is C^1 at +-B). DP-HFlow, Architecture, "Autoregressive
Spline Transformation": S_k(x) = y_k + h_k [D_k xi^2 + d_k xi (1 - xi)] / [D_k + (d_{k+1} + d_k - 2 D_k) xi (1 - xi)].

Written without data-dependent indexing (``torch.where``/``gather`` only) so that it also runs
under ``torch.func.vmap`` for per-example gradients.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

DEFAULT_MIN_BIN_WIDTH = 1e-3
DEFAULT_MIN_BIN_HEIGHT = 1e-3
DEFAULT_MIN_DERIVATIVE = 1e-3


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
    # softmax written out: torch.softmax over a last axis of K ~ 8 is ~5x slower on CPU. The
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


def _knots_t(unnormalized: Tensor, bound: float, min_size: float) -> Tensor:
    """``_knots`` for parameters laid out [K, n] (bins first): [K+1, n]. Reductions over the K
    rows are then elementwise operations on length-n rows (vectorised over the examples)."""
    bins = unnormalized.shape[0]
    if min_size * bins > 1.0:
        raise ValueError("minimal bin size too large for the number of bins")
    e = torch.exp(unnormalized - unnormalized.amax(dim=0, keepdim=True))
    sizes = min_size + (1.0 - min_size * bins) * (e / e.sum(dim=0, keepdim=True))
    cum = torch.cumsum(sizes, dim=0)
    edge = torch.zeros_like(cum[:1])
    cum = torch.cat([edge, cum[:-1], edge + 1.0], dim=0)
    return 2.0 * bound * cum - bound


def rq_spline_inverse_t(
    x: Tensor,
    widths_t: Tensor,
    heights_t: Tensor,
    derivatives_t: Tensor,
    bound: float = 4.0,
    min_bin_width: float = DEFAULT_MIN_BIN_WIDTH,
    min_bin_height: float = DEFAULT_MIN_BIN_HEIGHT,
    min_derivative: float = DEFAULT_MIN_DERIVATIVE,
) -> Tensor:
    """The inverse of ``rational_quadratic_spline`` for one feature (x [n]) with its raw
    parameters laid out bins-first (widths/heights [K, n], derivatives [K-1, n]): the same
    formulas, for sampling, where it runs once per feature and block. The bins-first layout
    turns softmax, cumsum and the bin search over K ~ 8 into operations on rows of length n
    (several times faster on CPU than reductions over a last axis of 8). No log-determinant."""
    inside = (x >= -bound) & (x <= bound)
    xc = x.clamp(-bound, bound)
    bins = widths_t.shape[0]
    cumwidths = _knots_t(widths_t, bound, min_bin_width)
    cumheights = _knots_t(heights_t, bound, min_bin_height)
    # searchsorted(right=True) - 1, clamped: knot 0 is exactly -B <= xc, so count the others
    idx = (cumheights[1:] <= xc).sum(0).clamp_(max=bins - 1)[None]
    x_k, x_k1 = cumwidths.gather(0, idx)[0], cumwidths.gather(0, idx + 1)[0]
    y_k, y_k1 = cumheights.gather(0, idx)[0], cumheights.gather(0, idx + 1)[0]
    w_k, h_k = x_k1 - x_k, y_k1 - y_k
    edge = torch.zeros_like(derivatives_t[:1])
    raw = torch.cat([edge, derivatives_t, edge], dim=0)
    shift = _identity_shift(min_derivative)
    d_k = min_derivative + F.softplus(raw.gather(0, idx)[0] + shift)
    d_k1 = min_derivative + F.softplus(raw.gather(0, idx + 1)[0] + shift)
    s_k = h_k / w_k
    curv = d_k + d_k1 - 2.0 * s_k
    dy = xc - y_k
    a = h_k * (s_k - d_k) + dy * curv
    b = h_k * d_k - dy * curv
    c = -s_k * dy
    disc = (b.pow(2) - 4.0 * a * c).clamp_min(0.0)
    xi = (2.0 * c / (-b - torch.sqrt(disc))).clamp(0.0, 1.0)
    return torch.where(inside, xi * w_k + x_k, x)
