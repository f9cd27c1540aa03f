"""Where a DP step's time goes: torch's profiler over each clipping strategy's step.

bench_dp_step.py says how much slower a DP step is than the non-private one; this says why.
Per step (the mean over ``--steps`` profiled steps after a warm-up): the operators called and
kernels launched, their self time on the device and on the CPU, and the operators that take
the most device time (CPU time on a CPU run). On a GPU the default flow's step is bound by
kernel launches, not arithmetic, so the counts matter as much as the times.

    .venv/bin/python -m benchmarks.profile_dp_step [--device cuda] [--batch 512] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402
from benchmarks.bench_dp_step import load_adult  # noqa: E402

STRATEGIES = ("flat", "per_layer", "per_unit", "sparsify")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per strategy (after 3 warm-up steps)")
    ap.add_argument("--top", type=int, default=8, help="operators listed per strategy")
    ap.add_argument("--out", type=Path, default=None, help="Markdown file (default: print only)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.top < 1 or args.batch < 1:
        ap.error("--steps, --top and --batch must be positive")
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    if common.cuda_missing(args.device):
        return 2
    torch.set_num_threads(1)

    from privflow.models import build_flow
    from privflow.privacy.dpsgd.clipping import clipped_gradient_sum, model_layers

    device = torch.device(args.device)
    data, cards = load_adult(device)
    torch.manual_seed(0)
    model = build_flow("dphflow", cards).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    layers = model_layers(model)
    gen = torch.Generator(device=device).manual_seed(2)
    x = data[: args.batch]

    def non_private() -> None:
        torch.autograd.grad(-model.log_prob(x).mean(), params, allow_unused=True)

    def dp(clipping: str) -> Callable[[], None]:
        def step() -> None:
            clipped_gradient_sum(
                model, x, clipping=clipping, max_grad_norm=1.0, sparsity=0.5, generator=gen, layers=layers
            )  # type: ignore[arg-type]

        return step

    steps: dict[str, Callable[[], None]] = {"non-private": non_private}
    steps.update({f"DP {s.replace('_', '-')}": dp(s) for s in STRATEGIES})
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    rows, tops = [], []
    for name, fn in steps.items():
        for _ in range(3):
            fn()
        if on_gpu:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                fn()
            if on_gpu:
                torch.cuda.synchronize()
        events = prof.key_averages()
        # torch operators (CPU-side records); kernels are the device's records
        ops = [e for e in events if e.device_type == DeviceType.CPU and not e.key.startswith(("cuda", "ProfilerStep"))]
        n_ops = sum(e.count for e in ops) / args.steps
        n_kernels = sum(e.count for e in events if e.device_type == DeviceType.CUDA) / args.steps
        dev_ms = sum(e.self_device_time_total for e in events) / 1e3 / args.steps
        cpu_ms = sum(e.self_cpu_time_total for e in events) / 1e3 / args.steps
        rows.append(f"| {name} | {n_ops:.0f} | {n_kernels:.0f} | {dev_ms:.2f} | {cpu_ms:.2f} |")
        key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        ranked = sorted(ops, key=lambda e: getattr(e, key), reverse=True)[: args.top]
        tops.append(f"\n### {name}\n\n| operator | calls per step | self ms per step |\n| --- | ---: | ---: |")
        per_step = [(e.key, e.count / args.steps, getattr(e, key) / 1e3 / args.steps) for e in ranked]
        tops.extend(f"| `{op}` | {calls:.0f} | {ms:.3f} |" for op, calls, ms in per_step)

    lines = [
        "| step | operators | kernels launched | device self ms | CPU self ms |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
        *tops,
    ]
    notes = [
        f"Default DP-HFlow, batch {args.batch}, device {common.device_name(args.device)}, one thread; "
        f"{args.steps} profiled steps per strategy after 3 warm-up steps, means per step.",
        "A step here is the (clipped) gradient alone: no noise, no optimizer update (bench_dp_step.py times both).",
        "Operators: torch operator calls (nested ones too); kernels: device kernels and copies (0 on a CPU).",
    ]
    title = "Where the DP step's time goes (torch profiler)"
    text = "\n".join(common.header(title, started, load, notes, commit) + lines)
    common.publish(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
