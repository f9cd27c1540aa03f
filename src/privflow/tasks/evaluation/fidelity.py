"""Statistical fidelity of synthetic data (DP-HFlow, Experimental Results).

Marginals: per-column total-variation distance over public bins (the quantitative
counterpart of DP-HFlow Figure 3). Dependencies: Kendall's tau matrices of the numeric
columns and the RMSE / MAE of their difference over the upper triangle (DP-HFlow Table 1),
and Cramer's V matrices of the categorical columns with the MAE of their difference.
These are diagnostics on real rows: not differentially private (ARCHITECTURE rule 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.stats import kendalltau

from privflow.data.features import N_BINS, binned_counts, category_codes, check_columns, numeric_values
from privflow.data.schema import Schema


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
