"""Statistical fidelity of synthetic data (DP-HFlow, Experimental Results).

Marginals: per-column total-variation distance over public bins (the quantitative
counterpart of DP-HFlow Figure 3). Dependencies: Kendall's tau matrices of the numeric
columns and the RMSE / MAE of their difference over the upper triangle (DP-HFlow Table 1),
and Cramer's V matrices of the categorical columns with the MAE of their difference.
Range fidelity (`range_fidelity`): what the public-bounds bins cannot see when the real rows
fill a small part of the bounds (synthetic values outside the real range, spread, fine-grained
TV on the real range, Pearson and Spearman correlation errors).
These are diagnostics on real rows: not differentially private, so for the curator only, never released.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.stats import kendalltau, rankdata

from privflow.data.features import N_BINS, binned_counts, category_codes, check_columns, numeric_values
from privflow.data.lowering import lower
from privflow.data.schema import Column, Schema


def tv_distance(p_counts: np.ndarray, q_counts: np.ndarray) -> float:
    """TV(p, q) = 1/2 sum |p_i - q_i| of two count vectors over the same bins (NaN if one is empty)."""
    p_tot, q_tot = float(p_counts.sum()), float(q_counts.sum())
    if p_tot <= 0 or q_tot <= 0:
        return float("nan")
    return 0.5 * float(np.abs(p_counts / p_tot - q_counts / q_tot).sum())


def marginal_tv(schema: Schema, real: pl.DataFrame, synthetic: pl.DataFrame, n_bins: int = N_BINS) -> dict[str, float]:
    """Per-column TV distance: numerics in `n_bins` public bins of t(x), categoricals over the
    declared list; both with a missing bin."""
    check_columns(schema, real, "real")
    check_columns(schema, synthetic, "synthetic")
    out: dict[str, float] = {}
    for col in schema.columns:
        p, _ = binned_counts(col, real, n_bins)
        q, _ = binned_counts(col, synthetic, n_bins)
        out[col.name] = tv_distance(p, q)
    return out


def numeric_names(schema: Schema) -> list[str]:
    return [c.name for c in schema.columns if not c.is_categorical]


def categorical_names(schema: Schema) -> list[str]:
    return [c.name for c in schema.columns if c.is_categorical]


def kendall_matrix(schema: Schema, df: pl.DataFrame, max_rows: int | None = 50_000, seed: int = 0) -> np.ndarray:
    """Pairwise Kendall tau-b of the numeric columns (pairwise-complete rows).

    A pair with fewer than 2 complete rows or a constant column has no defined tau; it is set
    to 0 (no measured association) so that a collapsed synthetic column is penalised, not skipped.
    Tables larger than `max_rows` are row-subsampled (tau's standard error is ~1/sqrt(n)).
    """
    names = numeric_names(schema)
    if max_rows is not None and df.height > max_rows:
        df = df.sample(n=max_rows, seed=seed)
    vals = [numeric_values(schema.column(n), df) for n in names]
    m = len(names)
    tau = np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            ok = ~(vals[i][1] | vals[j][1])
            t = float("nan")
            if ok.sum() >= 2:
                t = float(kendalltau(vals[i][0][ok], vals[j][0][ok]).statistic)
            tau[i, j] = tau[j, i] = t if np.isfinite(t) else 0.0
    return tau


def cramers_v(a: np.ndarray, b: np.ndarray) -> float:
    """Cramer's V = sqrt(chi2 / (n * (min(r, c) - 1))) on the observed levels of two code arrays.

    0 when either variable shows a single level (no association measurable).
    """
    n = a.size
    if n == 0:
        return 0.0
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    r, c = int(ai.max()) + 1, int(bi.max()) + 1
    if min(r, c) < 2:
        return 0.0
    table = np.bincount(ai * c + bi, minlength=r * c).reshape(r, c).astype(np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / n
    chi2 = float(((table - expected) ** 2 / expected).sum())
    return float(np.sqrt(min(1.0, chi2 / (n * (min(r, c) - 1)))))


def cramers_matrix(schema: Schema, df: pl.DataFrame) -> np.ndarray:
    """Pairwise Cramer's V of the categorical columns (missing counted as its own level)."""
    names = categorical_names(schema)
    codes = [category_codes(schema.column(n), df) for n in names]
    m = len(names)
    v = np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            v[i, j] = v[j, i] = cramers_v(codes[i], codes[j])
    return v


def upper_triangle_errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(RMSE, MAE) of a - b over the strict upper triangle (DP-HFlow Table 1); NaN if empty."""
    iu = np.triu_indices(a.shape[0], k=1)
    d = (a - b)[iu]
    if d.size == 0:
        return float("nan"), float("nan")
    return float(np.sqrt(np.mean(d**2))), float(np.mean(np.abs(d)))


@dataclass(frozen=True)
class FidelityResult:
    """Marginal TV per column and the dependency matrices of both tables."""

    tv: dict[str, float]
    numeric: list[str]
    kendall_real: np.ndarray
    kendall_synthetic: np.ndarray
    categorical: list[str]
    cramer_real: np.ndarray
    cramer_synthetic: np.ndarray

    def metrics(self) -> dict[str, float]:
        """Flat metric names for the tracking server and the report."""
        tv = self.tv
        num = [tv[n] for n in self.numeric]
        cat = [tv[n] for n in self.categorical]
        k_rmse, k_mae = upper_triangle_errors(self.kendall_real, self.kendall_synthetic)
        c_rmse, c_mae = upper_triangle_errors(self.cramer_real, self.cramer_synthetic)
        return {
            "fidelity/tv_mean": _nanmean(list(tv.values())),
            "fidelity/tv_max": _nanmax(list(tv.values())),
            "fidelity/tv_numeric_mean": _nanmean(num),
            "fidelity/tv_categorical_mean": _nanmean(cat),
            "fidelity/kendall_rmse": k_rmse,
            "fidelity/kendall_mae": k_mae,
            "fidelity/cramers_v_rmse": c_rmse,
            "fidelity/cramers_v_mae": c_mae,
        }


def _nanmean(x: list[float]) -> float:
    a = np.asarray(x, dtype=np.float64)
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def _nanmax(x: list[float]) -> float:
    a = np.asarray(x, dtype=np.float64)
    return float(np.nanmax(a)) if np.isfinite(a).any() else float("nan")


def fidelity(schema: Schema, real: pl.DataFrame, synthetic: pl.DataFrame, n_bins: int = N_BINS) -> FidelityResult:
    """All fidelity diagnostics of `synthetic` against `real` (normally the training table)."""
    return FidelityResult(
        tv=marginal_tv(schema, real, synthetic, n_bins),
        numeric=numeric_names(schema),
        kendall_real=kendall_matrix(schema, real),
        kendall_synthetic=kendall_matrix(schema, synthetic),
        categorical=categorical_names(schema),
        cramer_real=cramers_matrix(schema, real),
        cramer_synthetic=cramers_matrix(schema, synthetic),
    )


# ---------------------------------------------------------------- range fidelity

RANGE_MAX_ROWS = 50_000  # rows per table for the correlation matrices (as `kendall_matrix`)


def range_fidelity(schema: Schema, real: pl.DataFrame, synthetic: pl.DataFrame, n_bins: int = 100) -> dict[str, float]:
    """Fidelity on the REAL rows' own range, per numeric and integer column of `lower(schema)`
    (dates and datetimes as integers), where the 20 bins over the public bounds see nothing when
    the real values fill a small part of the bounds. Non-null values only (`marginal_tv` counts
    the missing share). Keys, for each such column `c`:

    - `range/outside/c`: fraction of synthetic values outside [min, max] of the real values;
    - `range/std_ratio/c`: synthetic std / real std (ddof=1; NaN if the real std is 0);
    - `range/tv_fine/c`: TV of the histograms on `n_bins` equal bins over the real [min, max]
      (of log1p(x) where the schema says so), plus one overflow bin each side for synthetic
      values outside it;

    and `range/outside_max`, `range/std_ratio_worst` (the ratio farthest from 1 in log terms),
    `range/tv_fine_mean`, `corr/{pearson,spearman}_{max,mean}_error` (absolute differences over the
    upper triangles of the real and synthetic correlation matrices; pairwise-complete rows, each
    table subsampled to `RANGE_MAX_ROWS` rows with seed 0; an undefined correlation counts as 0, as
    in `kendall_matrix`). NaN where a figure is undefined (no values, fewer than 2 columns)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")
    modelled = lower(schema)
    check_columns(modelled, real, "real")
    check_columns(modelled, synthetic, "synthetic")
    cols = [c for c in modelled.columns if not c.is_categorical]
    out: dict[str, float] = {}
    outside: list[float] = []
    ratios: list[float] = []
    tvs: list[float] = []
    for col in cols:
        r, s = _present(col, real), _present(col, synthetic)
        o, ratio, tv = _range_figures(col, r, s, n_bins)
        out[f"range/outside/{col.name}"] = o
        out[f"range/std_ratio/{col.name}"] = ratio
        out[f"range/tv_fine/{col.name}"] = tv
        outside.append(o)
        ratios.append(ratio)
        tvs.append(tv)
    out["range/outside_max"] = _nanmax(outside)
    out["range/std_ratio_worst"] = _worst_ratio(ratios)
    out["range/tv_fine_mean"] = _nanmean(tvs)
    names = [c.name for c in cols]
    for method in ("pearson", "spearman"):
        a = correlation_matrix(modelled, real, names, method)
        b = correlation_matrix(modelled, synthetic, names, method)
        d = np.abs(a - b)[np.triu_indices(len(names), k=1)]
        out[f"corr/{method}_max_error"] = float(d.max()) if d.size else float("nan")
        out[f"corr/{method}_mean_error"] = float(d.mean()) if d.size else float("nan")
    return out


def _present(col: Column, df: pl.DataFrame) -> np.ndarray:
    """The column's non-null (finite) values as float64."""
    v, miss = numeric_values(col, df)
    return v[~miss]


def _range_figures(col: Column, r: np.ndarray, s: np.ndarray, n_bins: int) -> tuple[float, float, float]:
    """(outside fraction, std ratio, fine TV) of one column's real values `r` and synthetic `s`."""
    if r.size == 0:
        return float("nan"), float("nan"), float("nan")
    lo, hi = float(r.min()), float(r.max())
    below, above = s < lo, s > hi
    outside = float((below | above).mean()) if s.size else float("nan")
    ratio = float("nan")
    if r.size >= 2 and s.size >= 2:
        sd_r = float(np.std(r, ddof=1))
        ratio = float(np.std(s, ddof=1)) / sd_r if sd_r > 0 else float("nan")
    return outside, ratio, tv_distance(_fine_counts(col, r, lo, hi, n_bins), _fine_counts(col, s, lo, hi, n_bins))


def _fine_counts(col: Column, x: np.ndarray, lo: float, hi: float, n_bins: int) -> np.ndarray:
    """Counts in [below lo, n_bins equal bins over [t(lo), t(hi)] (one bin if lo == hi), above hi]."""
    t = np.log1p if col.transform == "log1p" and lo > -1 else (lambda a: a)
    below, above = x < lo, x > hi
    inside = x[~(below | above)]
    k = n_bins if hi > lo else 1
    if hi > lo:  # as `binned_counts`: a value on an edge goes to the bin above it, hi to the last bin
        edges = np.linspace(float(t(lo)), float(t(hi)), k + 1)
        idx = np.clip(np.searchsorted(edges, t(inside), side="right") - 1, 0, k - 1)
    else:
        idx = np.zeros(inside.size, dtype=np.int64)
    counts = np.bincount(idx, minlength=k).astype(np.float64)
    return np.concatenate([[float(below.sum())], counts, [float(above.sum())]])


def _worst_ratio(ratios: list[float]) -> float:
    """The ratio farthest from 1 in log terms (0 counts as infinitely far); NaN if none is defined."""
    a = np.asarray(ratios, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return float("nan")
    with np.errstate(divide="ignore"):
        dist = np.abs(np.log(a))
    return float(a[int(np.argmax(dist))])


def correlation_matrix(
    schema: Schema,
    df: pl.DataFrame,
    names: list[str],
    method: str = "pearson",
    max_rows: int | None = RANGE_MAX_ROWS,
    seed: int = 0,
) -> np.ndarray:
    """Pearson or Spearman (Pearson of average ranks) correlations of the columns `names`, each
    pair on its pairwise-complete rows; a pair with fewer than 2 such rows or a constant column
    counts as 0 (as `kendall_matrix`). Tables over `max_rows` rows are subsampled with `seed`."""
    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    if max_rows is not None and df.height > max_rows:
        df = df.sample(n=max_rows, seed=seed)
    vals = [numeric_values(schema.column(n), df) for n in names]
    spearman = method == "spearman"
    # ranks of a column without nulls serve every pair it is complete in (no re-ranking)
    full = [rankdata(v) if spearman and not miss.any() else None for v, miss in vals]
    m = len(names)
    corr = np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            ok = ~(vals[i][1] | vals[j][1])
            x, y = vals[i][0][ok], vals[j][0][ok]
            if spearman:
                fi, fj = full[i], full[j]
                complete = bool(ok.all())
                x = fi if complete and fi is not None else rankdata(x)
                y = fj if complete and fj is not None else rankdata(y)
            c = _pearson(x, y)
            corr[i, j] = corr[j, i] = c if np.isfinite(c) else 0.0
    return corr


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r (NaN for fewer than 2 rows or a constant column)."""
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    den = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    return float(np.clip((dx * dy).sum() / den, -1.0, 1.0)) if den > 0 else float("nan")
