"""DP per-column marginals over the public cells: one Gaussian release of every column's
histogram, with a tree of block counts over each ordered column.

What is released. For each column j of the schema, the histogram of the rows over the
column's public cells (`privflow.data.copula.column_cells`: declared categories; every integer of a
small integer support, else a fine grid of integer runs; a fine grid of bins for numeric
columns, on the log1p scale where the schema says so; a cell of its own for each of the
schema's declared point masses, `atoms`; a null cell for a nullable column). An ordered column
(integer or numeric) with more than `hierarchy.BRANCHING` value cells also releases the levels
of a tree over its value cells (`privacy/mechanisms/hierarchy.py`, `tree_for`): the counts of
blocks of consecutive cells (on the default grid of 640 cells, blocks of 8 and the bounds'
twentieths, 32; blocks of 8, 64, ... cells otherwise). Everything is concatenated into one count vector
(`statistic`) and released once with the Gaussian mechanism (exact sampler, `privacy.noise`
via `gaussian_mechanism`).

Sensitivity (add/remove one row, docs/architecture.md, privacy rule 1). Every row lands in exactly
one cell of every column (out-of-bounds values are clipped to the bounds, null goes to the
null cell; both are per-row maps fixed by the schema) and, in a tree column, in one block of
every level above it: adding or removing a row changes sum_j L_j coordinates by exactly 1
each, where L_j is column j's depth (1 without a tree, the tree's levels with the cells
otherwise; a null row touches only the null cell, 1 <= L_j). L2 sensitivity
sqrt(sum_j L_j) (`marginals_sensitivity`). The event is ``GaussianEvent(noise_multiplier)``,
noise std = noise_multiplier * sqrt(sum_j L_j) per count; tests/privacy/test_dp_marginals.py
checks the shift of one row and the zCDP map against OpenDP's.

Post-processing (no privacy cost; uses only the noisy vector and public constants):

1. The row count N is estimated from the d columns' noisy totals (a flat column: the sum of
   its cells, variance K_j sigma^2; a tree column: its top level's estimates plus the null
   cell), by their inverse-variance weighted mean, floored at 1.
2. A column without a tree (categories, and few cells) is projected (Euclidean) onto
   {c >= 0, sum c = N}: c_k = max(y_k - tau, 0) with tau set so the total is N ("Norm-Sub",
   Wang et al. 2020, NDSS): every category keeps its count minus tau, and most noise-only
   cells go to exactly zero. A tree column's cells come from the tree's estimate
   (`hierarchy.Tree.estimate`): blocks that noise alone explains are zero, with every cell
   under them; where the rows are too few to place among a block's cells, the block's mass is
   spread evenly over them. So a column whose rows fill 5% of its public bounds keeps its
   synthetic values there, and a thin tail keeps its mass in the blocks that hold it.
3. Divide by N: a probability vector per column (`privflow.data.copula.Marginals`); the missing
   pattern is raked to its columns' own null shares (`with_pattern_nulls`).
4. Numeric columns only: a small mass (`DENSITY_FLOOR`) spread evenly over the value cells
   under the tree's coarse blocks that hold rows (`Tree.occupied_top`), and a far smaller one
   (`DENSITY_FLOOR_FAR`) over all of them (`with_density_floor`), so that no value inside the
   bounds has density 0.

Cost: `dp_marginals_event(noise_multiplier)`; `noise_for_epsilon(epsilon, delta)` calibrates a
standalone release; the plan stage calibrates its share of the total like dp_stats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from privflow.data.copula import DEFAULT_GRID_BINS, DEFAULT_MAX_ATOMS, Cells, Marginals, cell_index, schema_cells
from privflow.data.schema import Schema
from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon
from privflow.privacy.accounting.events import GaussianEvent
from privflow.privacy.mechanisms.gaussian import gaussian_event, gaussian_mechanism
from privflow.privacy.mechanisms.hierarchy import BRANCHING, Tree, project_to_total, tree_for

COUNT_CHUNK_ROWS = 500_000  # rows per chunk of the cell index (bounded memory on large tables)
RAKE_ROUNDS = 50  # iterative proportional fitting of the missing pattern to its columns' null shares
# the numeric columns' density floor: this share of the mass spread over the value cells of the
# tree's coarse blocks that hold rows (`Tree.occupied_top`; all value cells without a tree) ...
DENSITY_FLOOR = 3e-4
# ... and this share over every value cell, so that no value inside the bounds has density 0
DENSITY_FLOOR_FAR = 1e-6


def tree_of(cells: Cells) -> Tree | None:
    """The tree over an ordered column's value cells, or None (categories, or too few cells to need one)."""
    if cells.kind == "categorical" or cells.n_values <= BRANCHING:
        return None
    return tree_for(cells.n_values)


def depth(cells: Cells) -> int:
    """Counts one row changes in this column's part of the release (module docstring)."""
    tree = tree_of(cells)
    return 1 if tree is None else tree.depth


def marginals_sensitivity(cells: Sequence[Cells]) -> float:
    """L2 sensitivity of the released vector (`statistic`) under add/remove: sqrt(sum of depths)."""
    if not cells:
        raise ValueError("need at least one column")
    return math.sqrt(sum(depth(c) for c in cells))


def _offsets(cells: Sequence[Cells]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([c.n_cells for c in cells])]).astype(np.int64)


def marginal_counts(
    df: pl.DataFrame, schema: Schema, *, max_atoms: int = DEFAULT_MAX_ATOMS, grid_bins: int = DEFAULT_GRID_BINS
) -> np.ndarray:
    """Every column's cell counts, concatenated in schema order (summed over chunks of rows, so
    the [rows, columns] cell index never exists for the whole table; a streamed run sums them
    over chunks of the table)."""
    cells = schema_cells(schema, max_atoms, grid_bins)
    off = _offsets(cells)
    counts = np.zeros(int(off[-1]), dtype=np.float64)
    for start in range(0, df.height, COUNT_CHUNK_ROWS):
        idx = cell_index(df.slice(start, COUNT_CHUNK_ROWS), cells) + off[:-1][None, :]
        counts += np.bincount(idx.ravel(), minlength=int(off[-1]))
    return counts


def statistic(counts: np.ndarray, cells: Sequence[Cells]) -> np.ndarray:
    """The vector released, from `marginal_counts`: per column its cells, then (a tree column)
    the tree's levels above them, top first."""
    off = _offsets(cells)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape != (int(off[-1]),):
        raise ValueError(f"expected {int(off[-1])} cell counts for these cells, got shape {counts.shape}")
    parts = []
    for j, c in enumerate(cells):
        own = counts[off[j] : off[j + 1]]
        tree = tree_of(c)
        parts += [own] if tree is None else [own, tree.upper_counts(own[: c.n_values])]
    return np.concatenate(parts)


def release_marginal_counts(
    df: pl.DataFrame,
    schema: Schema,
    noise_multiplier: float,
    *,
    max_atoms: int = DEFAULT_MAX_ATOMS,
    grid_bins: int = DEFAULT_GRID_BINS,
) -> np.ndarray:
    """One Gaussian release of the statistic (the only step that reads the rows)."""
    counts = marginal_counts(df, schema, max_atoms=max_atoms, grid_bins=grid_bins)
    return release_counts(counts, schema_cells(schema, max_atoms, grid_bins), noise_multiplier)


def release_counts(counts: np.ndarray, cells: Sequence[Cells], noise_multiplier: float) -> np.ndarray:
    """One Gaussian release of `statistic(counts)`, given `marginal_counts` on these cells (a
    streamed run sums them over chunks of the table: the same vector, so the same event)."""
    return gaussian_mechanism(statistic(counts, cells), marginals_sensitivity(cells), noise_multiplier)


def _column_parts(noisy: np.ndarray, cells: Sequence[Cells]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(the column's cells, its tree's upper levels) of the released vector, per column."""
    parts, at = [], 0
    for c in cells:
        tree = tree_of(c)
        upper = 0 if tree is None else tree.inner
        parts.append((noisy[at : at + c.n_cells], noisy[at + c.n_cells : at + c.n_cells + upper]))
        at += c.n_cells + upper
    if at != noisy.size:
        raise ValueError(f"expected {at} noisy counts for this schema, got {noisy.size}")
    return parts


def estimated_total(noisy: np.ndarray, cells: Sequence[Cells]) -> float:
    """Inverse-variance weighted mean of the d columns' noisy totals, >= 1."""
    return _total(noisy, cells)[0]


def _total(noisy: np.ndarray, cells: Sequence[Cells]) -> tuple[float, float]:
    """`estimated_total` and its standard deviation in units of the common noise std."""
    sums, variances = [], []
    for c, (own, upper) in zip(cells, _column_parts(np.asarray(noisy, dtype=np.float64), cells), strict=True):
        tree = tree_of(c)
        if tree is None:
            sums.append(float(own.sum()))
            variances.append(float(c.n_cells))
        else:
            z, v = tree.bottom_up(own[: c.n_values], upper, 1.0)
            sums.append(float(z[0].sum() + own[c.n_values :].sum()))
            variances.append(float(v[0].sum()) + c.n_cells - c.n_values)
    w = 1.0 / np.array(variances)
    return max(float(np.sum(np.array(sums) * w) / np.sum(w)), 1.0), math.sqrt(1.0 / float(np.sum(w)))


def marginals_from_counts(
    noisy: np.ndarray,
    schema: Schema,
    noise_multiplier: float,
    *,
    max_atoms: int = DEFAULT_MAX_ATOMS,
    grid_bins: int = DEFAULT_GRID_BINS,
) -> Marginals:
    """Post-processing of the noisy vector into consistent per-column distributions (module
    docstring); `noise_multiplier` is the release's (public), which sets the trees' thresholds."""
    cells = schema_cells(schema, max_atoms, grid_bins)
    noisy = np.asarray(noisy, dtype=np.float64)
    parts = _column_parts(noisy, cells)
    total, total_sd = _total(noisy, cells)
    sigma = noise_multiplier * marginals_sensitivity(cells)
    probs = {}
    for c, (own, upper) in zip(cells, parts, strict=True):
        tree = tree_of(c)
        support = np.ones(c.n_values, dtype=bool)
        if tree is None:
            p = project_to_total(own, total) / total
        else:
            values, rest = tree.estimate(own[: c.n_values], upper, sigma, total, own[c.n_values :], sigma * total_sd)
            p = np.concatenate([values, rest]) / total
            support = tree.occupied_top(values)
        probs[c.column] = with_density_floor(p, c, support) if c.kind == "numeric" else p
    return Marginals(with_pattern_nulls(probs, cells), max_atoms, grid_bins)


def with_pattern_nulls(probs: dict[str, np.ndarray], cells: Sequence[Cells]) -> dict[str, np.ndarray]:
    """The missing pattern (privflow/data/missing_pattern.py) made to agree with its columns' own
    null shares: raked to them (iterative proportional fitting, Deming & Stephan 1940; RAKE_ROUNDS
    rounds), so its joint structure stays (a cell released as 0 stays 0) while each column's share
    of missing values is the one its own marginal released, a single noisy count rather than the sum
    of the 2^(k-1) pattern cells that hold it. A column never missing (share 0) takes its bit's cells
    to 0, which clears the noise mass the projection left there. Each column (a calendar column's
    parts each) then takes the raked pattern's share exactly. Post-processing of released
    probabilities."""
    pattern = next((c for c in cells if c.pattern), None)
    if pattern is None:
        return probs
    codes = np.arange(pattern.n_values)
    bits = [((codes >> i) & 1) == 1 for i in range(len(pattern.pattern))]
    own = {}
    for name in pattern.pattern:
        first = next(c for c in cells if (c.source or c.column) == name and not c.pattern)
        p = np.asarray(probs[first.column], dtype=np.float64)
        own[name] = float(p[first.n_values :].sum() / max(p.sum(), 1e-300)) if first.nullable else 0.0
    joint = np.array(probs[pattern.column], dtype=np.float64)
    for _ in range(RAKE_ROUNDS):
        for bit, name in zip(bits, pattern.pattern, strict=True):
            a = float(joint[bit].sum())
            if 0.0 < a < 1.0:
                joint[bit] *= own[name] / a
                joint[~bit] *= (1.0 - own[name]) / (1.0 - a)
            joint /= max(joint.sum(), 1e-300)
    out = dict(probs)
    out[pattern.column] = joint
    for bit, name in zip(bits, pattern.pattern, strict=True):
        share = float(joint[bit].sum())
        for c in cells:
            if (c.source or c.column) != name or c.pattern or not c.nullable:
                continue
            p = np.array(probs[c.column], dtype=np.float64)
            values = p[: c.n_values]
            total = float(values.sum())
            values = values / total if total > 0 else np.full(c.n_values, 1.0 / c.n_values)
            out[c.column] = np.concatenate([values * (1.0 - share), [share]])
    return out


def with_density_floor(p: np.ndarray, cells: Cells, support: np.ndarray) -> np.ndarray:
    """A numeric column's distribution with `DENSITY_FLOOR` of its value mass spread evenly over
    the value cells in `support` (those under the tree's coarse blocks that hold rows) and
    `DENSITY_FLOOR_FAR` over all of them; the null cell and the value cells' total are unchanged.

    Why: the release sets cells it cannot tell from empty to exactly 0, and a continuous column
    has no real holes inside the range of its rows: a held-out value in such a cell would get
    density 0 and an infinite negative log-likelihood (scores and DP-AD would call it an
    anomaly). The floor is a thousandfold smaller in the coarse blocks found empty, so it
    puts next to no synthetic value far from the rows; it costs at most `DENSITY_FLOOR` +
    `DENSITY_FLOOR_FAR` of total variation. Categories and
    integers keep their zeros (an absent category or a spike's empty neighbours are facts the
    release may state)."""
    k = cells.n_values
    out = np.array(p, dtype=np.float64)
    mass = float(out[:k].sum())
    where = np.flatnonzero(support) if np.any(support) else np.arange(k)
    if mass > 0:
        out[:k] *= 1.0 - DENSITY_FLOOR - DENSITY_FLOOR_FAR
        out[where] += DENSITY_FLOOR * mass / where.size
        out[:k] += DENSITY_FLOOR_FAR * mass / k
    return out


def dp_marginals(
    df: pl.DataFrame,
    schema: Schema,
    noise_multiplier: float,
    *,
    max_atoms: int = DEFAULT_MAX_ATOMS,
    grid_bins: int = DEFAULT_GRID_BINS,
) -> Marginals:
    """DP per-column marginals of a validated typed frame; costs `dp_marginals_event(noise_multiplier)`."""
    noisy = release_marginal_counts(df, schema, noise_multiplier, max_atoms=max_atoms, grid_bins=grid_bins)
    return marginals_from_counts(noisy, schema, noise_multiplier, max_atoms=max_atoms, grid_bins=grid_bins)


def dp_marginals_event(noise_multiplier: float) -> GaussianEvent:
    """One Gaussian release of the whole vector at L2 sensitivity `marginals_sensitivity`."""
    return gaussian_event(noise_multiplier)


def noise_for_epsilon(epsilon: float, delta: float) -> float:
    """Multiplier for a standalone (epsilon, delta) on this one release (analytic Gaussian)."""
    return gaussian_noise_for_epsilon(epsilon, delta)


__all__ = [
    "DENSITY_FLOOR",
    "DENSITY_FLOOR_FAR",
    "depth",
    "dp_marginals",
    "dp_marginals_event",
    "estimated_total",
    "marginal_counts",
    "marginals_from_counts",
    "marginals_sensitivity",
    "noise_for_epsilon",
    "release_counts",
    "release_marginal_counts",
    "statistic",
    "tree_of",
    "with_density_floor",
]
