"""DP per-column marginals over the public cells: one Gaussian release of every column's histogram.

What is released. For each column j of the schema, the histogram of the rows over the
column's public cells (`privflow.data.copula.column_cells`: declared categories; every integer of a
small integer support, else a fine grid of integer runs; a fine grid of bins for numeric
columns, on the log1p scale where the schema says so; a cell of its own for each of the
schema's declared point masses, `atoms`; a null cell for a nullable column).
The d histograms are concatenated into one count vector and released once with the
Gaussian mechanism (exact sampler, `privacy.noise` via `gaussian_mechanism`).

Sensitivity (add/remove one row, docs/privacy.md privacy rule 1). Every row lands in exactly
one cell of every column (out-of-bounds values are clipped to the bounds, null goes to the
null cell; both are per-row maps fixed by the schema), so adding or removing a row changes d
coordinates of the count vector by exactly 1 each: L2 sensitivity sqrt(d), L1 sensitivity d
(`marginals_sensitivity`). The event is
``GaussianEvent(noise_multiplier)``, noise std = noise_multiplier * sqrt(d) per cell.
Equivalently, d per-column releases at that std compose in zCDP to d * 1 / (2 nm^2 d) =
1 / (2 nm^2), the event's rho; tests/privacy/test_dp_marginals.py checks both against
OpenDP's maps (make_count_by_categories for the per-column stability, make_gaussian for
the noise).

Post-processing (no privacy cost; uses only the noisy vector and public constants):

1. The row count N is estimated from the d noisy column totals, each unbiased with
   variance K_j sigma^2 (K_j cells), by their inverse-variance weighted mean, floored at 1.
   Small categorical columns dominate it, so it is far more accurate than a fine-grid
   column's own noisy total.
2. Each column's noisy histogram is projected (Euclidean) onto {c >= 0, sum c = N}:
   c_k = max(y_k - tau, 0) with tau set so the total is N. This is "Norm-Sub" (Wang et al.
   2020, "Locally Differentially Private Frequency Estimation with Consistency", NDSS), the
   least-squares consistent histogram. Why this and not clip-and-renormalise or smoothing:
   clip-and-renormalise keeps the positive half of the noise in every empty cell, which on a
   1024-cell grid with few occupied cells spreads a large share of the mass uniformly (mass
   piling where there is none, e.g. between a loan term's 12/24/36/48/60); the projection
   subtracts a common threshold tau, so most noise-only cells go to exactly zero while every
   cell well above the noise (a spike, a point mass at 0) keeps its count minus tau (on a
   loan term's spikes, and on the Adult demo's log-grid capital-gain column, it leaves far
   less mass between the spikes than clip-and-renormalise does). Smoothing or
   a tree over the grid would blur exactly those spikes (and a hierarchical release would
   spend more sensitivity, one count per level per column); the grid is already public and
   fine, so nothing is gained for the columns that matter most.
3. Divide by N: a probability vector per column (`privflow.data.copula.Marginals`).
4. Numeric columns only: one row's worth of mass (1 / N) spread evenly over the value cells
   (`with_density_floor`), so that no value inside the public bounds has density 0.

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

COUNT_CHUNK_ROWS = 500_000  # rows per chunk of the cell index (bounded memory on large tables)


def marginals_sensitivity(d: int) -> float:
    """L2 sensitivity of the concatenated count vector of d columns under add/remove: sqrt(d)."""
    if d < 1:
        raise ValueError(f"need at least one column, got d={d}")
    return math.sqrt(d)


def auto_grid_bins(expected_rows: int | None, noise_std: float, low: int = 16, high: int = 512) -> int:
    """Grid resolution from PUBLIC quantities: the schema's expected_rows and the release's noise std.

    Every occupied grid cell carries its own noise, so a finer grid trades resolution for
    noise (module docstring): on the Adult demo a small marginals budget comes closer to the
    empirical marginals with a coarser grid than with the finest, and a large one is best with
    the finest. The rule keeps the noise small against the count of an evenly spread cell: the
    power of two nearest expected_rows / (8 * noise_std), in [low, high] (128 on Adult at
    epsilon 0.5 for the marginals; 16 for a table of a thousand rows). Integer
    supports up to `max_atoms` keep one cell per value whatever the grid. Without a declared
    expected_rows the default grid is used.
    """
    if expected_rows is None or not noise_std > 0:
        return DEFAULT_GRID_BINS
    target = max(float(expected_rows) / (8.0 * noise_std), 1.0)
    return int(min(max(2 ** round(math.log2(target)), low), high))


def _offsets(cells: Sequence[Cells]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([c.n_cells for c in cells])]).astype(np.int64)


def marginal_counts(
    df: pl.DataFrame, schema: Schema, *, max_atoms: int = DEFAULT_MAX_ATOMS, grid_bins: int = DEFAULT_GRID_BINS
) -> np.ndarray:
    """The noiseless statistic: every column's cell counts, concatenated in schema order (summed
    over chunks of rows, so the [rows, columns] cell index never exists for the whole table)."""
    cells = schema_cells(schema, max_atoms, grid_bins)
    off = _offsets(cells)
    counts = np.zeros(int(off[-1]), dtype=np.float64)
    for start in range(0, df.height, COUNT_CHUNK_ROWS):
        idx = cell_index(df.slice(start, COUNT_CHUNK_ROWS), cells) + off[:-1][None, :]
        counts += np.bincount(idx.ravel(), minlength=int(off[-1]))
    return counts


def release_marginal_counts(
    df: pl.DataFrame,
    schema: Schema,
    noise_multiplier: float,
    *,
    max_atoms: int = DEFAULT_MAX_ATOMS,
    grid_bins: int = DEFAULT_GRID_BINS,
) -> np.ndarray:
    """One Gaussian release of `marginal_counts` (the only step that reads the rows)."""
    return release_counts(
        marginal_counts(df, schema, max_atoms=max_atoms, grid_bins=grid_bins), schema, noise_multiplier
    )


def release_counts(counts: np.ndarray, schema: Schema, noise_multiplier: float) -> np.ndarray:
    """One Gaussian release of the statistic `marginal_counts`, given as counts (a streamed run
    sums them over chunks of the table: the same vector, so the same event)."""
    return gaussian_mechanism(counts, marginals_sensitivity(len(schema.columns)), noise_multiplier)


def project_to_total(y: np.ndarray, total: float) -> np.ndarray:
    """Euclidean projection of y onto {c >= 0, sum c = total} (Norm-Sub; Duchi et al. 2008, fig. 1)."""
    y = np.asarray(y, dtype=np.float64)
    if not total > 0:
        raise ValueError(f"total must be positive, got {total}")
    s = np.sort(y)[::-1]
    cs = np.cumsum(s) - total
    j = np.arange(1, s.size + 1)
    rho = int(np.nonzero(s - cs / j > 0)[0][-1])
    tau = cs[rho] / (rho + 1)
    return np.maximum(y - tau, 0.0)


def estimated_total(noisy: np.ndarray, cells: Sequence[Cells]) -> float:
    """Inverse-variance weighted mean of the d noisy column totals (each has variance K_j sigma^2), >= 1."""
    off = _offsets(cells)
    sums = np.add.reduceat(np.asarray(noisy, dtype=np.float64), off[:-1])
    k = np.array([c.n_cells for c in cells], dtype=np.float64)
    return max(float(np.sum(sums / k) / np.sum(1.0 / k)), 1.0)


def marginals_from_counts(
    noisy: np.ndarray, schema: Schema, *, max_atoms: int = DEFAULT_MAX_ATOMS, grid_bins: int = DEFAULT_GRID_BINS
) -> Marginals:
    """Post-processing of the noisy vector into consistent per-column distributions (module docstring)."""
    cells = schema_cells(schema, max_atoms, grid_bins)
    off = _offsets(cells)
    noisy = np.asarray(noisy, dtype=np.float64)
    if noisy.shape != (int(off[-1]),):
        raise ValueError(f"expected {int(off[-1])} noisy counts for this schema, got shape {noisy.shape}")
    total = estimated_total(noisy, cells)
    probs = {}
    for j, c in enumerate(cells):
        p = project_to_total(noisy[off[j] : off[j + 1]], total) / total
        probs[c.column] = with_density_floor(p, c, total) if c.kind == "numeric" else p
    return Marginals(probs, max_atoms, grid_bins)


def with_density_floor(p: np.ndarray, cells: Cells, total: float) -> np.ndarray:
    """A numeric column's distribution with one row's worth of mass (1 / total, the DP row count)
    spread evenly over its value cells; the null cell and the value cells' total are unchanged.

    Why: the projection sets noise-only grid cells to exactly 0, and a continuous column has no
    real holes inside its bounds: a held-out value in such a cell would get density 0 and an
    infinite negative log-likelihood (as some of the pinwheel test points did). The
    floor costs at most 1 / total of total variation. Categories and integers keep their zeros
    (an absent category or a spike's empty neighbours are facts the release may state)."""
    k = cells.n_values
    out = np.array(p, dtype=np.float64)
    mass = float(out[:k].sum())
    alpha = min(1.0, 1.0 / max(total, 1.0))
    if mass > 0:
        out[:k] = (1.0 - alpha) * out[:k] + alpha * mass / k
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
    return marginals_from_counts(noisy, schema, max_atoms=max_atoms, grid_bins=grid_bins)


def dp_marginals_event(noise_multiplier: float) -> GaussianEvent:
    """One Gaussian release of the whole count vector at L2 sensitivity sqrt(d)."""
    return gaussian_event(noise_multiplier)


def noise_for_epsilon(epsilon: float, delta: float) -> float:
    """Multiplier for a standalone (epsilon, delta) on this one release (analytic Gaussian)."""
    return gaussian_noise_for_epsilon(epsilon, delta)


__all__ = [
    "auto_grid_bins",
    "dp_marginals",
    "dp_marginals_event",
    "estimated_total",
    "marginal_counts",
    "marginals_from_counts",
    "marginals_sensitivity",
    "noise_for_epsilon",
    "project_to_total",
    "release_counts",
    "release_marginal_counts",
    "with_density_floor",
]
