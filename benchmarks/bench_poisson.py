"""Time one DP-SGD Poisson sample: the batch-sized draw against n coins.

``privacy.dp_sgd.poisson_sample`` draws a Binomial(n, q) batch size and that many distinct
rows; the reference draws n uniform coins and keeps those below q (the same law; what the
trainer did before). At a fixed expected batch of 512 the coins cost O(n) per step, the draw
O(batch). Both run on one thread, round-robin over rounds on a shared machine; the median per
draw is reported, with the seconds each would add to one epoch (n / 512 steps).

    .venv/bin/python -m benchmarks.bench_poisson [--sizes 32000 320000 3200000 32000000] [--rounds 11]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "poisson.md"
BATCH = 512


def coins(n: int, q: float, g: torch.Generator) -> torch.Tensor:
    """The reference: n independent coins."""
    return (torch.rand(n, generator=g) < q).nonzero().squeeze(1)


def per_draw_ms(draw, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        draw()
    return (time.perf_counter() - t) / reps * 1e3


def main(argv: list[str] | None = None) -> int:
    from privflow.privacy.dpsgd.dp_sgd import poisson_sample

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32_000, 320_000, 3_200_000, 32_000_000])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    lines = [
        "| rows n | batch-sized draw, ms | n coins, ms | coins / draw | coins' extra seconds per epoch |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in args.sizes:
        q = BATCH / n
        reps = max(3, min(200, int(2e8 / n)))
        fast, slow = [], []
        for _ in range(args.rounds):
            fast.append(per_draw_ms(lambda n=n, q=q: poisson_sample(n, q, g), reps))
            slow.append(per_draw_ms(lambda n=n, q=q: coins(n, q, g), reps))
        f, s = statistics.median(fast), statistics.median(slow)
        extra = (s - f) / 1e3 * (n / BATCH)
        lines.append(f"| {n:,} | {f:.3f} | {s:.3f} | {s / f:.1f}x | {extra:.1f} |")
        print(lines[-1], flush=True)
    notes = [
        f"Expected batch {BATCH}, one thread, medians over {args.rounds} interleaved rounds.",
        "The two draws have the same law (tests/privacy/test_dp_sgd.py: chi-square over all subsets).",
    ]
    text = "\n".join(common.header("Poisson sample: batch-sized draw against n coins", started, load, notes, commit))
    args.out.write_text(text + "\n" + "\n".join(lines) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
