"""Dequantization of categorical codes and the fixed logit map to R^d.

A categorical code x in {0..K-1} becomes v = (x + u) / K in [0, 1) (DP-HFlow, Architecture,
"Variational Dequantization"). With u ~ q(u|x),
    log P(x) >= E_q[ log p_v(v) - sum_j log K_j - log q(u|x) ]   (Ho et al. 2019, eq. 12),
so each dequantizer returns v together with ``-sum log K - log q(u|x)``.

* ``UniformDequantizer``: q = U[0, 1)^{d_c}, log q = 0 (Theis et al. 2016).
* ``VariationalDequantizer``: the conditional flow of DP-HFlow,
      r = NN_phi(x_c);  (pi, mu, s) = NN_psi([eps1, r]);
      u1 = eps1,  u2 = F_LMCDF(eps2; pi, mu, s),  eps ~ N(0, I_{d_c}),
  followed by the squashing into (0, 1). Read literally, u = sigmoid([u1, u2]) would apply a
  sigmoid on top of a CDF value and confine u2 to (0.5, 0.73); we follow Flow++ (Ho et al.
  2019, the mixture-logistic coupling ``sigmoid^{-1}(F_LMCDF(.))``), whose final sigmoid gives
  u2 = F_LMCDF(eps2) in (0, 1) and u1 = sigmoid(eps1). log q(u|x) is exact:
      log q = log N(eps) - sum log sigmoid'(eps1) - sum log f_LM(eps2),
  with f_LM the logistic-mixture pdf, the derivative of F_LMCDF.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from privflow.models.layers import PlainTensors

_LOG_2PI = math.log(2.0 * math.pi)


class LogitMap(nn.Module):
    """Fixed public map [0, 1]^d -> R^d: y = logit(alpha + (1 - 2 alpha) v) (RealNVP's squeeze).

    log|dy/dv| = log(1 - 2 alpha) - log s - log(1 - s), s = alpha + (1 - 2 alpha) v.
    """

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        if not 0.0 < alpha < 0.5:
            raise ValueError("logit alpha must be in (0, 0.5)")
        self.alpha = alpha

    def forward(self, v: Tensor) -> tuple[Tensor, Tensor]:
        s = self.alpha + (1.0 - 2.0 * self.alpha) * v
        y = torch.log(s) - torch.log1p(-s)
        logdet = (math.log(1.0 - 2.0 * self.alpha) - torch.log(s) - torch.log1p(-s)).sum(1)
        return y, logdet

    def inverse(self, y: Tensor) -> Tensor:
        return (torch.sigmoid(y) - self.alpha) / (1.0 - 2.0 * self.alpha)


def _as_codes(x: Tensor, cards: Tensor) -> Tensor:
    """Integer-valued float codes, floored and clamped into 0..K-1."""
    return torch.minimum(torch.floor(x).clamp_min(0.0), cards - 1.0)


class UniformDequantizer(PlainTensors):
    """v = (x + u) / K with u ~ U[0, 1)^{d_c}; the bound term is -sum_j log K_j."""

    _plain = ("cards",)
    cards: Tensor  # [d_c] float, set in __init__ as a plain attribute (not a buffer)

    def __init__(self, cardinalities: list[int]) -> None:
        super().__init__()
        self.cardinalities = list(cardinalities)
        object.__setattr__(self, "cards", torch.tensor(self.cardinalities, dtype=torch.float32))

    def noise(self, n: int, like: Tensor, generator: torch.Generator | None = None) -> Tensor:
        u = torch.rand(n, len(self.cardinalities), generator=generator, dtype=torch.float64)
        return u.to(like)

    def flow(self, u: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """u -> v = (x + u) / K and log|dv/du| = -sum log K (per row)."""
        cards = self.cards.to(u)
        v = (_as_codes(x, cards) + u) / cards
        return v, (-torch.log(cards).sum()).expand(u.shape[0])

    def inverse(self, v: Tensor, x: Tensor) -> Tensor:
        cards = self.cards.to(v)
        return v * cards - _as_codes(x, cards)

    def forward(self, x: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Return (v, -sum log K - log q(u|x)) with log q = 0 on [0, 1)."""
        u = self.noise(x.shape[0], x) if noise is None else noise
        return self.flow(u, x)


def logistic_mixture_cdf(x: Tensor, logits: Tensor, means: Tensor, log_scales: Tensor) -> tuple[Tensor, Tensor]:
    """F_LMCDF(x) = sum_i pi_i sigmoid((x - mu_i) exp(-s_i)) and log f(x), f = dF/dx.

    x [...], mixture parameters [..., M]; pi = softmax(logits).
    """
    z = (x[..., None] - means) * torch.exp(-log_scales)
    log_pi = torch.log_softmax(logits, dim=-1)
    cdf = (torch.exp(log_pi) * torch.sigmoid(z)).sum(-1)
    log_pdf = torch.logsumexp(log_pi + F.logsigmoid(z) + F.logsigmoid(-z) - log_scales, dim=-1)
    return cdf, log_pdf


def logistic_mixture_inverse_cdf(
    u: Tensor, logits: Tensor, means: Tensor, log_scales: Tensor, iterations: int = 100
) -> Tensor:
    """Invert F_LMCDF by bisection (monotone); used only to test and to recover eps."""
    scale = torch.exp(log_scales).amax(-1)
    lo = means.amin(-1) - 40.0 * scale
    hi = means.amax(-1) + 40.0 * scale
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        below = logistic_mixture_cdf(mid, logits, means, log_scales)[0] < u
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


class VariationalDequantizer(PlainTensors):
    """q(u | x_c) as DP-HFlow's conditional flow (module docstring); nn.Linear layers only.

    eps is split as eps1 = eps[:, :d_c // 2], eps2 = the rest, so d_c = 1 gives an empty eps1
    (u is then a logistic-mixture CDF of eps2 conditioned on r = NN_phi(x_c) alone).
    """

    _plain = ("cards", "offsets")
    cards: Tensor  # [d_c] float and [d_c] int, set in __init__ as plain attributes (not buffers)
    offsets: Tensor

    def __init__(
        self, cardinalities: list[int], hidden: int = 64, components: int = 4, log_scale_bound: float = 7.0
    ) -> None:
        super().__init__()
        self.cardinalities = list(cardinalities)
        self.d_c = len(self.cardinalities)
        if self.d_c == 0:
            raise ValueError("variational dequantization needs at least one categorical feature")
        self.split = self.d_c // 2
        self.d2 = self.d_c - self.split
        self.components = components
        self.log_scale_bound = log_scale_bound
        object.__setattr__(self, "cards", torch.tensor(self.cardinalities, dtype=torch.float32))
        offsets = torch.tensor([0] + self.cardinalities[:-1]).cumsum(0)
        object.__setattr__(self, "offsets", offsets)
        self.one_hot_dim = int(sum(self.cardinalities))
        self.nn_phi = nn.Sequential(nn.Linear(self.one_hot_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        psi_in = nn.Linear(self.split + hidden, hidden)  # built in this order: the seeded initialisation
        psi_out = nn.Linear(hidden, self.d2 * 3 * components)
        self.nn_psi = nn.Sequential(psi_in, nn.ReLU(), psi_out)
        with torch.no_grad():  # start at pi uniform, mu = 0, s = 0: u2 = sigmoid(eps2)
            psi_out.weight.mul_(0.01)
            psi_out.bias.zero_()

    def one_hot(self, x: Tensor) -> Tensor:
        """Concatenated one-hot encoding of the codes, [n, sum K] (no data-dependent indexing)."""
        cards = self.cards.to(x)
        index = _as_codes(x, cards) + self.offsets.to(x)
        grid = torch.arange(self.one_hot_dim, dtype=x.dtype, device=x.device)
        return (index[..., None] == grid).to(x.dtype).sum(1)

    def _mixture(self, eps1: Tensor, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raw = self.nn_psi(torch.cat([eps1, r], dim=1)).reshape(r.shape[0], self.d2, 3, self.components)
        b = self.log_scale_bound
        return raw[:, :, 0], raw[:, :, 1], b * torch.tanh(raw[:, :, 2] / b)

    def flow(self, eps: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """eps -> u in (0, 1)^{d_c} and log|du/deps| (per row), given the codes x."""
        r = self.nn_phi(self.one_hot(x))
        eps1, eps2 = eps[:, : self.split], eps[:, self.split :]
        logits, means, log_scales = self._mixture(eps1, r)
        u2, log_pdf = logistic_mixture_cdf(eps2, logits, means, log_scales)
        u1 = torch.sigmoid(eps1)
        log_sig_prime = F.logsigmoid(eps1) + F.logsigmoid(-eps1)
        return torch.cat([u1, u2], dim=1), log_sig_prime.sum(1) + log_pdf.sum(1)

    def inverse(self, u: Tensor, x: Tensor) -> Tensor:
        """u -> eps (logit for u1, bisection through the mixture CDF for u2)."""
        r = self.nn_phi(self.one_hot(x))
        u1, u2 = u[:, : self.split], u[:, self.split :]
        eps1 = torch.log(u1) - torch.log1p(-u1)
        logits, means, log_scales = self._mixture(eps1, r)
        return torch.cat([eps1, logistic_mixture_inverse_cdf(u2, logits, means, log_scales)], dim=1)

    def log_q(self, eps: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """(u, log q(u|x)) for base noise eps ~ N(0, I)."""
        u, logdet = self.flow(eps, x)
        log_base = -0.5 * (eps.pow(2) + _LOG_2PI).sum(1)
        return u, log_base - logdet

    def noise(self, n: int, like: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return torch.randn(n, self.d_c, generator=generator, dtype=torch.float64).to(like)

    def forward(self, x: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Return (v = (x + u) / K, -sum log K - log q(u|x)); ``noise`` is eps (default N(0, I))."""
        eps = self.noise(x.shape[0], x) if noise is None else noise
        u, log_q = self.log_q(eps, x)
        cards = self.cards.to(x)
        v = (_as_codes(x, cards) + u) / cards
        return v, -torch.log(cards).sum() - log_q
