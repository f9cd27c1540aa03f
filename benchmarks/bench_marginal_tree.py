"""Where the 20-bin marginal error of privflow's DP marginals comes from, beside MST's (issue 44):
the grid's cells and the tree's shape.

    .venv/bin/python -m benchmarks.bench_marginal_tree [--tables storms weather diamonds] [--repeats 3]
                                                        [--out benchmarks/results/marginal_tree.md]

For each table of benchmarks/tables.py (its public schema, its training split): the mean over
columns of the 20-bin TVD (public bounds, `marginal_tv`) between the real training rows and as
many rows drawn from the released per-column marginals alone (the copula codec decoding
independent uniforms: no flow), for

- the marginals without noise (a noise multiplier of 1e-4) on grids of 512 and 640 cells: the
  cells' and the draws' own error, the floor any i.i.d. synthetic table of this size has (512
  cells straddle the 20 bins' edges, and values recorded at round numbers are drawn across them);
- the DP marginals at the noise multiplier of a standalone epsilon 0.5 (the marginals' share of a
  run at epsilon 1, composed alone: a little more noise than the plan's), with the grid
  (`marginals.grid_bins`: 640, the default; 512, the default below 1,000 expected rows and
  every table's before; 1280), the tree's branching factor
  (privacy/mechanisms/hierarchy.py `BRANCHING`, 8; 4 and 32) and its false-block rate
  (`FALSE_BLOCK`, 0.05; 0.5) varied.

Beside each mean 20-bin TVD, the mean fine TV (100 bins on the real range, `range_fidelity`).

Each DP row is the mean (and spread) over `--repeats` releases. Diagnostics on real rows: not
differentially private.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_common, tables

NOISE_EPSILON, DELTA = 0.5, 1e-5
VARIANTS = {  # label: (grid cells, branching, false-block rate, tree levels)
    "640 cells, twentieths on top, false-block 0.05 (the default from 1,000 expected rows)": (
        640, 8, 0.05, "twentieths"),
    "640 cells, twentieths under fifths": (640, 8, 0.05, "fifths"),
    "640 cells, 8-ary blocks (2, 10, 80: the default before)": (640, 8, 0.05, "b-ary"),
    "512 cells (the default below 1,000 rows)": (512, 8, 0.05, "twentieths"),
    "1280 cells": (1280, 8, 0.05, "twentieths"),
    "4 children": (640, 4, 0.05, "b-ary"),
    "32 children": (640, 32, 0.05, "b-ary"),
    "false-block 0.5": (640, 8, 0.5, "twentieths"),
}  # fmt: skip


def tvd20(model: Any, train: Any, marginals: Any, seed: int) -> dict[str, float]:
    """Per column, the 20-bin TVD of `train.height` draws from `marginals` alone, and under the
    key FINE the mean fine TV of those draws."""
    from privflow.data.copula import CopulaCodec
    from privflow.tasks.evaluation.fidelity import marginal_tv, range_fidelity

    codec = CopulaCodec(model, marginals)
    frame = codec.decode(np.random.default_rng(seed).random((train.height, codec.dim)))
    out = marginal_tv(model, train, frame, n_bins=20)
    out[FINE] = float(range_fidelity(model, train, frame, n_bins=100)["range/tv_fine_mean"])
    return out


FINE = "(fine TV)"


def one_table(name: str, repeats: int) -> list[str]:
    from privflow.data.lowering import lower
    from privflow.privacy.mechanisms import dp_marginals, hierarchy

    schema, train, _ = tables.load_table(tables.TABLES[name])
    model = lower(schema)
    noise = dp_marginals.noise_for_epsilon(NOISE_EPSILON, DELTA)
    rows: list[tuple[str, list[dict[str, float]]]] = []
    for grid in (640, 512):
        exact = dp_marginals.dp_marginals(train, model, 1e-4, grid_bins=grid)
        rows.append((f"no noise, {grid} cells", [tvd20(model, train, exact, r) for r in range(repeats)]))
    saved = hierarchy.BRANCHING, hierarchy.FALSE_BLOCK, dp_marginals.tree_for
    trees = {
        "twentieths": hierarchy.tree_for,
        "fifths": lambda n: hierarchy.Tree(n, fanouts=hierarchy.twentieths_fanouts(n) or ()),
        "b-ary": hierarchy.Tree,
    }
    try:
        for label, (grid, branching, false_block, levels) in VARIANTS.items():
            hierarchy.BRANCHING = dp_marginals.BRANCHING = branching
            hierarchy.FALSE_BLOCK = false_block
            dp_marginals.tree_for = trees[levels]  # type: ignore[assignment]
            runs = [
                tvd20(model, train, dp_marginals.dp_marginals(train, model, noise, grid_bins=grid), r)
                for r in range(repeats)
            ]
            rows.append((label, runs))
    finally:
        hierarchy.BRANCHING = dp_marginals.BRANCHING = saved[0]
        hierarchy.FALSE_BLOCK, dp_marginals.tree_for = saved[1:]
    columns = [c for c in rows[0][1][0] if c != FINE]
    out = [
        f"## {name} ({train.height:,} training rows; noise multiplier {noise:.2f})",
        "",
        "| marginals | mean 20-bin TVD | spread (std over releases) | fine TV | " + " | ".join(columns) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(columns),
    ]
    for label, runs in rows:
        means = [float(np.mean([r[c] for c in columns])) for r in runs]
        per = [float(np.mean([r[c] for r in runs])) for c in columns]
        cells = " | ".join(f"{v:.4f}" for v in per)
        fine = float(np.mean([r[FINE] for r in runs]))
        out.append(f"| {label} | {np.mean(means):.4f} | {np.std(means):.4f} | {fine:.4f} | {cells} |")
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = ["storms", "weather", "diamonds", "slid", "attrition", "penguins"]
    p.add_argument("--tables", nargs="+", default=default, choices=list(tables.TABLES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    started, load_before, commit = datetime.now(UTC), bench_common.load_average(), bench_common.git_commit()
    body: list[str] = []
    for name in args.tables:
        body += one_table(name, args.repeats)
        print(f"[marginal_tree] {name} done", flush=True)
    notes = [
        "Draws from the released marginals alone (no flow), as many as the training rows, scored by the 20-bin "
        "TVD over the public bounds against the training rows (benchmarks/tables.py's schemas)",
        f"DP rows: the noise multiplier of a standalone epsilon {NOISE_EPSILON:g} (delta {DELTA:g}); "
        f"{args.repeats} releases each",
    ]
    head = bench_common.header("The DP marginals' 20-bin error by grid and tree", started, load_before, notes, commit)
    bench_common.publish("\n".join(head + body), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
