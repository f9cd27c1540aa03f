"""Time one optimizer step of DP training against non-private training, on the Adult demo.

The default DP-HFlow (``ModelConfig`` defaults: 4 blocks, hidden 64, LU linear flows, a MADE
shared by the blocks) on codec-encoded Adult rows, batch 512, one thread. Rows: the
non-private step, the DP step with each clipping strategy (fast path), the materialising
reference (opacus-hooks style, flat) and the naive loop (one example at a time, flat).
Methods run round-robin so that load on a shared machine hits them alike; the median and
the minimum over rounds are reported, on the clock and in CPU time of the timing thread
(the step runs on one thread, so its CPU time leaves out the time spent waiting for a core
on a busy machine). Prints a Markdown table and writes it, with the commit, command,
machine and load (``bench_common``), to benchmarks/results/dp_step.md.

    .venv/bin/python -m benchmarks.bench_dp_step [--device cuda] [--rounds 11] [--model maf] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import Tensor

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "dp_step.md"
# targets: DP step / non-private step, medians over interleaved rounds
NAIVE = "DP flat, naive per-example loop"
TARGETS = {"DP flat": 1.2, "DP per-layer": 1.2, "DP per-unit": 1.5, "DP sparsify": 1.5}


def load_adult(device: torch.device) -> tuple[Tensor, list[int | None]]:
    from privflow.data.codec import Codec
    from privflow.data.io import read_table
    from privflow.data.schema import Schema

    schema = Schema.from_yaml(ROOT / "src" / "privflow" / "demo" / "adult.yaml")
    codec = Codec.from_schema(schema)
    x = torch.tensor(codec.encode(read_table(ROOT / "src" / "privflow" / "demo" / "adult_train.csv")))
    return x.to(device), codec.cardinalities


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="dphflow", choices=["dphflow", "maf"])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=11, help="interleaved timed rounds, at least 11 (naive loop: 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--no-naive",
        action="store_true",
        help="skip the one-example-at-a-time loop (on a GPU it takes minutes at batch 4096 and is launch-bound)",
    )
    ap.add_argument("--out", type=Path, default=OUT, help="Markdown file the table is written to")
    args = ap.parse_args(argv)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    if args.rounds < 11:
        ap.error("--rounds must be at least 11 (medians over interleaved rounds)")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if common.cuda_missing(args.device):
        return 2

    from privflow.models import build_flow
    from privflow.privacy.dpsgd.clipping import clipped_gradient_sum, model_layers
    from privflow.privacy.dpsgd.dp_sgd import TrainSettings, noisy_gradients

    data, cards = load_adult(device)
    torch.manual_seed(0)
    model = build_flow(args.model, cards).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)
    layers = model_layers(model)
    settings = TrainSettings(
        sample_rate=args.batch / len(data),
        steps=1,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=float(args.batch),
        device=args.device,
    )
    noise_gen = torch.Generator(device=device).manual_seed(1)
    sp_gen = torch.Generator(device=device).manual_seed(2)
    g = torch.Generator().manual_seed(0)

    def batch() -> Tensor:
        return data[torch.randperm(len(data), generator=g)[: args.batch].to(device)]

    def non_private(x: Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        (-model.log_prob(x).mean()).backward()
        opt.step()

    def dp(clipping: str, method: str = "fast") -> Callable[[Tensor], None]:
        def step(x: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            res = clipped_gradient_sum(
                model,
                x,
                clipping=clipping,
                max_grad_norm=1.0,
                sparsity=0.5,
                generator=sp_gen,
                method=method,
                layers=layers,
            )  # type: ignore[arg-type]
            for p, g in zip(params, noisy_gradients([res.grads[p] for p in params], settings, noise_gen), strict=True):
                p.grad = g
            opt.step()

        return step

    def naive(x: Tensor) -> None:
        """One forward/backward per example, flat clipping, then noise: the textbook loop."""
        opt.zero_grad(set_to_none=True)
        total = [torch.zeros_like(p) for p in params]
        for i in range(x.shape[0]):
            grads = torch.autograd.grad(-model.log_prob(x[i : i + 1]).sum(), params, allow_unused=True)
            grads = [torch.zeros_like(p) if gr is None else gr for p, gr in zip(params, grads, strict=False)]
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads))
            scale = torch.clamp(1.0 / (norm + 1e-12), max=1.0)
            for t, gr in zip(total, grads, strict=False):
                t.add_(gr * scale)
        for p, g in zip(params, noisy_gradients(total, settings, noise_gen), strict=True):
            p.grad = g
        opt.step()

    methods: dict[str, Callable[[Tensor], None]] = {
        "non-private": non_private,
        "DP flat": dp("flat"),
        "DP per-layer": dp("per_layer"),
        "DP per-unit": dp("per_unit"),
        "DP sparsify": dp("sparsify"),
        "DP flat, materialised (hooks reference)": dp("flat", "hooks"),
    }
    if not args.no_naive:
        methods[NAIVE] = naive
    wall: dict[str, list[float]] = {k: [] for k in methods}
    cpu: dict[str, list[float]] = {k: [] for k in methods}
    for fn in methods.values():  # warm-up
        fn(batch())
    for r in range(args.rounds):
        for name, fn in methods.items():
            if name == NAIVE and r > 0:
                continue
            x = batch()
            sync(device)
            t0, c0 = time.perf_counter(), time.thread_time()
            fn(x)
            sync(device)
            wall[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name].append((time.thread_time() - c0) * 1e3)

    n_params = sum(p.numel() for p in params)
    lines = table(wall, cpu)
    summary = (
        f"{args.model}, {n_params} parameters, batch {args.batch}, device {device}, threads "
        f"{torch.get_num_threads()}, {args.rounds} round-robin rounds "
        + ("(naive loop skipped: --no-naive)" if args.no_naive else "(naive loop: 1)")
    )
    print(f"\n{summary}\n")
    print("\n".join(lines))
    notes = [
        summary + ". Each round times every step once, in turn, on a fresh batch of the Adult training rows.",
        "A step: zero the gradients, the (clipped) gradient of -log_prob, the noise (DP rows), one Adam update.",
        "Wall: ms on the clock. CPU: ms of CPU time of the timing thread (the step runs on one thread); on a "
        "busy machine wall exceeds CPU by the time spent waiting for a core.",
        "Targets (DP step / non-private step, ratio of medians; this run only): " + "; ".join(verdicts(wall, cpu)),
    ]
    text = "\n".join(common.header("DP step against the non-private step", started, load, notes, commit) + lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(f"\nwritten to {args.out}")
    return 0


def table(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> list[str]:
    """Markdown rows: medians and minima of wall and CPU ms, and each as a multiple of the
    non-private step's (the naive loop's single round as the last column's reference)."""
    med = {k: statistics.median(v) for k, v in wall.items()}
    low = {k: min(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    base, cbase, loop = med["non-private"], cmed["non-private"], med.get(NAIVE)
    lines = [
        "| step | wall ms (median) | wall ms (min) | x non-private (wall median) | x non-private (wall min) "
        "| CPU ms (median) | x non-private (CPU median) |" + (" naive loop / this |" if loop else ""),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if loop else ""),
    ]
    for k in med:
        lines.append(
            f"| {k} | {med[k]:.1f} | {low[k]:.1f} | {med[k] / base:.2f} | {low[k] / low['non-private']:.2f} "
            f"| {cmed[k]:.1f} | {cmed[k] / cbase:.2f} |" + (f" {loop / med[k]:.1f} |" if loop else "")
        )
    return lines


def verdicts(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> list[str]:
    """Per target: the ratio of medians on the clock (the target's measure) and in CPU time,
    each marked met / NOT met. On the shared machine they differ from run to run: a target is
    met only where both are, run after run."""
    out = []
    for name, target in TARGETS.items():
        parts = []
        for label, times in (("clock", wall), ("CPU", cpu)):
            ratio = statistics.median(times[name]) / statistics.median(times["non-private"])
            parts.append(f"{label} {ratio:.2f} {'met' if ratio <= target else 'NOT met'}")
        out.append(f"{name} <= {target}: {', '.join(parts)}")
    return out


if __name__ == "__main__":
    sys.exit(main())
