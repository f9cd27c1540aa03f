"""Where do synthetic values outside the real range come from? The DP marginals alone (issue 37).

A table whose rows fill a small part of their public bounds (a length in mm between about 3
and 11 under bounds of 0..60 or 0..160) is released through the product's DP marginals
(`privacy/mechanisms/dp_marginals.py`: one Gaussian release, Norm-Sub projection, density
floor) and sampled through the copula's inverse CDFs alone: no flow. If these samples already
leave the real range and inflate the standard deviation, the marginals are the mechanism.

Beside the product's post-processing, the same noisy vector under a candidate post-processing
(free: it reads only the noisy vector and public constants): numeric cells whose noisy count
the noise cannot tell from zero (below sigma * Phi^-1(1 - alpha / K), K cells: at most alpha
noise-only cells kept per column in expectation) are set to 0 before the projection.

    python -m benchmarks.diagnose_tails --out benchmarks/results/tails.md
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import norm

from benchmarks import bench_common as common
from privflow.data.copula import CopulaCodec, Marginals, schema_cells
from privflow.data.schema import Schema
from privflow.privacy.mechanisms import dp_marginals as mech

COLUMNS = 7  # like the measurements table of issue 37 (carat, depth, table, price, x, y, z)
DELTA = 1e-7  # the marginals' share of a run's delta, about


def suppressed(noisy: np.ndarray, schema: Schema, grid_bins: int, std: float, alpha: float) -> Marginals:
    """The candidate: cells below sigma * Phi^-1(1 - alpha / K) zeroed, then the product's steps."""
    cells = schema_cells(schema, mech.DEFAULT_MAX_ATOMS, grid_bins)
    off = np.concatenate([[0], np.cumsum([c.n_cells for c in cells])])
    total = mech.estimated_total(noisy, cells)
    probs = {}
    for j, c in enumerate(cells):
        y = noisy[off[j] : off[j + 1]]
        keep = y > std * norm.isf(alpha / y.size)
        keep[np.argmax(y)] = True  # never nothing
        p = np.zeros_like(y)
        p[keep] = mech.project_to_total(y[keep], total) / total
        probs[c.column] = mech.with_density_floor(p, c, total)
    return Marginals(probs, mech.DEFAULT_MAX_ATOMS, grid_bins)


def measure(rows: int, high: float, epsilon: float, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    real = {f"x{j}": np.clip(rng.normal(7.0, 1.1, rows), 3.0, 11.0) for j in range(COLUMNS)}
    schema = Schema.validated(
        {
            "dataset": {"name": "tails", "expected_rows": rows},
            "columns": [{"name": k, "type": "numeric", "bounds": [0, high]} for k in real],
        }
    )
    nm = mech.noise_for_epsilon(epsilon, DELTA)
    std = nm * mech.marginals_sensitivity(COLUMNS)
    grid = mech.auto_grid_bins(rows, std)
    noisy = mech.release_marginal_counts(pl.DataFrame(real), schema, nm, grid_bins=grid)
    out = []
    for label, marg in (
        ("product (Norm-Sub)", mech.marginals_from_counts(noisy, schema, grid_bins=grid)),
        ("suppressed, alpha 0.1", suppressed(noisy, schema, grid, std, 0.1)),
    ):
        x = CopulaCodec(schema, marg).decode(rng.random((200_000, COLUMNS)))["x0"].to_numpy()
        r = real["x0"]
        outside = float(np.mean((x < r.min()) | (x > r.max())))
        out.append(
            f"| {rows:,} | 0..{high:g} | {epsilon:g} | {grid} | {std:.1f} | {label} | {100 * outside:.3f}% | "
            f"{x.std() / r.std():.2f} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    rows = [
        "| rows | public bounds | epsilon (marginals) | grid bins | noise std per cell | post-processing | "
        "samples outside the real range | std ratio synthetic / real |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, high in ((54_000, 60.0), (54_000, 160.0), (2_000, 160.0)):
        for eps in (0.1, 0.3, 1.0):
            rows += measure(n, high, eps, args.seed)
    notes = [
        f"{COLUMNS} numeric columns, each N(7, 1.1) clipped to [3, 11]; the copula's inverse CDFs only, no flow; "
        f"200,000 samples; delta {DELTA:g}; grid bins by the product's auto rule.",
    ]
    text = "\n".join(common.header("DP marginals alone on a sparse, wide domain", started, load, notes, commit) + rows)
    common.publish(text + "\n", args.out)


if __name__ == "__main__":
    main()
