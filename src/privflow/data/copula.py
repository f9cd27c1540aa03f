"""Copula codec: every column through its DP marginal CDF into (0, 1), and back by inverse CDF.

The flow learns the dependence between columns; the marginals come from one DP release
(`privacy/mechanisms/dp_marginals.py`). Encoding a column through its released CDF and
decoding through the inverse makes the synthetic marginals equal the released ones by
construction (a Gaussian/uniform copula; Nelsen, "An Introduction to Copulas", ch. 2), so
the flow no longer has to learn spiky integer columns, many-valued categoricals or mass
at the public bounds.

Cells (public: fixed by the schema and two public integers, never by the rows).
Each column's marginal is a probability vector over its cells, in this order:

- categorical: one cell per declared category (declared order);
- integer: cells are runs of consecutive integers [a_k, b_k). If the support
  ceil(lo)..floor(hi) has at most `max_atoms` values, every integer is its own cell (an
  atom: spikes such as a loan term 12/24/36/48/60 and point masses such as a capital
  gain of 0 are kept exactly). Otherwise cell k holds the integers v with e_k <= t(v) <
  e_k+1, for `grid_bins` equal-width bins e of [lo, hi] on the column's scale t (identity or
  log1p), the last one holding hi; empty cells are dropped (on a log scale the first cells are
  then single integers, e.g. 0, 1, 2, ...). The bins are the public summaries' (20 bins of
  [lo, hi]), so no run straddles a summary's edge (releases made before `aligned_runs` binned
  [lo, hi + 1) and rounded the edges). Each of the schema's declared `atoms` is cut out as a
  single integer of its own;
- numeric: `grid_bins` equal-width bins of [lo, hi] on the column's scale (t = identity or
  log1p), and a zero-width cell [a, a] for each declared atom a (a public point mass: 0 for
  an amount that is often exactly zero, a default value), which holds the rows equal to a;
- a nullable column has one more cell, last, for null;
- a date or datetime (an integer column with `calendar_unit`) is the cells of its calendar
  parts, each an integer column of its own (privflow/data/calendar.py), and two or more
  nullable columns add one categorical column, last, for their joint missing pattern
  (privflow/data/missing_pattern.py): `schema_cells`. Decoding writes a calendar column back
  from its parts, and the pattern decides which values are null.

Encode (`CopulaCodec.encode`): a value in cell k, whose CDF interval is [F_k, F_k + p_k),
goes to F_k + p_k * r with r in [0, 1) its position inside the cell: for a category or an
integer atom r is a uniform draw from the explicit generator (dequantization inside the
atom's interval); for a run of integers r = (x - a_k + v) / (b_k - a_k), v uniform; for a
numeric bin r is the linear position of t(x) in the bin (no draw). Null is the null cell's
interval with a uniform draw, except in a column the missing pattern covers
(`Marginals.nulls_in_pattern`): there the pattern's cell alone says the value is missing, the
column's coordinate is the CDF of its values (its null cell's mass set aside), and a missing
value is a uniform draw in the band of width `Marginals.null_band` around 1/2 (`NULL_BAND`; 1:
the whole interval, releases made before the band). Where the pattern says a value is present
its coordinate keeps the value's relation to the other columns (with a null cell of its own in
the coordinate, the flow's draw and the pattern disagreed on some rows, and a value redrawn there
at random lost it). Why a band rather than the whole interval: spread over (0, 1), the missing
rows (75% of storms' hurricane category, 80% of weather's gust) taught the flow that the
coordinate is noise, and it learned no relation on the rest (category against wind, Spearman
0.92 real: 0.08 synthetic; trained on the hurricanes alone, 0.80); gathered in a narrow band
they are one cluster the flow sets apart (0.50, and storms' mean Pearson error 0.18 -> 0.12).
The band's draws are not uniform on (0, 1), so sampling ranks such a coordinate among the rows the
pattern says are present (`uniformize`), and the values' marginal holds by construction again.
u is clipped to [`U_MARGIN`, 1 - `U_MARGIN`], and with space="gaussian" mapped to z = Phi^-1(u).

Decode (`CopulaCodec.decode`): u -> cell by `searchsorted` on the CDF (side='right', so
cells of zero released mass are never chosen), r = (u - F_k) / p_k, and back to a label,
an integer (floor inside the run) or a number (linear on the t-scale inside the bin);
the null cell to null. decode(encode(df)) == df for categorical and integer columns;
numeric values come back within one bin (exactly, up to rounding, when their bin has
mass). Everything is vectorised numpy/polars; no per-row Python.

The codec is a pure function of the schema and the released `Marginals` (privacy rule 2):
it reads no statistic of the rows it encodes. Rows in a cell of zero released mass encode
to the point F_k (a measure-zero set; the alternative, mixing in a floor mass, would put
back values the release says are absent).

Randomness (privacy rule 6): `encode` draws from the generator it is given; for private rows
pass one seeded from the OS CSPRNG (`privacy.noise.secret_seed`) and use it for nothing else.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl

from privflow.core.errors import DataError
from privflow.data import calendar
from privflow.data import missing_pattern as pattern
from privflow.data.schema import Column, Schema

DEFAULT_MAX_ATOMS = 1024
# 640 = 5 x 2^7 cells: a multiple of 10, 20, 40 and 80, so every edge of an equal-width summary
# of the bounds at those counts is a cell edge, and with round bounds the cells' edges fall on
# round values (100 / 640 = 0.15625: 1, 5, 55 and 0.5 are edges). Values recorded at round
# numbers (a visibility of 0.5 miles, a 1.00 carat stone, a table of 55%) then stay on their side
# of such an edge instead of being drawn across it from a straddling cell, as 512 cells did
# (benchmarks/results/marginal_tree.md: the 20-bin TVD of diamonds' marginals without noise,
# 0.012 at 512 and 0.003 at 640; the fine TV better too). It costs one more level of the tree
# (640, 80, 10, 2 blocks), which the release's noise pays for on tables of a few hundred rows.
# Not 1024 or more: every occupied bin carries its own noise. Integer supports up to
# `max_atoms` stay exact.
DEFAULT_GRID_BINS = 640
# u stays this far inside (0, 1): Phi^-1 is then within about +-6, and never infinite.
U_MARGIN = 1e-9
NULL_BAND = 0.02  # a missing value's coordinate, where the pattern covers its column: a draw in (1 - b, 1 + b) / 2

Space = Literal["uniform", "gaussian"]


def _ndtri(u: np.ndarray) -> np.ndarray:
    """Phi^-1 (space="gaussian" only): scipy is imported on first use, not by every sampler's
    start-up (the default uniform space never needs it)."""
    from scipy import special

    return special.ndtri(u)


def _ndtr(x: np.ndarray) -> np.ndarray:
    """Phi (space="gaussian" only; see `_ndtri`)."""
    from scipy import special

    return special.ndtr(x)


def _t(x: Any, transform: str) -> Any:
    return np.log1p(x) if transform == "log1p" else x


def _t_inv(v: Any, transform: str) -> Any:
    return np.expm1(v) if transform == "log1p" else v


# ---------------------------------------------------------------------------- public cells


@dataclass(frozen=True, eq=False)
class Cells:
    """The public cells of one column's marginal (module docstring, "Cells").

    kind "categorical": `labels`; "integer": integer runs [starts[k], ends[k]); "numeric":
    bin edges `edges` (length n_values + 1) on the t-scale. The null cell, if any, is last.
    """

    column: str
    kind: Literal["categorical", "integer", "numeric"]
    nullable: bool
    transform: str = "none"
    labels: tuple[str, ...] = ()
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bounds: tuple[float, float] | None = None
    atoms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # numeric: declared point masses, sorted
    atom_cells: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # and their cells
    step: float | None = None  # numeric: 10^-decimals where the schema declares decimals (the values' lattice)
    source: str | None = None  # a calendar part's column (privflow/data/calendar.py): the values it is read from
    part: str | None = None  # ... which part of them
    unit: int | None = None  # ... and the seconds one of the source's units holds
    pattern: tuple[str, ...] = ()  # the missing pattern's cells (privflow/data/missing_pattern.py): its columns

    @property
    def n_values(self) -> int:
        if self.kind == "categorical":
            return len(self.labels)
        if self.kind == "integer":
            return int(self.starts.size)
        return int(self.edges.size - 1)

    @property
    def n_cells(self) -> int:
        return self.n_values + (1 if self.nullable else 0)

    def same_as(self, other: Cells) -> bool:
        """The same public cells: kind, labels, runs, edges and atoms alike (not just as many)."""
        return (self.column, self.kind, self.nullable, self.transform, self.labels, self.bounds, self.pattern) == (
            other.column,
            other.kind,
            other.nullable,
            other.transform,
            other.labels,
            other.bounds,
            other.pattern,
        ) and all(
            np.array_equal(a, b)
            for a, b in (
                (self.starts, other.starts),
                (self.ends, other.ends),
                (self.edges, other.edges),
                (self.atoms, other.atoms),
            )
        )

    @property
    def is_atomic(self) -> bool:
        """Every value cell is one point (a category or a single integer)."""
        return self.kind == "categorical" or (self.kind == "integer" and bool(np.all(self.ends - self.starts == 1)))


def column_cells(
    col: Column, max_atoms: int = DEFAULT_MAX_ATOMS, grid_bins: int = DEFAULT_GRID_BINS, aligned_runs: bool = True
) -> Cells:
    """The cells of `col` from the schema alone (module docstring, "Cells"). An integer column's
    runs: where `aligned_runs`, the integers between consecutive edges of the grid over its
    bounds [lo, hi] (as the summaries' bins are), so every 20th edge of the 640 is a 20-bin
    summary's edge and a spike at one (flights' departures at 6:00, 600 on [0, 2400]) is not
    drawn across it; releases made before spread the grid over [lo, hi + 1] and rounded."""
    if max_atoms < 1 or grid_bins < 1:
        raise ValueError(f"max_atoms and grid_bins must be >= 1, got {max_atoms}, {grid_bins}")
    if col.is_categorical:
        return Cells(col.name, "categorical", col.nullable, labels=tuple(col.categories or ()))
    lo, hi = col.bounds  # type: ignore[misc]
    if col.type == "numeric":
        edges = np.linspace(float(_t(lo, col.transform)), float(_t(hi, col.transform)), grid_bins + 1)
        atoms = np.unique(np.asarray(col.atoms, dtype=np.float64))
        t_atoms = np.asarray(_t(atoms, col.transform), dtype=np.float64)
        # each atom's edge twice (a grid edge it falls on once only): the cell between is [a, a]
        edges = np.sort(np.concatenate([edges[~np.isin(edges, t_atoms)], t_atoms, t_atoms]))
        cells = np.searchsorted(edges, t_atoms, side="left").astype(np.int64)
        return Cells(
            col.name,
            "numeric",
            col.nullable,
            col.transform,
            edges=edges,
            bounds=(float(lo), float(hi)),
            atoms=atoms,
            atom_cells=cells,
            step=None if col.decimals is None else 10.0 ** -int(col.decimals),
        )
    lo_i, hi_i = math.ceil(lo), math.floor(hi)  # at least one integer: the schema refuses bounds without
    if hi_i - lo_i + 1 <= max_atoms:
        starts = np.arange(lo_i, hi_i + 1, dtype=np.int64)
    else:
        if aligned_runs:  # the integers v with e_k <= t(v) < e_k+1: at each edge the smallest v with t(v) >= e
            t_edges = np.linspace(float(_t(lo, col.transform)), float(_t(hi, col.transform)), grid_bins + 1)
            cuts = np.maximum(np.floor(_t_inv(t_edges, col.transform)).astype(np.int64) - 1, lo_i)
            for _ in range(3):  # t_inv's rounding error is far below one integer
                cuts = np.where(_t(cuts.astype(np.float64), col.transform) < t_edges, cuts + 1, cuts)
        else:
            t_edges = np.linspace(float(_t(lo_i, col.transform)), float(_t(hi_i + 1, col.transform)), grid_bins + 1)
            cuts = np.rint(_t_inv(t_edges, col.transform)).astype(np.int64)
        cuts[0], cuts[-1] = lo_i, hi_i + 1
        atoms = np.asarray(col.atoms, dtype=np.int64)  # each its own run [a, a + 1)
        starts = np.unique(np.clip(np.concatenate([cuts[:-1], atoms, atoms + 1]), lo_i, hi_i))
    ends = np.append(starts[1:], hi_i + 1).astype(np.int64)
    return Cells(
        col.name, "integer", col.nullable, col.transform, starts=starts, ends=ends, bounds=(float(lo_i), float(hi_i))
    )


def schema_cells(
    schema: Schema,
    max_atoms: int = DEFAULT_MAX_ATOMS,
    grid_bins: int = DEFAULT_GRID_BINS,
    calendar_parts: bool = True,
    missing_pattern: bool = True,
    aligned_runs: bool = True,
) -> list[Cells]:
    """`column_cells` for every column, in schema order; a calendar column (a lowered date or
    datetime) as the cells of its parts (privflow/data/calendar.py) where `calendar_parts`, as one
    integer column otherwise; where `missing_pattern`, last, the cells of the nullable columns'
    missing pattern (privflow/data/missing_pattern.py), when two or more columns are nullable.
    Releases made before the parts, the pattern or the aligned runs existed set those flags False."""
    parts = calendar.schema_parts(schema, max_atoms) if calendar_parts else {}
    out: list[Cells] = []
    for c in schema.columns:
        if c.name not in parts:
            out.append(column_cells(c, max_atoms, grid_bins, aligned_runs))
            continue
        for p in parts[c.name]:
            cells = column_cells(calendar.part_column(c, p), max_atoms, grid_bins, aligned_runs)
            out.append(dataclasses.replace(cells, source=c.name, part=p.part, unit=c.calendar_unit))
    columns = pattern.pattern_columns(schema) if missing_pattern else ()
    if columns:
        labels = pattern.labels(len(columns))
        out.append(Cells(pattern.pattern_name(schema), "categorical", False, labels=labels, pattern=columns))
    return out


def cell_series(df: pl.DataFrame, cells: Cells) -> pl.Series:
    """The values `cells` are read from: the frame's column, or a calendar part of its source."""
    if cells.pattern:
        return pl.Series(cells.column, pattern.codes(df, cells.pattern)).cast(pl.String)
    if cells.source is None:
        return df.get_column(cells.column)
    units = _numbers(df.get_column(cells.source), cells.source)
    return pl.Series(cells.column, calendar.part_values(units, int(cells.unit or 1), str(cells.part)))


def frame_columns(cells: Sequence[Cells]) -> list[str]:
    """The frame's columns that `cells` read, each once, in order."""
    return list(dict.fromkeys(n for c in cells for n in (c.pattern or (c.source or c.column,))))


def _numbers(s: pl.Series, name: str) -> np.ndarray:
    try:
        return s.cast(pl.Float64).to_numpy().astype(np.float64)
    except Exception:
        raise DataError(
            f"Column '{name}': its {s.dtype} values are not numbers; pass the typed frame returned by validate()."
        ) from None


def cell_positions(s: pl.Series, cells: Cells) -> tuple[np.ndarray, np.ndarray]:
    """(cell index [n] int64, position inside the cell [n] in [0, 1] or NaN where a draw is needed).

    A per-row map fixed by the schema: each row lands in exactly one cell (values outside
    the public bounds are clipped to them, as the schema codec does). Raises DataError on a
    null in a non-nullable column or an undeclared category (validate the table first).
    """
    n = s.len()
    isnull = s.is_null().to_numpy()
    pos = np.full(n, np.nan)
    if cells.kind == "categorical":
        labels = list(cells.labels)
        codes = s.cast(pl.String).replace_strict(labels, list(range(len(labels))), default=None, return_dtype=pl.Int64)
        unknown = codes.is_null().to_numpy() & ~isnull
        if unknown.any():
            raise DataError(
                f"Column '{cells.column}': {int(unknown.sum())} value(s) are not in its declared "
                "categories; validate the table first."
            )
        idx = codes.fill_null(0).to_numpy().astype(np.int64)
    else:
        x = _numbers(s, cells.column)
        isnull = isnull | np.isnan(x)
        lo, hi = cells.bounds  # type: ignore[misc]
        xv = np.clip(np.where(isnull, lo, x), lo, hi)
        if cells.kind == "integer":
            xi = np.floor(xv).astype(np.int64)
            idx = np.searchsorted(cells.starts, xi, side="right") - 1
            width = cells.ends[idx] - cells.starts[idx]
            # a run of integers: the integer's own slot, (x - a) / width .. (x - a + 1) / width; the draw fills it
            pos = np.where(width > 1, (xi - cells.starts[idx]).astype(np.float64), np.nan)
        else:
            tx = _t(xv, cells.transform)
            e = cells.edges
            idx = np.clip(np.searchsorted(e, tx, side="right") - 1, 0, e.size - 2)
            with np.errstate(divide="ignore", invalid="ignore"):  # an atom's zero-width cell: set below
                pos = np.clip((tx - e[idx]) / (e[idx + 1] - e[idx]), 0.0, 1.0)
            if cells.atoms.size:  # a value equal to a declared atom: the atom's cell, its position drawn
                hit = np.isin(xv, cells.atoms) & ~isnull
                idx[hit] = cells.atom_cells[np.searchsorted(cells.atoms, xv[hit])]
                pos[hit] = np.nan
    if isnull.any():
        if not cells.nullable:
            raise DataError(
                f"Column '{cells.column}': {int(isnull.sum())} null value(s) in a column that is not "
                "nullable; validate the table first."
            )
        idx = np.where(isnull, cells.n_values, idx)
        pos = np.where(isnull, np.nan, pos)
    return idx.astype(np.int64), pos


def cell_index(df: pl.DataFrame, cells: Sequence[Cells]) -> np.ndarray:
    """[n, d] int64: the cell of every row in every column (the mechanism's histogram input)."""
    missing = [c for c in frame_columns(cells) if c not in df.columns]
    if missing:
        raise DataError(f"The table lacks the declared column(s) {missing}.")
    out = np.empty((df.height, len(cells)), dtype=np.int64)
    for j, c in enumerate(cells):
        out[:, j] = cell_positions(cell_series(df, c), c)[0]
    return out


# ---------------------------------------------------------------------------- released marginals


@dataclass(frozen=True, eq=False)
class Marginals:
    """Released per-column probability vectors over the public cells, and the cell parameters.

    `probs[name]` has `column_cells(col, max_atoms, grid_bins).n_cells` entries, each >= 0,
    summing to 1, for every entry of `schema_cells(schema, max_atoms, grid_bins, calendar_parts)`
    (a calendar column's parts under their own names). Produced by
    `privacy.mechanisms.dp_marginals` (DP) or, in tests, by hand.
    """

    probs: Mapping[str, np.ndarray]
    max_atoms: int = DEFAULT_MAX_ATOMS
    grid_bins: int = DEFAULT_GRID_BINS
    calendar_parts: bool = True
    missing_pattern: bool = True
    # the missing pattern alone says which of its columns' values are null: each such column's
    # coordinate is its values' CDF, a missing value a draw in `null_band` (`CopulaCodec`)
    nulls_in_pattern: bool = True
    # an integer column's runs lie between the grid's edges over its bounds (`column_cells`)
    aligned_runs: bool = True
    # where the pattern covers a column, a missing value's coordinate is drawn in this band around 1/2
    null_band: float = NULL_BAND

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (floats), for the model artifact."""
        return {
            "max_atoms": int(self.max_atoms),
            "grid_bins": int(self.grid_bins),
            "calendar_parts": bool(self.calendar_parts),
            "missing_pattern": bool(self.missing_pattern),
            "nulls_in_pattern": bool(self.nulls_in_pattern),
            "aligned_runs": bool(self.aligned_runs),
            "null_band": float(self.null_band),
            "probs": {k: [float(x) for x in np.asarray(v)] for k, v in self.probs.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Marginals:
        return cls(
            {k: np.asarray(v, dtype=np.float64) for k, v in data["probs"].items()},
            int(data["max_atoms"]),
            int(data["grid_bins"]),
            bool(data.get("calendar_parts", False)),  # a release made before the parts: one cell list per column
            bool(data.get("missing_pattern", False)),  # ... before the missing pattern: none
            bool(data.get("nulls_in_pattern", False)),  # ... before: the pattern's columns kept their null cells
            bool(data.get("aligned_runs", False)),  # ... before: integer runs over [lo, hi + 1], rounded
            float(data.get("null_band", 1.0)),  # ... before the band: a missing value's coordinate on all of (0, 1)
        )


def _check_probs(name: str, p: np.ndarray, n_cells: int) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.shape != (n_cells,):
        raise ValueError(f"marginal of column '{name}' has {p.size} entries, its cells number {n_cells}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"marginal of column '{name}' must be finite, >= 0 and not all zero")
    return p / p.sum()


class CopulaCodec:
    """Encode typed rows to (0, 1)^d (or R^d, space="gaussian") through the released marginal
    CDFs, and decode any array back to rows of the schema (module docstring)."""

    def __init__(self, schema: Schema, marginals: Marginals, space: Space = "uniform") -> None:
        if space not in ("uniform", "gaussian"):
            raise ValueError(f"space must be 'uniform' or 'gaussian', got {space!r}")
        if not 0.0 < float(marginals.null_band) <= 1.0:
            raise ValueError(f"null_band must lie in (0, 1], got {marginals.null_band!r}")
        self.schema = schema
        self.marginals = marginals
        self.space: Space = space
        self.cells = schema_cells(
            schema,
            marginals.max_atoms,
            marginals.grid_bins,
            marginals.calendar_parts,
            marginals.missing_pattern,
            marginals.aligned_runs,
        )
        extra = sorted(set(marginals.probs) - {c.column for c in self.cells})
        if extra:
            raise ValueError(f"marginals for undeclared column(s) {extra}")
        self.probs: list[np.ndarray] = []
        self.cdfs: list[np.ndarray] = []
        covered = {n for c in self.cells if c.pattern for n in c.pattern} if marginals.nulls_in_pattern else set()
        # per coordinate: a column the missing pattern covers, whose coordinate holds its values alone
        self.values_only: list[bool] = []
        for c in self.cells:
            if c.column not in marginals.probs:
                raise ValueError(f"no marginal for column '{c.column}'")
            p = _check_probs(c.column, marginals.probs[c.column], c.n_cells)
            apart = c.nullable and not c.pattern and (c.source or c.column) in covered and p[: c.n_values].sum() > 0
            if apart:  # the null cell's mass moves to the pattern: the values' CDF spans (0, 1)
                p = np.concatenate([p[: c.n_values] / p[: c.n_values].sum(), np.zeros(c.n_cells - c.n_values)])
            self.values_only.append(bool(apart))
            cdf = np.concatenate([[0.0], np.cumsum(p)])
            cdf /= cdf[-1]
            cdf[-1] = 1.0
            self.probs.append(np.diff(cdf))
            self.cdfs.append(cdf)
        # a plain column's coordinate (not a calendar part, not the pattern) by its name
        self._plain = {c.column: j for j, c in enumerate(self.cells) if c.source is None and not c.pattern}

    @classmethod
    def from_marginals(cls, schema: Schema, marginals: Marginals, space: Space = "uniform") -> CopulaCodec:
        return cls(schema, marginals, space)

    @property
    def dim(self) -> int:
        return len(self.cells)

    def uniformize(self, u: np.ndarray, jitter: np.ndarray) -> np.ndarray:
        """Randomised probability integral transform of one sampled batch, per column:
        (rank - 1 + V) / m with V ~ U(0, 1) from the sampling generator.

        The flow learns the dependence but its coordinates are only approximately uniform;
        this makes each column of the batch exactly uniform (for any m, m = 1 included) while
        keeping the flow's ranks, so the decoded columns follow the released DP marginals by
        construction. Post-processing of released samples: no private value is involved.
        """
        u = np.asarray(u)
        if u.ndim != 2 or u.shape[1] != self.dim or np.shape(jitter) != u.shape:
            raise ValueError(f"expected u and jitter of shape [m, {self.dim}], got {u.shape} and {np.shape(jitter)}")
        out = self._ranks(u).T  # [m, d], column-major
        out += np.asarray(jitter, dtype=np.float64)
        out /= u.shape[0]
        np.clip(out, U_MARGIN, 1 - U_MARGIN, out=out)
        self._present_ranks(out, np.asarray(jitter, dtype=np.float64))
        return _ndtri(out) if self.space == "gaussian" else out

    def _present_ranks(self, out: np.ndarray, jitter: np.ndarray) -> None:
        """Where the pattern covers a column and its missing values sat in a band (`null_band` < 1):
        the column's coordinate ranked again among the rows the batch's pattern says are present,
        (rank - 1 + V) / k, V the same jitter, so its values follow their released marginal; the
        rows the pattern calls missing keep theirs (decoded as null). In place on `out` [m, d]."""
        if not self.marginals.null_band < 1.0 or not any(self.values_only):
            return
        pj = next(j for j, c in enumerate(self.cells) if c.pattern)
        null = pattern.nulls(self._cells_at(pj, out[:, pj]), self.cells[pj].pattern)
        for j, c in enumerate(self.cells):
            present = ~null[c.source or c.column] if self.values_only[j] else None
            if present is None or not present.any():
                continue
            rank = self._ranks(out[present, j][:, None])[0]
            out[present, j] = np.clip((rank + jitter[present, j]) / rank.size, U_MARGIN, 1 - U_MARGIN)

    def _cells_at(self, j: int, u: np.ndarray) -> np.ndarray:
        """Coordinate j's cell index of each value of `u` in [0, 1) (its CDF, side='right')."""
        return np.clip(self._cell_of(self.cdfs[j], u), 0, self.cells[j].n_cells - 1)

    @staticmethod
    def _ranks(u: np.ndarray) -> np.ndarray:
        """[m, d] -> [d, m] float64: each value's 0-based rank in its column, ties in row order
        (the ranks of a stable sort). For float32, what the flows return: the value's
        order-preserving 32-bit key sorted in two stable 16-bit passes (numpy sorts 16-bit keys
        by radix: much faster than a stable argsort of the values, and the same ranks);
        otherwise a stable argsort of the float64 values. Column by column: each one's
        permutations stay in cache (faster than the same work on the whole batch)."""
        m, d = u.shape
        ranks = np.empty((d, m))
        rank = np.arange(m, dtype=np.float64)
        if u.dtype != np.float32 or np.isnan(u).any():
            columns = np.asarray(u, dtype=np.float64).T
            for j in range(d):
                ranks[j][np.argsort(columns[j], kind="stable")] = rank
            return ranks
        bits = np.ascontiguousarray(u.T + np.float32(0.0)).view(np.uint32)  # + 0: -0.0 ties with 0.0
        # flip every bit of a negative value, only the sign bit of the others: unsigned order = value order
        keys = bits ^ ((bits.view(np.int32) >> 31).view(np.uint32) | np.uint32(1 << 31))
        low_half, high_half = keys.astype(np.uint16), (keys >> 16).astype(np.uint16)
        ranked = np.empty(m)
        for j in range(d):
            by_low = np.argsort(low_half[j], kind="stable")
            ranked[np.argsort(high_half[j][by_low], kind="stable")] = rank  # rank of by_low's k-th value
            ranks[j][by_low] = ranked
        return ranks

    def log_mass(self, df: pl.DataFrame) -> np.ndarray:
        """[n] sum over columns of log p(cell of the row): with the flow's log-density of the
        encoded row, the row's log-likelihood against counting measure on cells x Lebesgue on
        the position inside them (du = p_k dr), a reference shared by every copula codec with the
        same cells, so versions trained through different DP marginals can be compared (-inf
        where a cell has no released mass)."""
        idx = cell_index(df, self.cells)
        total = np.zeros(df.height)
        with np.errstate(divide="ignore"):
            for j, c in enumerate(self.cells):
                lp = np.log(self.probs[j][idx[:, j]])
                if self.values_only[j]:  # a missing value: a uniform on the band, counted in the pattern's cell
                    lp[idx[:, j] >= c.n_values] = math.log(self.marginals.null_band)
                total += lp
        return total

    def value_ranks(self, df: pl.DataFrame, name: str) -> np.ndarray | None:
        """[n] each row's value of column `name` as the released CDF of its values (over the value
        cells' mass: the cells' piecewise-linear CDF, the middle of a cell whose position is drawn,
        an atom or a run's integer's slot), NaN where the value is missing; deterministic, unlike
        `encode`. None for a column that is not one cell list here (a calendar column's parts, the
        pattern, an undeclared name) or whose values got no released mass."""
        j = self._plain.get(name)
        if j is None:
            return None
        c, cdf, p = self.cells[j], self.cdfs[j], self.probs[j]
        mass = float(cdf[c.n_values])
        if not mass > 0:
            return None
        idx, pos = cell_positions(cell_series(df, c), c)
        at = np.minimum(idx, c.n_values - 1)
        if c.kind == "integer":  # a run of integers: the integer's offset in it -> the middle of its slot
            pos = (pos + 0.5) / np.maximum(c.ends[at] - c.starts[at], 1)
        u = np.clip((cdf[at] + p[at] * np.nan_to_num(pos, nan=0.5)) / mass, 0.0, 1.0)
        return np.where(idx < c.n_values, u, np.nan)

    def same_cells(self, other: CopulaCodec) -> bool:
        """Both codecs split every column into the same public cells (schema, max_atoms, grid_bins):
        compared cell by cell, so changed bounds or atoms that keep the count still differ."""
        return (
            self.schema.names == other.schema.names
            and (self.marginals.max_atoms, self.marginals.grid_bins)
            == (other.marginals.max_atoms, other.marginals.grid_bins)
            and all(a.same_as(b) for a, b in zip(self.cells, other.cells, strict=True))
        )

    @property
    def cardinalities(self) -> list[int | None]:
        """Every copula coordinate is continuous (categories are dequantized inside their cell)."""
        return [None] * self.dim

    # ------------------------------------------------------------------ encode

    def encode(self, df: pl.DataFrame, generator: np.random.Generator) -> np.ndarray:
        """Typed frame -> float64 [n, d]: u in [U_MARGIN, 1 - U_MARGIN] (or Phi^-1(u)).

        `generator` draws the position inside atoms, integer runs and the null cell; pass a
        secret one for private rows (module docstring, "Randomness").
        """
        if not isinstance(generator, np.random.Generator):
            raise TypeError("encode needs an explicit numpy Generator (np.random.default_rng(secret_seed()))")
        missing = [c for c in frame_columns(self.cells) if c not in df.columns]
        if missing:
            raise DataError(f"Cannot encode: the table lacks the declared column(s) {missing}.")
        n = df.height
        out = np.empty((n, self.dim), dtype=np.float64)
        for j, c in enumerate(self.cells):
            idx, pos = cell_positions(cell_series(df, c), c)
            draw = np.isnan(pos)
            r = pos.copy()
            if c.kind == "integer":
                # inside a run of integers: (offset + v) / width, v uniform
                run = ~draw
                width = c.ends[np.minimum(idx, c.n_values - 1)] - c.starts[np.minimum(idx, c.n_values - 1)]
                v = generator.random(n)
                r = np.where(run, (np.nan_to_num(pos) + v) / width, v)
            elif draw.any():
                r[draw] = generator.random(int(draw.sum()))
            cdf, p = self.cdfs[j], self.probs[j]
            u = cdf[idx] + p[idx] * np.clip(r, 0.0, 1.0)
            # rounding must not carry u into the next cell (a tiny cell late in the CDF)
            out[:, j] = np.where(p[idx] > 0, np.minimum(u, np.nextafter(cdf[idx + 1], 0.0)), cdf[idx])
            if self.values_only[j]:  # a missing value: a draw in the band around 1/2 (the pattern says it is missing)
                null = idx >= c.n_values
                band = float(self.marginals.null_band)
                out[null, j] = 0.5 + (generator.random(int(null.sum())) - 0.5) * band
        np.clip(out, U_MARGIN, 1.0 - U_MARGIN, out=out)
        return _ndtri(out) if self.space == "gaussian" else out

    # ------------------------------------------------------------------ decode

    def decode(self, array: np.ndarray) -> pl.DataFrame:
        """Any finite array [n, d] -> rows of the schema (schema order; types as `validate`
        returns them: Int64, Float64, Enum of the declared categories; nulls where the null
        cell is drawn)."""
        a = np.asarray(array, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise ValueError(f"decode expects an array of shape [n, {self.dim}], got {list(a.shape)}")
        if np.isnan(a).any():
            raise ValueError("decode got NaN values; the sampler must return finite numbers")
        u = _ndtr(a) if self.space == "gaussian" else a
        ut = np.array(u.T, dtype=np.float64, order="C")  # a copy, one contiguous row per column
        np.clip(ut, 0.0, np.nextafter(1.0, 0.0), out=ut)
        cells = []
        for j in range(self.dim):
            cells.append(self._cells_at(j, ut[j]))
        self._missing_jointly(cells, ut)
        cols: dict[str, pl.Series] = {}
        for j, c in enumerate(self.cells):
            if c.pattern:
                continue
            cdf, p, idx = self.cdfs[j], self.probs[j], cells[j]
            r = None
            if not c.is_atomic:  # a category or a single integer is its cell: no position needed
                pk = p[idx]
                r = np.clip((ut[j] - cdf[idx]) / np.where(pk > 0, pk, 1.0), 0.0, 1.0)
            cols[c.column] = self._values(c, idx, r)
        return pl.DataFrame(self._recomposed(cols))

    def _missing_jointly(self, cells: list[np.ndarray], ut: np.ndarray) -> None:
        """Which values are null, decided once per column: by the missing pattern where it covers
        the column, else (a calendar column's parts) by its first part. A nullable cell list then
        follows: the null cell where null is decided, a redraw among its value cells (u moved
        linearly from the null cell's interval onto theirs) where it was drawn but not decided.
        In place on `cells` and `ut`."""
        null: dict[str, np.ndarray] = {}
        for j, c in enumerate(self.cells):
            if c.pattern:
                null.update(pattern.nulls(cells[j], c.pattern))
        for j, c in enumerate(self.cells):
            if not c.nullable or c.pattern:
                continue
            key = c.source or c.column
            if key not in null:
                if c.source is not None:  # a calendar column without a pattern: its first part decides
                    null[key] = cells[j] >= c.n_values
                continue
            want, idx, cdf = null[key], cells[j], self.cdfs[j]
            idx[want] = c.n_values
            odd = ~want & (idx >= c.n_values)
            if odd.any():  # u uniform on the null cell [F, 1) -> uniform on the value cells [0, F)
                f = cdf[c.n_values]
                ut[j, odd] = (ut[j, odd] - f) / max(1.0 - f, 1e-300) * f
                idx[odd] = np.minimum(self._cell_of(cdf, ut[j, odd]), c.n_values - 1)

    def _recomposed(self, cols: dict[str, pl.Series]) -> list[pl.Series]:
        """The decoded columns in schema order, each calendar column written back from its parts
        (`calendar.recompose`; null where its first part is null)."""
        parts: dict[str, list[Cells]] = {}
        for c in self.cells:
            if c.source is not None:
                parts.setdefault(c.source, []).append(c)
        out = []
        for col in self.schema.columns:
            if col.name not in parts:
                out.append(cols[col.name])
                continue
            mine = parts[col.name]
            units = calendar.recompose(col, {str(c.part): cols[c.column].fill_null(0).to_numpy() for c in mine})
            s = pl.Series(col.name, units, dtype=pl.Int64)
            null = cols[mine[0].column].is_null()
            out.append(s.scatter(np.flatnonzero(null.to_numpy()), None) if null.any() else s)
        return out

    @staticmethod
    def _cell_of(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``searchsorted(cdf, u, side="right") - 1`` for u in [0, 1), through a lookup table: u
        falls in one of G = 2^k equal buckets (G >= 8 x knots; u * G is exact), which knows the
        cell at its left edge; one comparison with the next knot settles a bucket that holds a
        single knot, a binary search the few that hold more. Faster than the binary search on
        every value, and the same indices."""
        buckets = 1 << max(6, 3 + int(cdf.size).bit_length())
        at_edges = np.searchsorted(cdf, np.arange(buckets + 1) / buckets, side="right") - 1
        b = (u * buckets).astype(np.intp)
        np.clip(b, 0, buckets - 1, out=b)
        idx = at_edges[b]
        idx += np.append(cdf, np.inf)[idx + 1] <= u  # idx <= cdf.size - 1: the next knot, or none
        crowded = (at_edges[1:] - at_edges[:-1] > 1)[b]
        if crowded.any():
            rows = np.flatnonzero(crowded)
            idx[rows] = np.searchsorted(cdf, u[rows], side="right") - 1
        return idx

    @staticmethod
    def _values(c: Cells, idx: np.ndarray, r: np.ndarray | None) -> pl.Series:
        """The column's values from each row's cell and position inside it (r: None for atomic cells)."""
        if c.kind == "categorical":
            # gather from Enum labels: faster than gathering strings and casting them
            return pl.Series(c.column, [*c.labels, None], dtype=pl.Enum(list(c.labels))).gather(idx)
        isnull = idx >= c.n_values
        k = np.minimum(idx, c.n_values - 1)
        if c.kind == "integer":
            if r is None:
                x = c.starts[k]
            else:
                width = c.ends[k] - c.starts[k]
                x = c.starts[k] + np.minimum(np.floor(r * width).astype(np.int64), width - 1)
            s = pl.Series(c.column, x, dtype=pl.Int64)
        else:
            e = c.edges
            lo, hi = c.bounds  # type: ignore[misc]
            x = np.clip(_t_inv(e[k] + r * (e[k + 1] - e[k]), c.transform), lo, hi)
            if c.step is not None:
                x = _on_lattice(x, _t_inv(e[k], c.transform), _t_inv(e[k + 1], c.transform), c.step)
            if c.atoms.size:  # an atom's cell gives the atom itself (no round trip through the t-scale)
                at = np.isin(k, c.atom_cells)
                x[at] = c.atoms[np.searchsorted(c.atom_cells, k[at])]
            s = pl.Series(c.column, x, dtype=pl.Float64)
        if isnull.any():
            s = s.scatter(np.flatnonzero(isnull), None)
        return s


def _on_lattice(x: np.ndarray, a: np.ndarray, b: np.ndarray, step: float) -> np.ndarray:
    """Each value rounded to the lattice of multiples of `step` (the declared decimals), kept inside
    its cell [a, b): to the lattice point nearest it among those in the cell, or rounded where the
    cell holds none. Rounding alone moves a value past its cell's edge (a cell [50, 50.6) of whole
    numbers wrote a fifth of the rows at 50 as 51), so a spike on a lattice point stays where its
    DP marginal put it. Post-processing of a released value with the public schema."""
    tol = 1e-9
    first = np.ceil(a / step - tol) * step  # the first lattice point >= a
    last = np.ceil(b / step - tol) * step - step  # the last one < b
    near = np.round(x / step) * step
    return np.where(first <= last + tol * step, np.clip(near, first, last), near)


def marginal_of(df: pl.DataFrame, cells: Cells) -> np.ndarray:
    """The empirical distribution of one column over its cells (for tests and curator-only
    diagnostics; never for anything released)."""
    idx, _ = cell_positions(cell_series(df, cells), cells)
    counts = np.bincount(idx, minlength=cells.n_cells).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


__all__ = [
    "DEFAULT_GRID_BINS",
    "DEFAULT_MAX_ATOMS",
    "U_MARGIN",
    "Cells",
    "CopulaCodec",
    "Marginals",
    "cell_index",
    "cell_positions",
    "cell_series",
    "column_cells",
    "frame_columns",
    "marginal_of",
    "schema_cells",
]
