"""Schema-only encodings shared by the diagnostics and the target head (privacy rule 2:
nothing is fitted on rows).

Numeric columns are mapped to [0, 1] by their PUBLIC bounds after the schema's transform
(the same map as privflow/data/codec.py), categoricals are one-hot over the PUBLIC category list.
Bin edges for histograms come from the public bounds too, so no statistic of the private rows
shapes any encoding, binning or scaling used here.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import polars as pl

from privflow.core.errors import DataError
from privflow.data.schema import Column, Schema

N_BINS = 20
MISSING = "(missing)"


def check_columns(schema: Schema, df: pl.DataFrame, what: str) -> None:
    """Raise a DataError naming the table if any schema column is absent."""
    absent = [n for n in schema.names if n not in df.columns]
    if absent:
        raise DataError(
            f"The {what} table lacks the schema's columns {absent}; every table given to the "
            f"evaluation must hold all of {schema.names}."
        )


def _t(col: Column, x: np.ndarray | float) -> np.ndarray | float:
    return np.log1p(x) if col.transform == "log1p" else x


def numeric_values(col: Column, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Return (values as float64 with NaN for null, missing mask) of a numeric column."""
    s = df.get_column(col.name).cast(pl.Float64)
    v = s.to_numpy().astype(np.float64, copy=True)
    miss = ~np.isfinite(v)
    return v, miss


def scaled(col: Column, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(t(x) - t(lo)) / (t(hi) - t(lo)) clipped to [0, 1] (null -> 0), and the missing mask."""
    assert col.bounds is not None
    lo, hi = col.bounds
    v, miss = numeric_values(col, df)
    with np.errstate(invalid="ignore"):
        tv = _t(col, np.clip(np.where(miss, lo, v), lo, hi))
    z = (tv - _t(col, lo)) / (_t(col, hi) - _t(col, lo))
    z = np.clip(z, 0.0, 1.0)
    z[miss] = 0.0
    return z, miss


def category_codes(col: Column, df: pl.DataFrame) -> np.ndarray:
    """Integer codes 0..K-1 in declared order; K for null or an undeclared label."""
    assert col.categories is not None
    k = len(col.categories)
    s = df.get_column(col.name)
    if s.dtype == _enum(tuple(col.categories)):  # typed as `validate` and decoders return it: its own codes
        physical = s.to_physical()
        if physical.null_count():
            physical = physical.fill_null(k)
        return physical.to_numpy().astype(np.int64)
    s = s.cast(pl.String)
    mapping = {c: i for i, c in enumerate(col.categories)}
    codes = s.replace_strict(mapping, default=k, return_dtype=pl.Int64).fill_null(k)
    return codes.to_numpy().astype(np.int64)


@functools.lru_cache(maxsize=256)
def _enum(categories: tuple[str, ...]) -> pl.Enum:
    """The Enum dtype of a declared category list (built once: the sampler asks per batch)."""
    return pl.Enum(list(categories))


def numeric_bin_edges(col: Column, n_bins: int = N_BINS) -> np.ndarray:
    """n_bins equal-width edges over the public bounds on the transformed scale."""
    assert col.bounds is not None
    lo, hi = col.bounds
    return np.linspace(float(_t(col, lo)), float(_t(col, hi)), n_bins + 1)


def binned_counts(col: Column, df: pl.DataFrame, n_bins: int = N_BINS) -> tuple[np.ndarray, list[str]]:
    """Counts per public bin, last bin = missing (or undeclared label), with bin labels.

    Numeric: `n_bins` equal-width bins of t(x) over [t(lo), t(hi)], values outside the bounds
    clipped into the end bins. Categorical: the declared categories.
    """
    if col.is_categorical:
        assert col.categories is not None
        k = len(col.categories)
        counts = np.bincount(category_codes(col, df), minlength=k + 1).astype(np.float64)
        return counts, [*col.categories, MISSING]
    assert col.bounds is not None
    lo, hi = col.bounds
    v, miss = numeric_values(col, df)
    edges = numeric_bin_edges(col, n_bins)
    tv = _t(col, np.clip(v[~miss], lo, hi))
    idx = np.clip(np.searchsorted(edges, tv, side="right") - 1, 0, n_bins - 1)
    counts = np.bincount(idx, minlength=n_bins).astype(np.float64)
    counts = np.append(counts, float(miss.sum()))
    labels = [f"[{_fmt(col, edges[i])}, {_fmt(col, edges[i + 1])})" for i in range(n_bins)]
    return counts, [*labels, MISSING]


def _fmt(col: Column, t_edge: float) -> str:
    x = math.expm1(t_edge) if col.transform == "log1p" else t_edge
    return f"{x:.4g}"


def feature_widths(schema: Schema, exclude: tuple[str, ...] = (), numeric: int = 0) -> list[int]:
    """The blocks of `compact_features` in order: 0 for one scalar column (a scaled number or a
    missing flag), K for a one-hot block of K slots (a nullable category's K includes its
    missing slot). `numeric` is the width given to a scaled number (not to its missing flag):
    0 keeps it a scalar (`feature_matrix`), -m spreads it over an m-knot hat basis."""
    widths: list[int] = []
    for col in schema.columns:
        if col.name in exclude:
            continue
        if col.is_categorical:
            widths.append(len(col.categories or ()) + (1 if col.nullable else 0))
        else:
            widths += [numeric, 0] if col.nullable else [numeric]
    return widths


def compact_features(
    schema: Schema, df: pl.DataFrame, exclude: tuple[str, ...] = (), out: np.ndarray | None = None
) -> np.ndarray:
    """[n, len(feature_widths)] float32: `feature_matrix` before its one-hot expansion, one column
    per block (a scaled number, a missing flag, or a category's slot index; the width itself for
    an undeclared label, which expands to an all-zero block). A per-row map fixed by the schema,
    about a tenth of the expanded matrix's size: what the target head trains on. `out`: a float32
    [n, >= blocks] array whose leading columns are written (and returned), so that a caller
    adding columns builds a large table once, without a stacked copy."""
    blocks = len(feature_widths(schema, exclude))
    if out is None:
        out = np.empty((df.height, blocks), dtype=np.float32)
    if out.dtype != np.float32 or out.ndim != 2 or out.shape[0] != df.height or out.shape[1] < blocks:
        raise ValueError(f"out must be float32 [{df.height}, >= {blocks}], got {out.dtype} {out.shape}")
    j = 0
    for col in schema.columns:
        if col.name in exclude:
            continue
        if col.is_categorical:
            assert col.categories is not None
            k = len(col.categories)
            out[:, j] = np.minimum(category_codes(col, df), k + 1 if col.nullable else k)
            j += 1
        else:
            z, miss = scaled(col, df)
            out[:, j] = z
            j += 1
            if col.nullable:
                out[:, j] = miss
                j += 1
    return out[:, :blocks] if out.shape[1] > blocks else out


def hat_basis(z: np.ndarray, knots: int) -> np.ndarray:
    """[n] values in [0, 1] -> [n, knots] piecewise-linear hat functions on `knots` equally spaced
    knots 0, 1/(knots-1), ..., 1: at most two non-zero entries per row, summing to 1 (a partition
    of unity that reproduces every linear function of z, so it only adds bends)."""
    if knots < 2:
        raise ValueError(f"a hat basis needs at least 2 knots, got {knots}")
    z = np.clip(np.asarray(z, dtype=np.float64), 0.0, 1.0)
    centres = np.linspace(0.0, 1.0, knots)
    return np.maximum(0.0, 1.0 - np.abs(z[:, None] - centres[None, :]) * (knots - 1))


def block_size(width: int) -> int:
    """Columns a block of `feature_widths` / `target_head.head_widths` expands to: 1 for a scalar
    (0), K for a one-hot block (K > 0), m for a scalar through an m-knot hat basis (-m)."""
    return 1 if width == 0 else abs(width)


def expand_features(compact: np.ndarray, widths: list[int], onehot_scale: float = 1.0) -> np.ndarray:
    """`compact_features` -> the float64 feature matrix: scalar blocks as they are (width 0), hat
    bases of scalars (width -m, `hat_basis`), one-hot blocks expanded (`onehot_scale` in the hot
    slot; a slot index equal to the width gives zeros)."""
    c = np.asarray(compact)
    n = c.shape[0]
    parts: list[np.ndarray] = []
    for j, width in enumerate(widths):
        if width == 0:
            parts.append(c[:, j : j + 1].astype(np.float64))
            continue
        if width < 0:
            parts.append(hat_basis(c[:, j], -width))
            continue
        oh = np.zeros((n, width + 1), dtype=np.float64)
        oh[np.arange(n), c[:, j].astype(np.int64)] = onehot_scale
        parts.append(oh[:, :width])
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))


def feature_names(schema: Schema, exclude: tuple[str, ...] = ()) -> list[str]:
    """The name of every column of `feature_matrix`."""
    names: list[str] = []
    for col in schema.columns:
        if col.name in exclude:
            continue
        if col.is_categorical:
            names.extend(f"{col.name}={c}" for c in col.categories or ())
            if col.nullable:
                names.append(f"{col.name}={MISSING}")
        else:
            names.append(col.name)
            if col.nullable:
                names.append(f"{col.name}__missing")
    return names


def feature_matrix(
    schema: Schema, df: pl.DataFrame, exclude: tuple[str, ...] = (), onehot_scale: float = 1.0
) -> tuple[np.ndarray, list[str]]:
    """Public-bounds encoding: scaled numerics (+ missing flag if nullable), one-hot categoricals.

    One-hot blocks include a missing slot when the column is nullable; an undeclared label
    gives an all-zero block. `onehot_scale` weights the one-hot entries (1/sqrt(2) makes a
    category mismatch cost 1 in squared Euclidean distance, like a full-range numeric gap).
    """
    compact = compact_features(schema, df, exclude)
    return expand_features(compact, feature_widths(schema, exclude), onehot_scale), feature_names(schema, exclude)
