"""Multi-process data-parallel DP-SGD / DP-Adam with opacus' DPDDP, launched with torchrun.

    torchrun --nproc-per-node 2 -m privflow.privacy.distributed --job job.json

One DP-SGD step (Abadi et al. 2016; DP-NF, Waites & Cummings 2021, section 3) split over W
processes, each holding the rows i with i mod W == rank:

1. Poisson sampling of the GLOBAL batch: every row joins with probability q = expected
   global batch / public row count. All ranks draw the same n coins from one generator
   (its seed is drawn from OS entropy on rank 0 and broadcast, never logged) and keep the
   coins of their own rows, so the union of the local batches is exactly one Poisson
   sample of the whole table, as ``PoissonGaussianEvent(q, sigma, steps)`` accounts for.
2. Each rank computes its rows' per-example gradients (``privacy.grad_samplers``: opacus'
   grad-sampler registry plus the flows' own samplers, log-determinant terms included) and
   opacus' ``DistributedDPOptimizer`` clips each to norm C and sums them.
3. Noise N(0, (sigma C)^2) is added ONCE, on rank 0 only (opacus ``DistributedDPOptimizer.
   add_noise``); the sums are all-reduced, so the step sees (sum of clipped grads + noise)
   divided by the public expected global batch size, exactly the single-process update.
4. ``DifferentiallyPrivateDistributedDataParallel`` broadcasts rank 0's initial weights;
   every rank applies the same reduced gradient, so the replicas stay identical.

Accounting: one event for the run, from rank 0's accountant (an opacus RDP accountant
hooked on rank 0's optimizer only): ``PoissonGaussianEvent(q, sigma, steps)`` with the global
q. The other ranks record nothing, so W ranks never count the run W times.

Ledger: ``launch`` is the one way to start a run. It reserves the planned
``PoissonGaussianEvent`` in the ledger before any worker exists (BudgetExceeded refuses the
run before spawning, charging nothing), settles the run with rank 0's recorded event after
success, abandons the reservation (it stays counted) when workers fail after any of them
started -- each writes a marker before it reads a row -- and releases it when none started.

Randomness: the sampling seed (shared by all ranks), the noise seed (rank 0) and each
rank's dequantization seed are drawn independently from the OS CSPRNG; the dequantization
noise is passed explicitly to ``log_prob`` from its own generator (its stream depends on
the private local batch sizes, so it must not come from the public seed).
``noise_seed``/``sampling_seed`` exist so that a test can compare the distributed run with
a single-process run bit for bit (the dequantization seeds are then spawned from
``noise_seed`` with numpy's SeedSequence), and must not be set in production. The Gaussian
noise is opacus' ``torch.normal`` from a torch generator: floating-point, not an exact
sampler (Mironov 2012), as opacus documents for its non-secure mode.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from privflow.models import build_flow
from privflow.privacy.events import PoissonGaussianEvent, event_from_dict, event_to_dict
from privflow.privacy.grad_samplers import Tape, materialise, param_layers
from privflow.privacy.ledger import Ledger
from privflow.privacy.noise import dequantization_noise, independent_seeds, log_prob_with


@dataclass(frozen=True)
class DistributedSettings:
    """Public settings of a distributed run; `sample_rate` and `expected_batch_size` are GLOBAL."""

    sample_rate: float
    steps: int
    noise_multiplier: float
    max_grad_norm: float
    expected_batch_size: float
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-3
    checkpoint_every: int = 50
    seed: int = 0  # model initialisation and dequantization noise only (public, not a DP input)
    sampling_seed: int | None = None  # TEST ONLY: production draws it from OS entropy
    noise_seed: int | None = None  # TEST ONLY: production draws it from OS entropy

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate}")
        if self.steps < 0 or self.checkpoint_every < 1:
            raise ValueError("steps must be >= 0 and checkpoint_every >= 1")
        if not (self.noise_multiplier > 0 and self.max_grad_norm > 0 and self.expected_batch_size > 0):
            raise ValueError("noise_multiplier, max_grad_norm and expected_batch_size must be > 0")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")

    @classmethod
    def for_rows(cls, public_rows: int, global_batch: float, **kw: Any) -> DistributedSettings:
        """q from the PUBLIC row count (the schema's expected_rows), never the private one."""
        return cls(sample_rate=min(1.0, global_batch / public_rows), expected_batch_size=float(global_batch), **kw)


@dataclass
class DistributedResult:
    """What one rank ends with; only rank 0 carries the event and the checkpoints."""

    rank: int
    world_size: int
    steps: int
    local_batch_sizes: list[int] = field(default_factory=list)
    event: PoissonGaussianEvent | None = None
    accountant_history: list[tuple[float, float, int]] = field(default_factory=list)
    checkpoints: list[tuple[int, dict]] = field(default_factory=list)
    replica_max_abs_diff: float = 0.0


def fresh_seed() -> int:
    """63 bits from the OS CSPRNG (never from the run's public seed)."""
    return secrets.randbits(63)


def shard_indices(n: int, rank: int, world_size: int) -> Tensor:
    """Rows i with i mod W == rank: disjoint shards that cover the table."""
    return torch.arange(rank, n, world_size)


def global_poisson_mask(n: int, sample_rate: float, generator: torch.Generator) -> Tensor:
    """One Bernoulli(q) coin per row of the whole table (identical on every rank)."""
    return torch.rand(n, generator=generator) < sample_rate


def per_example_gradients(model: nn.Module, batch: Tensor, noise: Tensor | None = None) -> dict[nn.Parameter, Tensor]:
    """grad of -log_prob(x_i) for every example i and trainable parameter, [b, *shape].

    Uses the project's recording tape and grad samplers (privacy/grad_samplers), which keep
    the flows' log-determinant terms that opacus' own hooks would drop; a parameter unused
    in the forward pass gets zeros. ``noise``: the rows' dequantization noise (explicit, so
    no global RNG is drawn from).
    """

    params = [p for p in model.parameters() if p.requires_grad]
    b = int(batch.shape[0])
    out: dict[nn.Parameter, Tensor] = {}
    if b > 0:
        layers = [m for _, m in param_layers(model)]
        with Tape(layers) as tape:
            loss = -log_prob_with(model, batch, noise).sum()
        tape.backward(loss)
        for layer in layers:
            if tape.calls[layer]:
                for p, g in materialise(layer, tape.calls[layer]).items():
                    out[p] = out[p] + g if p in out else g
    for p in params:
        if p not in out:
            out[p] = torch.zeros((b, *p.shape), dtype=p.dtype, device=p.device)
    return out


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


def _shared_seed(explicit: int | None, device: torch.device) -> int:
    """Rank 0's seed (explicit in tests, else fresh entropy), broadcast to every rank."""
    import torch.distributed as dist

    value = torch.tensor([explicit if explicit is not None else fresh_seed()], dtype=torch.int64, device=device)
    dist.broadcast(value, 0)
    return int(value.item())


def train_distributed(model: nn.Module, data: Tensor, settings: DistributedSettings) -> DistributedResult:
    """Run the DP steps on this rank (call inside an initialised process group, every rank alike).

    `data` is the whole encoded table on every rank (each keeps its shard); only rank 0's
    result carries the privacy event and the checkpoints.
    """
    import torch.distributed as dist
    from opacus.accountants import RDPAccountant
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from opacus.optimizers import DistributedDPOptimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    device = next(model.parameters()).device
    ddp = DPDDP(model)  # broadcasts rank 0's initial weights
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    base = (
        torch.optim.Adam(params, lr=settings.lr)
        if settings.optimizer == "adam"
        else torch.optim.SGD(params, lr=settings.lr)
    )
    noise_gen = _generator(settings.noise_seed if settings.noise_seed is not None else fresh_seed(), device)
    optimizer = DistributedDPOptimizer(
        base,
        noise_multiplier=settings.noise_multiplier,
        max_grad_norm=settings.max_grad_norm,
        # per rank; all-reduce sums the ranks and divides by W: (sum + noise) / global E
        expected_batch_size=settings.expected_batch_size / world,  # type: ignore[arg-type]
        loss_reduction="mean",
        generator=noise_gen if rank == 0 else None,
    )
    accountant = RDPAccountant()
    if rank == 0:
        optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=settings.sample_rate))

    n = int(data.shape[0])
    mine = shard_indices(n, rank, world)
    sampler = _generator(_shared_seed(settings.sampling_seed, torch.device("cpu")), torch.device("cpu"))
    result = DistributedResult(rank=rank, world_size=world, steps=0)
    # this rank's dequantization noise: its own secret stream (tests: spawned from noise_seed)
    deq_seed = fresh_seed() if settings.noise_seed is None else independent_seeds(world, settings.noise_seed)[rank]
    deq_gen = torch.Generator().manual_seed(deq_seed)
    ddp.train()
    for step in range(1, settings.steps + 1):
        coins = global_poisson_mask(n, settings.sample_rate, sampler)
        local = mine[coins[mine]]
        batch = data[local].to(device)
        optimizer.zero_grad(set_to_none=True)
        noise = dequantization_noise(ddp.module, len(batch), batch, deq_gen) if len(batch) else None
        for p, g in per_example_gradients(ddp.module, batch, noise).items():
            p.grad_sample = g
        optimizer.step()
        result.local_batch_sizes.append(int(local.numel()))
        result.steps = step
        if rank == 0 and (step % settings.checkpoint_every == 0 or step == settings.steps):
            result.checkpoints.append(
                (step, {k: v.detach().to("cpu", copy=True) for k, v in ddp.module.state_dict().items()})
            )

    flat = torch.cat([p.detach().reshape(-1) for p in params]) if params else torch.zeros(1, device=device)
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = (flat - ref).abs().max() if flat.numel() else torch.zeros((), device=device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    result.replica_max_abs_diff = float(diff)
    if rank == 0:
        result.accountant_history = [(float(s), float(q), int(k)) for s, q, k in accountant.history]
        sigmas = {h[0] for h in result.accountant_history}
        rates = {h[1] for h in result.accountant_history}
        if result.steps and (sigmas != {settings.noise_multiplier} or rates != {settings.sample_rate}):
            raise RuntimeError(f"accountant history {result.accountant_history} disagrees with the settings")
        steps = sum(h[2] for h in result.accountant_history)
        result.event = PoissonGaussianEvent(settings.sample_rate, settings.noise_multiplier, steps)
    return result


# -- torchrun entry point --------------------------------------------------------------------


def _job_model(job: dict[str, Any]) -> nn.Module:
    torch.manual_seed(int(job["settings"].get("seed", 0)))
    model = build_flow(job["model"]["name"], job["cardinalities"], **job["model"].get("config", {}))
    if job.get("init_state"):
        model.load_state_dict(torch.load(job["init_state"], map_location="cpu", weights_only=True))
    return model


def run_job(job_path: str | Path) -> DistributedResult:
    """torchrun worker: join the group (gloo on CPU, nccl on GPU), train, write the outputs.

    The job file (JSON): data (.npy of encoded rows), cardinalities, model {name, config},
    settings (DistributedSettings fields), out (folder), optional init_state (.pt), device.
    Rank 0 writes out/result.pt (final state, checkpoints, event); every rank writes
    out/rank<r>.json (its batch sizes and accountant history) for inspection.
    """
    import torch.distributed as dist

    job = json.loads(Path(job_path).read_text())
    use_cuda = job.get("device", "cpu") == "cuda" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(int(job.get("threads", 1)))
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    try:
        settings = DistributedSettings(**job["settings"])
        model = _job_model(job).to(device)
        out = Path(job["out"])
        out.mkdir(parents=True, exist_ok=True)
        # the launcher abandons (keeps charged) a failed run once any rank may have read a row
        (out / f"started.rank{dist.get_rank()}").write_text("reading rows\n")
        data = torch.as_tensor(np.load(job["data"]), dtype=torch.float32)
        result = train_distributed(model, data, settings)
        info = {
            "rank": result.rank,
            "world_size": result.world_size,
            "steps": result.steps,
            "local_batch_sizes": result.local_batch_sizes,
            "accountant_history": result.accountant_history,
            "event": event_to_dict(result.event) if result.event is not None else None,
            "replica_max_abs_diff": result.replica_max_abs_diff,
        }
        (out / f"rank{result.rank}.json").write_text(json.dumps(info))
        if result.rank == 0:
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            torch.save(
                {
                    "state": state,
                    "checkpoints": result.checkpoints,
                    "event": info["event"],
                    "settings": asdict(settings),
                },
                out / "result.pt",
            )
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


class WorkersFailed(RuntimeError):
    """torchrun's workers exited with an error; the ledger reservation was abandoned or released."""


def planned_event(settings: DistributedSettings) -> PoissonGaussianEvent:
    """What a run with these (public) settings spends: one Poisson-subsampled Gaussian event."""
    return PoissonGaussianEvent(settings.sample_rate, settings.noise_multiplier, settings.steps)


def write_job(path: str | Path, job: dict[str, Any]) -> Path:
    """Write a job file for ``run_job`` (JSON); settings may be a DistributedSettings."""
    body = dict(job)
    if isinstance(body.get("settings"), DistributedSettings):
        body["settings"] = asdict(body["settings"])
    path = Path(path)
    path.write_text(json.dumps(body))
    return path


def launch(
    job_path: str | Path,
    nproc: int,
    *,
    ledger_path: str | Path,
    dataset: str,
    run_id: str,
    timeout: float = 600.0,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run a job under torchrun with the ledger around it; returns rank 0's result.pt content.

    Reserves ``planned_event`` under `run_id` before any worker starts (BudgetExceeded from
    ``Ledger.reserve`` refuses the run here, before spawning), settles with rank 0's recorded
    event on success, abandons the reservation if a worker had started reading rows when the
    run failed, and releases it if none had.
    """

    job = json.loads(Path(job_path).read_text())
    settings = DistributedSettings(**job["settings"])
    out = Path(job["out"])
    if out.exists() and any(out.glob("started.rank*")):
        raise ValueError(f"output folder {out} holds an earlier run's markers; use a fresh folder")
    ledger = Ledger(ledger_path)
    event = planned_event(settings)
    ledger.reserve(dataset, run_id, [event], {"train": f"distributed DP-SGD over {nproc} processes"})

    def started() -> bool:
        return out.exists() and any(out.glob("started.rank*"))

    cmd = [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={int(nproc)}",
        "-m",
        "privflow.privacy.distributed",
        "--job",
        str(job_path),
    ]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except BaseException:
        (ledger.abandon if started() else ledger.release)(run_id)
        raise
    if proc.returncode != 0:
        (ledger.abandon if started() else ledger.release)(run_id)
        raise WorkersFailed(f"torchrun exited with {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    try:
        result = torch.load(out / "result.pt", weights_only=False)
        recorded = event_from_dict(result["event"])
    except BaseException:
        ledger.abandon(run_id)
        raise
    ledger.settle(run_id, [recorded])  # records what rank 0 spent; raises if it passed the reservation
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m privflow.privacy.distributed")
    parser.add_argument("--job", required=True, type=Path, help="job file (JSON), see run_job")
    args = parser.parse_args(argv)
    run_job(args.job)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "DistributedResult",
    "DistributedSettings",
    "WorkersFailed",
    "launch",
    "planned_event",
    "write_job",
    "fresh_seed",
    "global_poisson_mask",
    "per_example_gradients",
    "run_job",
    "shard_indices",
    "train_distributed",
]
