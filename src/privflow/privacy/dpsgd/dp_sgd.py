"""DP-SGD / DP-Adam training of a flow, with Poisson sampling and its privacy event.

Each step (Abadi et al. 2016; DP-NF, Waites & Cummings 2021, section 3; DP-HFlow,
"Differentially Private Training"):

1. Poisson sampling: every row joins the batch independently with probability q (the
   sampling that ``PoissonGaussianEvent`` is accounted for; opacus' DPDataLoader does the
   same), drawn in time and memory of the batch (``poisson_sample``). An empty batch still
   takes a noise-only step.
2. The per-example gradients of -log_prob(x_i) are clipped by the chosen strategy
   (``privacy.dpsgd.clipping``: flat, per-layer, per-unit, sparsify) so that every example's
   total contribution has L2 norm <= C = ``max_grad_norm``.
3. Gaussian noise with std sigma * C is added to the sum, which is divided by the PUBLIC
   expected batch size (a configured constant, never the number of private rows).
4. The optimizer (Adam or SGD) steps on that noisy gradient: post-processing.
5. With ``ema_decay > 0`` the checkpoints hold the exponential moving average of the
   iterates (``privacy.dpsgd.averaging``), also post-processing; 0 keeps the raw iterates.

Data-parallel (``Replica``; launched by ``privacy.dpsgd.distributed`` under torchrun): the SAME
step split over W processes. Every rank draws the same Poisson sample (the seeds are broadcast
from rank 0) and keeps its own rows' (i mod W == rank), so the union of the local batches is one
Poisson sample of the whole table; the dequantization noise of the whole batch is drawn on
every rank and each keeps its rows' share; each rank computes its clipped sum with the same
clipping code; rank 0 alone adds the Gaussian noise, before one all-reduce of the sums; every
rank takes the same optimizer step. With the same seeds the W-process run equals the
single-process run up to the order of float additions (sparsify: equal in distribution, each
rank has its own mask stream). W = 1 is the single-process run.

The privacy event of the whole run is ``PoissonGaussianEvent(q, sigma, steps)``
(``dp_sgd_event``), whatever W. ``private=False`` trains the non-private baseline on the same sampling
(no clipping, no noise, mean loss over the actual batch) and records no event.

Randomness (docs/architecture.md, privacy rule 6): the Poisson sampler, the Gaussian noise, the
sparsifier's draws and the model's dequantization noise each come from their own explicit
torch generator, seeded independently from ``secrets.randbits(63)`` for every run. The
dequantization noise is drawn per batch and passed to ``log_prob(x, noise)``: its stream's
position depends on the private batch sizes, so it must be secret too, never the global RNG
seeded from the public config. ``noise_seed`` is a test-only override from which the four
seeds are spawned independently (numpy ``SeedSequence.spawn``), never s, s+1, s+2.

Floating-point caveat (as opacus documents for its non-secure mode): the Gaussian noise is
``torch.randn`` from a Philox / Mersenne-Twister generator in floating point, not an exact
sampler, so in principle it carries the least-significant-bit weakness of Mironov (2012)
and the generator is not cryptographically secure. The statistics' mechanisms use OpenDP's
exact samplers (``privacy.noise``); for the millions of DP-SGD draws per run no exact
sampler on torch tensors is available (torchcsprng, opacus' secure mode, is unmaintained).

Non-finite examples: a row whose loss or per-example gradient is NaN / infinite is zeroed
before clipping (``privacy.dpsgd.clipping``) so that it contributes nothing and cannot turn the
model into NaN; ``TrainResult.nonfinite_examples`` counts them.

Not differentially private: the training losses (``TrainResult.losses`` and the values
passed to ``on_step``) and ``nonfinite_examples`` are computed on private rows; they are
diagnostics for the data owner and must not be released with the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from privflow.privacy.accounting.events import PoissonGaussianEvent
from privflow.privacy.dpsgd.averaging import ParameterAverage
from privflow.privacy.dpsgd.clipping import CLIPPINGS, clipped_gradient_sum, model_layers
from privflow.privacy.noise import dequantization_noise, independent_seeds, log_prob_with

if TYPE_CHECKING:
    from privflow.models.base import LogProbModel


@dataclass(frozen=True)
class TrainSettings:
    """Everything the trainer needs; all public (from the run configuration)."""

    sample_rate: float
    steps: int
    noise_multiplier: float
    max_grad_norm: float
    clipping: Literal["flat", "per_layer", "per_unit", "sparsify"] = "flat"
    sparsity: float = 0.5
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-3
    checkpoint_every: int = 50
    # at most this many checkpoints kept, evenly spaced (`checkpoint_steps`); None keeps all
    max_checkpoints: int | None = None
    ema_decay: float = 0.0  # 0: checkpoints are the raw iterates
    expected_batch_size: float = 512.0  # PUBLIC constant from the config, never len(data)
    device: str = "cpu"  # "cpu", "cuda", "cuda:1", or "auto"
    seed: int = 0  # the config's public seed (model initialisation, done by the caller); train() draws nothing from it
    private: bool = True
    workers: int = 1  # data-parallel processes (privacy.dpsgd.distributed launches them when > 1)
    # TEST ONLY. None (the default) seeds the sampler, the noise, the sparsifier and the
    # dequantization noise independently from OS entropy: a seed anyone can read (e.g. from
    # the config) would let them regenerate and subtract the noise, voiding the guarantee.
    noise_seed: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.private and not self.noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0 for private training, got {self.noise_multiplier}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.clipping not in CLIPPINGS:
            raise ValueError(f"clipping must be one of {CLIPPINGS}, got {self.clipping!r}")
        if not 0 <= self.sparsity < 1:
            raise ValueError(f"sparsity must lie in [0, 1), got {self.sparsity}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must lie in [0, 1), got {self.ema_decay}")
        if not self.lr > 0 or self.checkpoint_every < 1 or not self.expected_batch_size > 0:
            raise ValueError("lr and expected_batch_size must be > 0 and checkpoint_every >= 1")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_checkpoints is not None and self.max_checkpoints < 1:
            raise ValueError(f"max_checkpoints must be >= 1 or None, got {self.max_checkpoints}")


def checkpoint_steps(steps: int, every: int, keep: int | None = None) -> list[int]:
    """The steps whose state the trainer keeps: every `every`-th and the last, and with `keep`
    at most that many of them, evenly spaced with the last always kept. Decided from the
    public schedule before training, so that the kept states, not all of them, are what a
    long run holds: at a fixed number of epochs the steps grow with the table (126 states on
    3.2M rows, 1,260 on 32M)."""
    every_kth = sorted({*range(every, steps + 1, every), steps}) if steps > 0 else []
    if keep is None or len(every_kth) <= keep:
        return every_kth
    idx = np.unique(np.round(np.linspace(len(every_kth) - 1, 0, keep)).astype(int))
    return [every_kth[i] for i in sorted(idx)]


@dataclass
class TrainResult:
    """Checkpoints (step, state_dict copy on CPU), per-step mean losses (NOT private), the event,
    and how many sampled examples were left out for a non-finite loss or gradient (NOT private)."""

    checkpoints: list[tuple[int, dict]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    steps: int = 0
    event: PoissonGaussianEvent | None = None
    nonfinite_examples: int = 0


def dp_sgd_event(settings: TrainSettings) -> PoissonGaussianEvent | None:
    """The privacy cost of ``train(model, data, settings)``: Poisson-subsampled Gaussian steps."""
    if not settings.private:
        return None
    return PoissonGaussianEvent(settings.sample_rate, settings.noise_multiplier, settings.steps)


class RowSource(Protocol):
    """What the trainer needs of its rows: their shape and a gather by row indices."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...

    def __getitem__(self, idx: Any) -> Any: ...


@dataclass(frozen=True)
class Replica:
    """This process's place in a data-parallel run; the default (0, 1) is the single process.

    Rank r keeps the rows i with i mod world_size == r; rank 0 alone adds the noise. With
    world_size > 1 the caller has initialised ``torch.distributed`` (privacy.dpsgd.distributed)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def of_process_group(cls) -> Replica:
        """The initialised default process group's rank and size."""
        return cls(dist.get_rank(), dist.get_world_size())

    def keeps(self, rows: Tensor) -> Tensor | None:
        """Mask of `rows` (global indices) this rank keeps; None: all of them (one process)."""
        return None if self.world_size == 1 else rows % self.world_size == self.rank

    def total(self, tensors: list[Tensor]) -> list[Tensor]:
        """The element-wise sums over the ranks, in one all-reduce (one process: unchanged)."""
        if self.world_size == 1:
            return tensors
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)]

    def shared_seeds(self, seeds: list[int], device: torch.device) -> list[int]:
        """Rank 0's seeds on every rank (the coins and the dequantization noise must agree)."""
        if self.world_size == 1:
            return seeds
        value = torch.tensor(seeds, dtype=torch.int64, device=device)
        dist.broadcast(value, 0)
        return [int(v) for v in value.tolist()]


_DENSE_SAMPLE = 0.25  # above this expected share of the rows, n coins are cheaper than rejection


def poisson_sample(n: int, sample_rate: float, generator: torch.Generator) -> Tensor:
    """Indices of a Poisson sample, sorted: each of n rows independently with probability q.

    Drawn in time and memory of the batch, not of the table: the batch size K ~ Binomial(n, q)
    (the number of heads among n independent coins), then a uniformly random K-subset of the
    rows, the first K distinct values of i.i.d. uniform draws (by symmetry every K-subset is
    equally likely). Given K, n independent coins also pick a uniform K-subset, so the two
    are the same distribution, the one ``PoissonGaussianEvent`` is accounted for. n coins
    would cost O(n) time and memory per step (4 bytes a row: 400 MB at 100M rows).
    """
    if n < 0 or not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"need n >= 0 and 0 <= sample_rate <= 1, got n={n}, sample_rate={sample_rate}")
    if n == 0 or sample_rate == 0.0:
        return torch.zeros(0, dtype=torch.long)
    if sample_rate >= _DENSE_SAMPLE:
        return (torch.rand(n, generator=generator) < sample_rate).nonzero().squeeze(1)
    k = int(
        torch.binomial(
            torch.tensor([float(n)], dtype=torch.float64),
            torch.tensor([float(sample_rate)], dtype=torch.float64),
            generator=generator,
        ).item()
    )
    return distinct_uniform(n, k, generator)


def distinct_uniform(n: int, k: int, generator: torch.Generator) -> Tensor:
    """A uniformly random k-subset of range(n), sorted: the first k distinct of i.i.d. uniform
    draws, drawn in rounds until k are found (k <= n / 4 in use, so few draws are repeats)."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    draws = torch.zeros(0, dtype=torch.long)
    if k == 0:
        return draws
    found = 0
    while found < k:
        more = (k - found) + (k - found) // 8 + 16
        draws = torch.cat([draws, torch.randint(n, (more,), generator=generator)])
        values, inverse = torch.unique(draws, return_inverse=True)
        found = int(values.numel())
    # each distinct value's first position in the draws; keep the k that appeared first
    first = torch.full((values.numel(),), draws.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(draws.numel()), reduce="amin")
    keep = values[torch.argsort(first)[:k]]
    return keep.sort().values


def noisy_gradients(
    clipped_sums: Sequence[Tensor], settings: TrainSettings, generator: torch.Generator
) -> list[Tensor]:
    """(sum of clipped grads + N(0, (sigma C)^2)) / expected_batch_size, for every parameter at once:
    one draw over their concatenation (a few kernels instead of four per parameter: about 120 per
    step of the default DP-HFlow), then views back into each parameter's shape."""
    if not clipped_sums:
        return []
    flat = torch.cat([g.reshape(-1) for g in clipped_sums])
    noise = torch.randn(flat.shape, generator=generator, device=flat.device, dtype=flat.dtype)
    flat = flat.add_(noise, alpha=settings.noise_multiplier * settings.max_grad_norm).div_(settings.expected_batch_size)
    return [
        part.view_as(g) for part, g in zip(flat.split([g.numel() for g in clipped_sums]), clipped_sums, strict=True)
    ]


def resolve_device(name: str) -> torch.device:
    """ "auto" -> cuda when available, else cpu; anything else as torch names it. CUDA asked for
    where torch sees none is the user's DeviceUnavailable (pre-flight refuses it first on the CLI;
    this guards the trainer called from Python)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        from privflow.core.errors import DeviceUnavailable

        raise DeviceUnavailable(
            f"device '{name}' was requested, but torch sees no CUDA device on this machine; use cpu or auto."
        )
    return device


def _state_copy(model: nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def train(
    model: nn.Module,
    data: Tensor | RowSource,
    settings: TrainSettings,
    on_step: Callable[[int, float], None] | None = None,
    replica: Replica | None = None,
) -> TrainResult:
    """Train ``model`` (a TabularFlow: ``log_prob(x) -> [n]``) on encoded rows ``data`` [n, d]: a
    tensor, or any `RowSource` (rows on disk, ``privflow.data.chunked.DiskRows``: each step gathers
    only its Poisson sample).

    Returns checkpoints at `checkpoint_steps` (every ``checkpoint_every`` steps and the last,
    at most ``max_checkpoints`` of them), the mean
    training loss per step over its finite examples (NaN for an empty batch) and the run's
    privacy event. Deterministic only when ``noise_seed`` is set (tests); otherwise every
    generator is seeded from OS entropy. The global RNG is forked (and reseeded secretly
    inside) so that nothing the model might draw from it depends on a public seed.

    ``replica``: this process's place in a data-parallel run (module docstring); every rank
    passes the whole table and the same settings. Only rank 0 calls ``on_step`` and keeps
    checkpoints; every rank ends with the same weights.
    """
    replica = replica or Replica()
    if replica.world_size != settings.workers:
        raise ValueError(
            f"settings ask for {settings.workers} workers but this is a run of {replica.world_size} process(es); "
            "start data-parallel runs through privflow.privacy.dpsgd.distributed"
        )
    lead = replica.rank == 0
    device = resolve_device(settings.device)
    model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if settings.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=settings.lr)
    else:
        opt = torch.optim.SGD(params, lr=settings.lr)
    layers = model_layers(model)
    result = TrainResult(event=dp_sgd_event(settings))
    n = int(data.shape[0])
    seeds = replica.shared_seeds(independent_seeds(5, settings.noise_seed), device)
    s_sample, s_noise, s_sparsify, s_deq, s_global = seeds
    if replica.world_size > 1:  # each rank's sparsification masks: its own stream
        s_sparsify = independent_seeds(replica.world_size, s_sparsify)[replica.rank]
    sampler = torch.Generator().manual_seed(s_sample)
    noise_gen = torch.Generator(device=device).manual_seed(s_noise)
    sparsify_gen = torch.Generator(device=device).manual_seed(s_sparsify)
    deq_gen = torch.Generator().manual_seed(s_deq)  # the models draw dequantization noise on CPU
    fork = [device.index or 0] if device.type == "cuda" else []
    average = ParameterAverage(model, settings.ema_decay) if settings.ema_decay > 0 else None
    dtype = params[0].dtype if params else data.dtype
    checked = False
    kept = set(checkpoint_steps(settings.steps, settings.checkpoint_every, settings.max_checkpoints))
    with torch.random.fork_rng(devices=fork, device_type=device.type if device.type != "cpu" else "cuda"):
        torch.manual_seed(s_global)  # anything a model still draws implicitly: secret, not the public seed
        if fork:
            torch.cuda.manual_seed(s_global)
        for step in range(1, settings.steps + 1):
            rows = poisson_sample(n, settings.sample_rate, sampler)  # the same sample on every rank
            mine = replica.keeps(rows)
            idx = rows if mine is None else rows[mine]
            batch = torch.as_tensor(data[idx]).to(device=device, dtype=dtype)  # a tensor, or rows on disk
            deq = dequantization_noise(model, len(rows), batch, deq_gen) if len(rows) > 0 else None
            if deq is not None and mine is not None:
                deq = deq[mine.to(deq.device)]
            opt.zero_grad(set_to_none=True)
            # this rank's gradient sums, and [loss sum, finite examples, non-finite examples]
            stats = torch.zeros(3, device=device, dtype=dtype)
            if settings.private and len(idx) > 0:
                res = clipped_gradient_sum(
                    model,
                    batch,
                    clipping=settings.clipping,
                    max_grad_norm=settings.max_grad_norm,
                    sparsity=settings.sparsity,
                    generator=sparsify_gen,
                    method="fast",
                    check=not checked,
                    layers=layers,
                    noise=deq,
                )
                checked = True
                finite = res.losses[~res.nonfinite] if res.nonfinite is not None else res.losses
                stats[0], stats[1], stats[2] = finite.sum(), finite.numel(), res.nonfinite_examples
                sums = [res.grads[p] for p in params]
            elif len(idx) > 0:  # the non-private baseline: the plain gradient of the summed loss
                loss_sum = -log_prob_with(cast("LogProbModel", model), batch, deq).sum()
                loss_sum.backward()
                stats[0], stats[1] = loss_sum.detach(), float(len(idx))
                sums = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            else:
                sums = [torch.zeros_like(p) for p in params]
            if settings.private:  # noise ONCE per step: rank 0 adds it before the sums are reduced
                scaled = (
                    noisy_gradients(sums, settings, noise_gen)
                    if lead
                    else [g / settings.expected_batch_size for g in sums]
                )
                *grads, stats = replica.total([*scaled, stats])
            else:
                *grads, stats = replica.total([*sums, stats])
                grads = [g / stats[1] for g in grads]  # mean over the actual global batch
            result.nonfinite_examples += int(stats[2])
            loss = float(stats[0] / stats[1]) if stats[1] > 0 else math.nan
            if settings.private or stats[1] > 0:  # a private step always moves (noise only on an empty batch)
                for p, g in zip(params, grads, strict=True):
                    p.grad = g
                opt.step()
            if average is not None:
                average.update()
            result.losses.append(loss)
            result.steps = step
            if lead and on_step is not None:
                on_step(step, loss)
            if lead and step in kept:
                state = average.state_dict() if average is not None else _state_copy(model)
                result.checkpoints.append((step, state))
    return result
