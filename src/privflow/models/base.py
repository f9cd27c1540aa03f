"""``TabularFlow``: the interface every flow of privflow implements (encoded space in, nats out).

Pipeline of ``log_prob`` for a row x as the codec encodes it (continuous in [0, 1],
categoricals as integer codes):
    categoricals -> v = (x + u) / K  (dequantizer, bound term -sum log K - log q(u|x))
    v in [0, 1]^d -> y = logit map (fixed, public)
    y -> z = body(y)  (learned; the first layer is the DP-initialised ActNorm)
    log p(x) >= log pi(z) + log|dz/dy| + log|dy/dv| - sum log K - log q(u|x).
Subclasses implement ``body_forward``, ``body_inverse``, ``first_actnorm`` and
``base_permutation``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn

from privflow.models.dequantize import LogitMap, UniformDequantizer, VariationalDequantizer
from privflow.models.layers import ActNorm
from privflow.models.priors import MixtureOfGaussians, StandardNormal


class LogProbModel(Protocol):
    """A model DP-SGD trains: a per-row log-likelihood, with the dequantization noise given or drawn."""

    def log_prob(self, x: Tensor, noise: Tensor | None = None) -> Tensor: ...


class FlowModel(LogProbModel, Protocol):
    """The flow methods the pipeline's steps call (``TabularFlow`` has them), for a parameter that
    needs only these: the DP statistics' ``preprocess`` and ``init_actnorm``, the DP prior's
    ``set_prior``. Where a step also needs the ``nn.Module`` API, the flow is typed ``nn.Module``."""

    def preprocess(self, x: Tensor, noise: Tensor | None = None) -> Tensor: ...

    def init_actnorm(self, mean: Tensor, std: Tensor) -> None: ...

    def set_prior(self, weights: Tensor, means: Tensor, stds: Tensor) -> None:
        """The DP prior in the preprocessed space (``TabularFlow.set_prior``'s default ``space``)."""
        ...


class TabularFlow(nn.Module, ABC):
    """Common part: dequantization, logit map, prior, sampling; the body comes from subclasses."""

    def __init__(
        self,
        cardinalities: list[int | None],
        *,
        hidden: int = 64,
        dequantization: Literal["uniform", "variational"] = "uniform",
        prior: Literal["normal", "mog"] = "normal",
        mog_components: int = 5,
        logit_alpha: float = 0.01,
        deq_components: int = 4,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not cardinalities:
            raise ValueError("a flow needs at least one feature")
        for c in cardinalities:
            if c is not None and int(c) < 1:
                raise ValueError(f"categorical cardinality must be >= 1, got {c}")
        self.cardinalities = [None if c is None else int(c) for c in cardinalities]
        self.d = len(self.cardinalities)
        self.cont_idx = [i for i, c in enumerate(self.cardinalities) if c is None]
        self.cat_idx = [i for i, c in enumerate(self.cardinalities) if c is not None]
        order = self.cont_idx + self.cat_idx
        self._restore = [order.index(i) for i in range(self.d)]  # [cont, cat] -> encoded order
        cat_cards = [int(self.cardinalities[i]) for i in self.cat_idx]  # type: ignore[arg-type]
        self.uniform = UniformDequantizer(cat_cards) if cat_cards else None
        self.dequantizer: nn.Module | None = None
        if cat_cards:
            if dequantization == "variational":
                self.dequantizer = VariationalDequantizer(cat_cards, hidden=hidden, components=deq_components)
            elif dequantization == "uniform":
                self.dequantizer = self.uniform
            else:
                raise ValueError(f"unknown dequantization '{dequantization}'")
        self.logit = LogitMap(logit_alpha)
        if prior == "normal":
            self.prior: StandardNormal | MixtureOfGaussians = StandardNormal(self.d)
        elif prior == "mog":
            self.prior = MixtureOfGaussians(self.d, mog_components)
        else:
            raise ValueError(f"unknown prior '{prior}'")
        self.config: dict[str, Any] = dict(config or {})

    # -- body, provided by subclasses ---------------------------------------------------------
    @abstractmethod
    def body_forward(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """y in R^d -> (z, log|dz/dy|)."""

    @abstractmethod
    def body_inverse(self, z: Tensor) -> Tensor:
        """z -> y, the inverse of body_forward."""

    @abstractmethod
    def first_actnorm(self) -> ActNorm:
        """The activation norm that the DP statistics initialise."""

    @abstractmethod
    def base_permutation(self) -> list[int]:
        """perm with z = ActNorm_1(y)[:, perm] when every learned layer after it is at its identity start."""

    # -- the encoded space ----------------------------------------------------------------------
    def _assemble(self, x: Tensor, v_cat: Tensor | None) -> Tensor:
        if v_cat is None:
            return x
        return torch.cat([x[:, self.cont_idx], v_cat], dim=1)[:, self._restore]

    def dequantize(self, x: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x (encoded) -> (v in [0, 1]^d, bound term -sum log K - log q(u|x))."""
        if self.dequantizer is None:
            return x, torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        v_cat, term = self.dequantizer(x[:, self.cat_idx], noise)
        return self._assemble(x, v_cat), term

    def transform(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """Continuous part of the flow: v in [0, 1]^d -> (z, log|dz/dv|) (logit map, then body)."""
        y, ld_logit = self.logit(v)
        z, ld_body = self.body_forward(y)
        return z, ld_logit + ld_body

    def inverse_transform(self, z: Tensor) -> Tensor:
        """z -> v (no clamping; ``sample`` clamps)."""
        return self.logit.inverse(self.body_inverse(z))

    def log_prob(self, x: Tensor, noise: Tensor | None = None) -> Tensor:
        """Per-row log-likelihood (nats, a lower bound for categoricals) in the encoded space.

        ``noise``: the dequantization noise (u for uniform, eps for variational) to make the
        value deterministic; drawn fresh when None.
        """
        v, deq_term = self.dequantize(x, noise)
        z, logdet = self.transform(v)
        return self.prior.log_prob(z) + logdet + deq_term

    def forward(self, x: Tensor, noise: Tensor | None = None) -> Tensor:
        """Same as ``log_prob``, so wrappers that call the module (opacus) get the log-likelihood."""
        return self.log_prob(x, noise)

    @torch.no_grad()
    def preprocess(self, x: Tensor, noise: Tensor | None = None) -> Tensor:
        """Fixed public map (uniform dequantization + logit) whose output the first ActNorm sees."""
        if self.uniform is None:
            v = x
        else:
            v = self._assemble(x, self.uniform(x[:, self.cat_idx], noise)[0])
        return self.logit(v)[0]

    @torch.no_grad()
    def init_actnorm(self, mean: Tensor, std: Tensor) -> None:
        """Set the first ActNorm from DP per-feature statistics of ``preprocess`` output (DP-NF B.1)."""
        self.first_actnorm().initialize(mean, std)

    @torch.no_grad()
    def set_prior(
        self, weights: Tensor, means: Tensor, stds: Tensor, space: Literal["preprocessed", "base"] = "preprocessed"
    ) -> None:
        """Install a DP mixture-of-Gaussians base (DP-NF App. B.2).

        With space="preprocessed" (the default: DP-EM runs on ``preprocess`` output) the mixture
        is carried into the base space through the first ActNorm and the fixed permutations,
        which is exactly the flow at its identity start; so call it after ``init_actnorm`` and
        before training. space="base" installs the parameters as given.
        """
        if not isinstance(self.prior, MixtureOfGaussians):
            raise ValueError("set_prior needs a model built with prior='mog'")
        if space == "preprocessed":
            act = self.first_actnorm()
            scale = torch.exp(act.log_scale).to(means)
            perm = self.base_permutation()
            means = ((means - act.loc.to(means)) / scale)[:, perm]
            stds = (stds / scale)[:, perm]
        elif space != "base":
            raise ValueError(f"unknown space '{space}'")
        self.prior.set(weights, means, stds)

    @torch.no_grad()
    def from_base(self, z: Tensor) -> Tensor:
        """Base-space draws z [n, d] -> rows in the encoded space (the deterministic half of
        ``sample``: a caller may draw z from its generator and map slices of it in parallel)."""
        v = self.inverse_transform(z).clamp(0.0, 1.0)
        for i in self.cat_idx:
            k = self.cardinalities[i]
            v[:, i] = torch.floor(v[:, i] * k).clamp(0, k - 1)  # type: ignore[operator]
        return v

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, batch_size: int = 4096) -> Tensor:
        """n rows in the encoded space: continuous in [0, 1], categoricals as integer codes."""
        p = next(self.parameters(), None)
        dtype = p.dtype if p is not None else torch.float32
        device = p.device if p is not None else torch.device("cpu")
        out = []
        for start in range(0, n, batch_size):
            m = min(batch_size, n - start)
            out.append(self.from_base(self.prior.sample(m, generator, dtype=dtype, device=device)))
        if not out:
            return torch.empty(0, self.d, dtype=dtype, device=device)
        return torch.cat(out)
