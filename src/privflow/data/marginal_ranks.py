"""A number as its released marginal's CDF: the target head's scale where DP marginals exist.

Why. The head's numeric features are scaled by the column's PUBLIC bounds
(`privflow.data.features.scaled`), and public bounds are wide: penguins' bill lengths (32-60 mm)
fill 28% of [0, 100] mm, so most of the hat basis's equally spaced knots fall where no row is,
and the few rows' features differ by less than the clipped, noisy gradient can resolve. The
released marginal's CDF F maps the same values onto [0, 1] by rank: the knots become the
marginal's quantiles, the rows fill the whole range, and the head bends where the rows are.

Privacy. F is post-processing of the DP marginals (a release) and x -> F(x) a per-row map fixed
by it, so the head's DP-SGD keeps its sensitivity and event (privacy/mechanisms/dp_head.py); the
marginals are spent before the head (tasks/fit.py), and the released head scores a row through
the marginals its codec holds.

F at a value: the mass of the value cells below the value's cell, plus its position inside the
cell times the cell's mass (the cells' piecewise-linear CDF; the middle of a cell whose position
is drawn, an atom or a run of integers), over the value cells' mass. A missing value keeps its
public-scale feature (0) beside its missing flag; a column released through calendar parts
(privflow/data/calendar.py), or without a marginal, keeps the public scale.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from privflow.data import calendar
from privflow.data.copula import Cells, Marginals, cell_positions, column_cells
from privflow.data.schema import Schema


def rank_features(
    compact: np.ndarray, schema: Schema, df: pl.DataFrame, marginals: Marginals, exclude: tuple[str, ...]
) -> np.ndarray:
    """`compact` (`privflow.data.features.compact_features(schema, df, exclude)`) with each
    numeric column's scaled value replaced, in place, by its marginal's CDF (module docstring);
    returned for chaining."""
    parts = calendar.schema_parts(schema, marginals.max_atoms) if marginals.calendar_parts else {}
    j = 0
    for col in schema.columns:
        if col.name in exclude:
            continue
        if col.is_categorical:
            j += 1
            continue
        p = marginals.probs.get(col.name)
        if p is not None and col.name not in parts:
            cells = column_cells(col, marginals.max_atoms, marginals.grid_bins)
            compact[:, j] = _cdf_at(np.asarray(p, dtype=np.float64), cells, df.get_column(col.name), compact[:, j])
        j += 2 if col.nullable else 1
    return compact


def _cdf_at(p: np.ndarray, cells: Cells, s: pl.Series, kept: np.ndarray) -> np.ndarray:
    """[n] F(x) of the rows' values; `kept` (the public-scale feature) where a value is missing."""
    n_values = cells.n_values
    if p.shape != (cells.n_cells,):
        raise ValueError(f"marginal of column '{s.name}' has {p.size} entries, its cells number {cells.n_cells}")
    values = np.maximum(p[:n_values], 0.0)
    mass = float(values.sum())
    if not mass > 0:
        return kept
    before = np.concatenate([[0.0], np.cumsum(values)])
    idx, pos = cell_positions(s, cells)
    present = idx < n_values
    at = np.minimum(idx, n_values - 1)
    if cells.kind == "integer":  # a run of integers: the integer's offset in it -> the middle of its slot
        pos = (pos + 0.5) / np.maximum(cells.ends[at] - cells.starts[at], 1)
    u = (before[at] + values[at] * np.nan_to_num(pos, nan=0.5)) / mass
    return np.where(present, np.clip(u, 0.0, 1.0), kept)


__all__ = ["rank_features"]
