"""Synthetic values outside the real range from the DP marginals alone: the earlier flat release
against the product's tree release.

Tables whose rows fill a small part of their public bounds ("concentrated": N(7, 1.1) clipped
to [3, 11] under bounds 0..60, 0..100 or 0..160) and tables that fill them with a long tail
("wide": Gamma(2, bound / 8) clipped to the bounds) are released through DP marginals and
sampled through the copula's inverse CDFs alone: no flow. So any sample outside the real range,
and any inflated standard deviation, comes from the marginals.

- `flat` (the release before the tree, reproduced here): one noisy count per cell at L2
  sensitivity sqrt(d), a grid of the power of two nearest expected_rows / (8 sigma) in
  [16, 512], Norm-Sub per column, and one row's worth of mass (1 / N) spread over the cells;
- `tree` (the product, `privacy/mechanisms/dp_marginals.py`): the cells and a tree of block
  counts over each ordered column, on the default grid.

    python -m benchmarks.diagnose_tails --out benchmarks/results/tails.md
"""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks import bench_common as common
from privflow.data.copula import DEFAULT_MAX_ATOMS, CopulaCodec, Marginals, schema_cells
from privflow.data.schema import Schema
from privflow.privacy.mechanisms import dp_marginals as mech
from privflow.privacy.mechanisms.gaussian import gaussian_mechanism
from privflow.privacy.mechanisms.hierarchy import project_to_total

COLUMNS = 7  # like a table of measurements (carat, depth, table, price, x, y, z)
DELTA = 1e-7  # the marginals' share of a run's delta, about
SAMPLES = 100_000
CASES = ((2_000, 160.0, 1.0), (2_000, 160.0, 0.3), (20_000, 100.0, 1.0), (54_000, 60.0, 1.0), (30_000, 100.0, 0.3))


def flat_release(df: pl.DataFrame, schema: Schema, nm: float) -> tuple[Marginals, int]:
    """The earlier release (module docstring, `flat`) and its grid."""
    std = nm * math.sqrt(COLUMNS)
    target = max(float(schema.dataset.expected_rows or 1) / (8.0 * std), 1.0)
    grid = int(min(max(2 ** round(math.log2(target)), 16), 512))
    counts = mech.marginal_counts(df, schema, grid_bins=grid)
    noisy = gaussian_mechanism(counts, math.sqrt(COLUMNS), nm)
    cells = schema_cells(schema, DEFAULT_MAX_ATOMS, grid)
    off = np.concatenate([[0], np.cumsum([c.n_cells for c in cells])])
    sums = np.array([noisy[off[j] : off[j + 1]].sum() for j in range(len(cells))])
    k = np.array([c.n_cells for c in cells], dtype=float)
    total = max(float(np.sum(sums / k) / np.sum(1.0 / k)), 1.0)
    probs = {}
    for j, c in enumerate(cells):
        p = project_to_total(noisy[off[j] : off[j + 1]], total) / total
        alpha = min(1.0, 1.0 / total)
        p[: c.n_values] = (1 - alpha) * p[: c.n_values] + alpha * p[: c.n_values].sum() / c.n_values
        probs[c.column] = p
    return Marginals(probs, DEFAULT_MAX_ATOMS, grid), grid


def _tv(a: np.ndarray, b: np.ndarray, lo: float, hi: float, bins: int) -> float:
    """Total variation on `bins` equal bins of [lo, hi], values clipped into the end bins."""
    edges = np.linspace(lo, hi, bins + 1)
    p = np.histogram(np.clip(a, lo, hi), edges)[0] / a.size
    q = np.histogram(np.clip(b, lo, hi), edges)[0] / b.size
    return 0.5 * float(np.abs(p - q).sum())


def measure(shape: str, rows: int, high: float, epsilon: float, seeds: int) -> list[str]:
    """One table row per release, over `seeds` tables and every column."""
    found: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    nm = mech.noise_for_epsilon(epsilon, DELTA)
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        real = {
            f"x{j}": np.clip(rng.normal(7.0, 1.1, rows), 3.0, 11.0)
            if shape == "concentrated"
            else np.clip(rng.gamma(2.0, high / 8, rows), 0.0, high)
            for j in range(COLUMNS)
        }
        schema = Schema.validated(
            {
                "dataset": {"name": "tails", "expected_rows": rows},
                "columns": [{"name": k, "type": "numeric", "bounds": [0, high]} for k in real],
            }
        )
        df = pl.DataFrame(real)
        flat, grid = flat_release(df, schema, nm)
        variants = {("flat", grid): flat, ("tree", mech.DEFAULT_GRID_BINS): mech.dp_marginals(df, schema, nm)}
        for key, marg in variants.items():
            sample = CopulaCodec(schema, marg).decode(rng.random((SAMPLES, COLUMNS)))
            for col, r in real.items():
                x = sample[col].to_numpy()
                found.setdefault(key, []).append(
                    (
                        float(np.mean((x < r.min()) | (x > r.max()))),
                        float(x.std() / r.std()),
                        _tv(x, r, 0.0, high, 20),
                        _tv(x, r, float(r.min()), float(r.max()), 100),
                    )
                )
    out = []
    for (name, grid), vals in found.items():
        a = np.array(vals)
        out.append(
            f"| {shape} | {rows:,} | 0..{high:g} | {epsilon:g} | {name} ({grid}) | "
            f"{100 * a[:, 0].mean():.3f}% / {100 * a[:, 0].max():.2f}% | "
            f"{a[:, 1].min():.2f} / {np.median(a[:, 1]):.2f} / {a[:, 1].max():.2f} | "
            f"{a[:, 2].mean():.4f} | {a[:, 3].mean():.4f} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    rows = [
        "| data | rows | public bounds | epsilon (marginals) | release (grid) | "
        "outside the real range, mean / max | std ratio min / median / max | TV, 20 bins on the bounds | "
        "TV, 100 bins on the real range |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in ("concentrated", "wide"):
        for n, high, eps in CASES:
            rows += measure(shape, n, high, eps, args.seeds)
    notes = [
        f"{COLUMNS} numeric columns per table; concentrated: N(7, 1.1) clipped to [3, 11]; wide: Gamma(2, bound / 8) "
        f"clipped to the bounds; {args.seeds} tables per case, every column pooled; the copula's inverse CDFs only, "
        f"no flow; {SAMPLES:,} samples; delta {DELTA:g}. Outside = share of samples outside the real [min, max]. "
        "The clipping puts point masses at 3 and 11 (concentrated), whose cells are half outside the real range.",
    ]
    title = "DP marginals alone on sparse and wide domains: flat release against the tree"
    text = "\n".join(common.header(title, started, load, notes, commit) + rows)
    common.publish(text + "\n", args.out)


if __name__ == "__main__":
    main()
