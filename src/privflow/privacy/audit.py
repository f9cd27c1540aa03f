"""Empirical privacy auditing in one training run (Steinke, Nasr & Jagielski 2023).

"Privacy auditing with one (1) training run" (NeurIPS 2023): m canaries, each included
independently with probability 1/2; after training, a membership test scores every canary,
guesses the k+ highest-scoring ones as members and the k- lowest as non-members (abstaining on
the rest), and the number v of correct guesses among r = k+ + k- turns into a lower bound on
epsilon: the largest epsilon at which an (epsilon, delta)-DP algorithm could still produce
>= v correct guesses with probability >= 1 - confidence (``epsilon_lower_bound``, their
Theorem 5.2 / Appendix D code, delta included).

Canaries here are *gradient* canaries in the white-box setting of the paper (section 6):
canary i is an example whose per-example gradient is a huge multiple (``CANARY_NORM_FACTOR``
times C) of a Dirac direction e_j on a coordinate j that the model never uses: a masked-out
weight of a MADE ``MaskedLinear`` (its real per-example gradients are exactly zero there, so
the canary does not change the learned density and its coordinate sees canary + noise only).
At each DP-SGD step every included canary joins the batch independently with the run's
sample rate q, is clipped to the norm bound ``max_grad_norm`` that every clipping strategy
guarantees (privacy rule 4), and is added to the clipped sum before the trainer adds the
Gaussian noise. Its score is the sum over steps of the released noisy gradient at j (all the
iterates are covered by the DP-SGD guarantee, so the adversary may see them).

Injection wraps the trainer from outside (``inject_canaries``): the module attribute
``privflow.privacy.dpsgd.dp_sgd.clipped_gradient_sum`` is replaced for the duration of the
context, and a global optimizer step pre-hook reads the noisy gradients. privacy/dpsgd/dp_sgd.py
and the clipping engine are not modified; the batch itself and its noise are the trainer's.

Randomness: the inclusion coins come from ``secrets`` (the OS CSPRNG); the canaries' Poisson
draws from a generator seeded from it. ``seed`` is a TEST-ONLY override.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from privflow.core.errors import ConfigError
from privflow.privacy.dpsgd import dp_sgd
from privflow.privacy.dpsgd.dp_sgd import TrainSettings

CANARY_NORM_FACTOR = 1e3  # the crafted gradient's norm, in units of the configured C
NO_CLIP_FACTOR = 1e6  # the no-clip mutant's clipping threshold, in units of C
MUTATIONS = ("none", "noise/10", "no-clip")


# --- the bound ---------------------------------------------------------------------------


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[>= v of r guesses correct] for an (epsilon, delta)-DP run with m
    canaries (Steinke, Nasr & Jagielski 2023, Theorem 5.2; their Appendix D ``p_value_DP_audit``).

    beta = P[Binomial(r, e^eps / (1 + e^eps)) >= v]; the delta term adds
    2 m delta * max_{1<=i<=v} P[v > Binomial(r, q) >= v - i] / i.
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if v == 0:
        return min(beta, 1.0)
    i = np.arange(1, v + 1)
    # P[v > Binomial(r, q) >= v - i] for i = 1..v, summed in the reference's order
    totals = np.cumsum(stats.binom.pmf(v - i, r, q))
    alpha = float(np.max(totals / i))
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest epsilon whose p-value for (m, r, v) stays >= 1 - confidence: with
    probability >= `confidence` the run is not (eps, delta)-DP for any smaller eps. Bisection
    to 1e-9 relative width (their ``get_eps_audit``); 0 when even eps = 0 is not rejected."""
    p = 1.0 - confidence
    if not 0 < p < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < p:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) < p:
            lo = mid
        else:
            hi = mid
    return lo


def guesses(scores: np.ndarray, included: np.ndarray, k_pos: int, k_neg: int) -> tuple[int, int]:
    """(r, v): guess the k_pos highest scores as members and the k_neg lowest as non-members."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    m = len(scores)
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > m:
        raise ValueError(f"need k_pos, k_neg >= 0 and k_pos + k_neg <= m = {m}")
    order = np.argsort(scores, kind="stable")
    top, bottom = order[m - k_pos :], order[:k_neg]
    return k_pos + k_neg, int(included[top].sum() + (~included[bottom]).sum())


def inclusion_coins(m: int, seed: int | None = None) -> np.ndarray:
    """m fair coins from the OS CSPRNG (``secrets``); `seed` only in tests."""
    if seed is not None:
        return np.random.default_rng(seed).random(m) < 0.5
    bits = secrets.randbits(m) if m else 0
    return np.array([(bits >> i) & 1 == 1 for i in range(m)], dtype=bool)


# --- mutations ---------------------------------------------------------------------------


def mutate(settings: TrainSettings, mutation: str) -> TrainSettings:
    """A deliberately broken copy of the trainer settings that the audit must catch.

    ``noise/10``: noise multiplier / 10. ``no-clip``: clipping threshold C * 1e6 with the noise
    multiplier divided by the same factor, so the noise std sigma * C is unchanged but no
    gradient is clipped any more (a real "clipping switched off" bug, not a rescaling).
    """
    from dataclasses import replace

    if mutation == "none":
        return settings
    if mutation == "noise/10":
        return replace(settings, noise_multiplier=settings.noise_multiplier / 10)
    if mutation == "no-clip":
        return replace(
            settings,
            max_grad_norm=settings.max_grad_norm * NO_CLIP_FACTOR,
            noise_multiplier=settings.noise_multiplier / NO_CLIP_FACTOR,
        )
    raise ValueError(f"mutation must be one of {MUTATIONS}, got {mutation!r}")


# --- gradient canaries -------------------------------------------------------------------


def canary_slots(model: nn.Module, m: int) -> list[tuple[nn.Parameter, int]]:
    """m (parameter, flat index) pairs on masked-out weights of the model's MaskedLinear layers
    (never used by the density), spread evenly: public, from the architecture alone."""
    slots: list[tuple[nn.Parameter, int]] = []
    for module in model.modules():
        mask, weight = getattr(module, "mask", None), getattr(module, "weight", None)
        if isinstance(mask, Tensor) and isinstance(weight, nn.Parameter) and mask.shape == weight.shape:
            zeros = (mask.reshape(-1) == 0).nonzero().squeeze(1).tolist()
            slots.extend((weight, int(j)) for j in zeros)
    if len(slots) < m:
        raise ConfigError(
            f"The audit's model has {len(slots)} masked-out weights to hold gradient canaries, fewer than the {m} "
            f"asked for: pass --canaries {len(slots)} or fewer, or a wider or deeper MADE (model.hidden, "
            "model.blocks) in --config."
        )
    pick = np.linspace(0, len(slots) - 1, m).round().astype(int) if m else np.array([], dtype=int)
    return [slots[i] for i in pick]


@dataclass
class CanaryRun:
    """The canaries of one audited run: where they sit, which are in, and their scores."""

    slots: list[tuple[nn.Parameter, int]]
    included: np.ndarray
    scores: np.ndarray = field(init=False)
    sampled: np.ndarray = field(init=False)  # how often each canary joined a batch (curator-only)

    def __post_init__(self) -> None:
        self.scores = np.zeros(len(self.slots))
        self.sampled = np.zeros(len(self.slots), dtype=np.int64)


@contextmanager
def inject_canaries(
    slots: Sequence[tuple[nn.Parameter, int]],
    included: np.ndarray,
    sample_rate: float,
    canary_norm: float,
    seed: int | None = None,
) -> Iterator[CanaryRun]:
    """While open, every DP-SGD step of ``privflow.privacy.dpsgd.dp_sgd.train`` adds the included
    canaries it Poisson-samples (rate `sample_rate`) to the clipped sum, and every optimizer
    step adds the noisy gradient at each canary's coordinate to its score. `canary_norm`: the
    crafted gradient's norm (``CANARY_NORM_FACTOR`` times the configured C), clipped to the
    trainer's ``max_grad_norm`` of the moment."""
    run = CanaryRun(list(slots), np.asarray(included, dtype=bool))
    gen = np.random.default_rng(seed if seed is not None else secrets.randbits(63))
    real = dp_sgd.clipped_gradient_sum
    params = {id(p): p for p, _ in run.slots}

    def with_canaries(model: nn.Module, x: Tensor, **kwargs: Any) -> Any:
        res = real(model, x, **kwargs)
        c = float(kwargs["max_grad_norm"])
        clipped = min(canary_norm, c)  # every strategy bounds an example's total norm by C
        joined = run.included & (gen.random(len(run.slots)) < sample_rate)
        run.sampled += joined
        for i in np.flatnonzero(joined):
            p, j = run.slots[i]
            res.grads[p].view(-1)[j] += clipped
        return res

    def read_scores(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not any(id(p) in params for g in opt.param_groups for p in g["params"]):
            return
        for i, (p, j) in enumerate(run.slots):
            if p.grad is not None:
                run.scores[i] += float(p.grad.reshape(-1)[j])

    handle = register_optimizer_step_pre_hook(read_scores)
    dp_sgd.clipped_gradient_sum = with_canaries
    try:
        yield run
    finally:
        dp_sgd.clipped_gradient_sum = real
        handle.remove()


__all__ = [
    "CANARY_NORM_FACTOR",
    "MUTATIONS",
    "NO_CLIP_FACTOR",
    "CanaryRun",
    "canary_slots",
    "epsilon_lower_bound",
    "guesses",
    "inclusion_coins",
    "inject_canaries",
    "mutate",
    "p_value",
]
