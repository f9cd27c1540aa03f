"""Stochastic sparsification with the exact threshold against the sampled one: same model quality?

privacy/dpsgd/clipping/sparsify.py estimates tau on layers of more than ``EXACT_ROW`` free entries
from ``THRESHOLD_SAMPLE`` of them instead of selecting the exact k-th largest. Both are valid
(T is unbiased for any tau, the clip after it bounds the norm); this checks that the cheaper
threshold trains as well. For each seed, the default DP-HFlow is trained on the same Adult
rows (codec-encoded, 28,000 training and the rest validation, a fixed split) with the same
DP-SGD noise seed, once with each threshold, and scored by the mean validation log-likelihood
(nats per row, codec space, one fixed dequantization draw). Writes the table, with commit,
command, machine and load, to benchmarks/results/sparsify_tau.md.

    .venv/bin/python -m benchmarks.bench_sparsify_tau [--seeds 0 1 2] [--steps 400]
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
from benchmarks.bench_dp_step import load_adult  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "sparsify_tau.md"
TRAIN_ROWS = 28_000


def run(mode: str, seed: int, steps: int, data: torch.Tensor, cards: list[int | None]) -> tuple[float, float]:
    """(validation log-likelihood, training seconds) of one DP run with the threshold `mode`."""
    from privflow.models import build_flow
    from privflow.privacy.dpsgd.clipping import sparsify
    from privflow.privacy.dpsgd.dp_sgd import TrainSettings, train
    from privflow.tasks.select import row_loglik

    exact_row = sparsify.EXACT_ROW
    if mode == "exact":
        sparsify.EXACT_ROW = 1 << 62  # every layer selects exactly
    try:
        perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
        x_train, x_val = data[perm[:TRAIN_ROWS]], data[perm[TRAIN_ROWS:]]
        torch.manual_seed(seed)
        model = build_flow("dphflow", cards)
        settings = TrainSettings(
            sample_rate=512 / TRAIN_ROWS,
            steps=steps,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            clipping="sparsify",
            lr=3e-3,
            checkpoint_every=steps,
            expected_batch_size=512.0,
            noise_seed=100 + seed,
        )
        started = time.perf_counter()
        result = train(model, x_train, settings)
        seconds = time.perf_counter() - started
    finally:
        sparsify.EXACT_ROW = exact_row
    model.load_state_dict(result.checkpoints[-1][1])
    model.eval()
    ll = row_loglik(model, x_val.numpy(), generator=torch.Generator().manual_seed(7))
    return float(ll.mean()), seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    torch.set_num_threads(1)
    data, cards = load_adult(torch.device("cpu"))
    got: dict[str, list[tuple[float, float]]] = {"exact": [], "sampled": []}
    for seed in args.seeds:
        for mode in got:  # interleaved: load on the machine hits both alike
            got[mode].append(run(mode, seed, args.steps, data, cards))
            print(f"seed {seed} {mode}: log-likelihood {got[mode][-1][0]:.3f}, {got[mode][-1][1]:.1f} s", flush=True)
    lines = [
        "| tau | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean ± sd | training s (median) |",
        "| --- | " + " | ".join("---:" for _ in args.seeds) + " | ---: | ---: |",
    ]
    for mode, rows in got.items():
        ll = [r[0] for r in rows]
        sd = statistics.stdev(ll) if len(ll) > 1 else 0.0
        lines.append(
            f"| {mode} | "
            + " | ".join(f"{v:.3f}" for v in ll)
            + f" | {statistics.mean(ll):.3f} ± {sd:.3f} | {statistics.median(r[1] for r in rows):.1f} |"
        )
    notes = [
        f"dphflow (default configuration), Adult codec rows: {TRAIN_ROWS} training, the rest validation (fixed "
        f"split); DP-SGD {args.steps} steps, batch 512 (Poisson), noise multiplier 1.0, C = 1, sparsity 0.5, "
        "lr 3e-3, one thread; the same noise seed for both thresholds of a seed.",
        "Cells: mean validation log-likelihood, nats per row (higher is better), of the last iterate.",
    ]
    text = "\n".join(common.header("Sparsification: exact threshold against sampled", started, load, notes, commit))
    common.publish(text + "\n" + "\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
