"""Where do synthetic values outside the real range come from, and which post-processing of one
release of the DP marginals fixes it? (issue 37)

Tables whose rows fill a small part of their public bounds ("concentrated": N(7, 1.1) clipped
to [3, 11] under bounds 0..60, 0..100 or 0..160) and tables that fill them with a long tail
("wide": Gamma(2, bound / 8) clipped to the bounds) are released through the product's DP
marginals (`privacy/mechanisms/dp_marginals.py`: one Gaussian release of every column's cell
counts) and sampled through the copula's inverse CDFs alone: no flow. So any sample outside
the real range, and any inflated standard deviation, comes from the marginals.

Post-processings of the same noisy vector (all free: they read only the noisy counts and
public constants), each followed by the product's Norm-Sub projection and density floor:

- `product`: Norm-Sub alone (what the product does);
- `zeroed`: cells below sigma * Phi^-1(1 - 0.1 / K) set to 0 first;
- `tree-drop`: a top-down search of the dyadic tree over the cells; a block passes when its
  noisy sum exceeds sigma * sqrt(cells) * Phi^-1(1 - 0.1 / 2K); passing halves are searched, a
  block whose halves both fail is one unit (mass spread over it), a failing half is dropped;
- `tree-residual`: bottom-up: each level claims the not-yet-claimed cells of a block when
  their noisy sum passes the same kind of test (alpha 0.05, blocks up to K / 16 cells).

Each is run with the product's grid rule (`auto_grid_bins`) and with a grid 8 times finer.

    python -m benchmarks.diagnose_tails --out benchmarks/results/tails.md
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
from scipy import special

from benchmarks import bench_common as common
from privflow.data.copula import CopulaCodec, Marginals, schema_cells
from privflow.data.schema import Schema
from privflow.privacy.mechanisms import dp_marginals as mech

COLUMNS = 7  # like the measurements table of issue 37 (carat, depth, table, price, x, y, z)
DELTA = 1e-7  # the marginals' share of a run's delta, about
SAMPLES = 100_000
CASES = ((2_000, 160.0, 1.0), (2_000, 160.0, 0.3), (20_000, 100.0, 1.0), (54_000, 60.0, 1.0), (30_000, 100.0, 0.3))

Units = Callable[[np.ndarray, float], np.ndarray]


def zeroed_units(y: np.ndarray, std: float) -> np.ndarray:
    """One unit per cell above sigma * Phi^-1(1 - 0.1 / K); the others at 0."""
    z = float(special.ndtri(1.0 - 0.1 / y.size))
    unit = np.where(y > z * std, np.arange(y.size), -1)
    if (unit < 0).all():
        unit[int(np.argmax(y))] = 0
    return unit


def tree_drop_units(y: np.ndarray, std: float, alpha: float = 0.1) -> np.ndarray:
    """Top-down dyadic search; a failing half of a passing block is dropped (module docstring)."""
    k = int(y.size)
    unit = np.full(k, -1, dtype=np.int64)
    z = float(special.ndtri(1.0 - alpha / (2 * k)))
    csum = np.concatenate([[0.0], np.cumsum(y)])

    def passes(lo: int, hi: int) -> bool:
        return bool(csum[hi] - csum[lo] > z * std * math.sqrt(hi - lo))

    if not passes(0, k):
        unit[:] = 0
        return unit
    next_id, stack = 0, [(0, k)]
    while stack:
        lo, hi = stack.pop()
        mid = (lo + hi) // 2
        halves = [(a, b) for a, b in ((lo, mid), (mid, hi)) if b > a and passes(a, b)] if hi - lo > 1 else []
        if halves:
            stack.extend(halves)
        else:
            unit[lo:hi] = next_id
            next_id += 1
    return unit


def tree_residual_units(y: np.ndarray, std: float, alpha: float = 0.05, max_share: int = 16) -> np.ndarray:
    """Bottom-up: each level claims a block's unclaimed cells when their sum passes (module docstring)."""
    k = int(y.size)
    unit = np.full(k, -1, dtype=np.int64)
    levels = min(int(math.ceil(math.log2(k))) + 1 if k > 1 else 1, int(math.log2(max(1, k // max_share))) + 1)
    tests = sum(math.ceil(k / 2**level) for level in range(levels))
    z = float(special.ndtri(1.0 - alpha / tests))
    next_id = 0
    for level in range(levels):
        size = 2**level
        starts = np.arange(0, k, size)
        free = unit < 0
        sums = np.add.reduceat(np.where(free, y, 0.0), starts)
        counts = np.add.reduceat(free.astype(np.int64), starts)
        for b in np.nonzero((counts > 0) & (sums > z * std * np.sqrt(np.maximum(counts, 1))))[0]:
            lo = int(starts[b])
            mine = np.nonzero(free[lo : lo + size])[0] + lo
            unit[mine] = next_id
            next_id += 1
    if next_id == 0:
        unit[:] = 0
    return unit


def from_units(noisy: np.ndarray, schema: Schema, grid: int, std: float, units: Units) -> Marginals:
    """Each column: Norm-Sub over the units' noisy sums, a unit's count spread evenly over its
    cells, cells outside every unit at 0; then the product's density floor."""
    cells = schema_cells(schema, mech.DEFAULT_MAX_ATOMS, grid)
    off = np.concatenate([[0], np.cumsum([c.n_cells for c in cells])])
    total = mech.estimated_total(noisy, cells)
    probs = {}
    for j, c in enumerate(cells):
        y = noisy[off[j] : off[j + 1]]
        unit = units(y, std)
        n = int(unit.max()) + 1
        kept = unit >= 0
        sums = np.bincount(unit[kept], weights=y[kept], minlength=n)
        sizes = np.bincount(unit[kept], minlength=n)
        proj = mech.project_to_total(sums, total)
        p = np.zeros(y.size)
        p[kept] = proj[unit[kept]] / sizes[unit[kept]] / total
        probs[c.column] = mech.with_density_floor(p, c, total)
    return Marginals(probs, mech.DEFAULT_MAX_ATOMS, grid)


def _tv(a: np.ndarray, b: np.ndarray, lo: float, hi: float, bins: int) -> float:
    """Total variation on `bins` equal bins of [lo, hi], values clipped into the end bins."""
    edges = np.linspace(lo, hi, bins + 1)
    p = np.histogram(np.clip(a, lo, hi), edges)[0] / a.size
    q = np.histogram(np.clip(b, lo, hi), edges)[0] / b.size
    return 0.5 * float(np.abs(p - q).sum())


def measure(shape: str, rows: int, high: float, epsilon: float, seeds: int) -> list[str]:
    """One table row per (post-processing, grid rule), over `seeds` tables and every column."""
    found: dict[tuple[str, str, int], list[tuple[float, float, float, float]]] = {}
    nm = mech.noise_for_epsilon(epsilon, DELTA)
    std = nm * mech.marginals_sensitivity(COLUMNS)
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
        auto = mech.auto_grid_bins(rows, std)
        for rule, grid in (("auto", auto), ("auto x8", mech.auto_grid_bins(rows * 8, std))):
            noisy = mech.release_marginal_counts(pl.DataFrame(real), schema, nm, grid_bins=grid)
            variants: dict[str, Marginals] = {"product": mech.marginals_from_counts(noisy, schema, grid_bins=grid)}
            for name, units in (
                ("zeroed", zeroed_units),
                ("tree-drop", tree_drop_units),
                ("tree-residual", tree_residual_units),
            ):
                variants[name] = from_units(noisy, schema, grid, std, units)
            for name, marg in variants.items():
                sample = CopulaCodec(schema, marg).decode(rng.random((SAMPLES, COLUMNS)))
                for col, r in real.items():
                    x = sample[col].to_numpy()
                    found.setdefault((name, rule, grid), []).append(
                        (
                            float(np.mean((x < r.min()) | (x > r.max()))),
                            float(x.std() / r.std()),
                            _tv(x, r, 0.0, high, 20),
                            _tv(x, r, float(r.min()), float(r.max()), 100),
                        )
                    )
    out = []
    for (name, rule, grid), vals in found.items():
        a = np.array(vals)
        out.append(
            f"| {shape} | {rows:,} | 0..{high:g} | {epsilon:g} | {rule} ({grid}) | {name} | "
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
        "| data | rows | public bounds | epsilon (marginals) | grid rule (bins) | post-processing | "
        "outside the real range, mean / max | std ratio min / median / max | TV, 20 bins on the bounds | "
        "TV, 100 bins on the real range |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in ("concentrated", "wide"):
        for n, high, eps in CASES:
            rows += measure(shape, n, high, eps, args.seeds)
    notes = [
        f"{COLUMNS} numeric columns per table; concentrated: N(7, 1.1) clipped to [3, 11]; wide: Gamma(2, bound / 8) "
        f"clipped to the bounds; {args.seeds} tables per case, every column pooled; the copula's inverse CDFs only, "
        f"no flow; {SAMPLES:,} samples; delta {DELTA:g}. Outside = share of samples outside the real [min, max].",
    ]
    title = "DP marginals alone on sparse and wide domains"
    text = "\n".join(common.header(title, started, load, notes, commit) + rows)
    common.publish(text + "\n", args.out)


if __name__ == "__main__":
    main()
