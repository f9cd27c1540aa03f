"""Diagnostic figures (PNG) for the data owner's report; not differentially private.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend state, safe in
worker threads). Marginal histograms follow DP-HFlow Figure 3 (real in blue, synthetic in
orange over it); bins come from the PUBLIC schema bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter
from sklearn.decomposition import PCA

from privflow.data.features import binned_counts, feature_matrix, numeric_bin_edges
from privflow.data.schema import Column, Schema

REAL = "#1f77b4"
SYN = "#ff7f0e"
MAX_CATEGORIES_SHOWN = 12


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)  # constrained layout already fits; "tight" would draw twice
    return path


def _share(counts: np.ndarray) -> np.ndarray:
    tot = counts.sum()
    return counts / tot if tot > 0 else np.zeros_like(counts)


def _human(v: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _log_ticks(col: Column) -> tuple[list[float], list[str]]:
    """Ticks at lo, powers of ten and hi on the log1p axis, dropping any within 8% of the
    axis of a kept neighbour (the bounds are always kept)."""
    assert col.bounds is not None
    lo, hi = col.bounds
    span = math.log1p(hi) - math.log1p(lo)
    inner = [10.0**k for k in range(0, 12) if lo < 10.0**k < hi]
    keep = [lo]
    for v in inner:
        if (math.log1p(v) - math.log1p(keep[-1]) > 0.08 * span) and (math.log1p(hi) - math.log1p(v) > 0.08 * span):
            keep.append(v)
    keep.append(hi)
    return [math.log1p(v) for v in keep], [_human(v) for v in keep]


def _numeric_panel(ax: Axes, col: Column, real: pl.DataFrame, syn: pl.DataFrame) -> None:
    p, _ = binned_counts(col, real)
    q, _ = binned_counts(col, syn)
    pr, qr = _share(p), _share(q)
    edges = numeric_bin_edges(col)
    width = np.diff(edges)
    ax.bar(edges[:-1], pr[:-1], width=width, align="edge", color=REAL, alpha=0.5, label="real")
    ax.stairs(qr[:-1], edges, color=SYN, lw=1.8, label="synthetic")
    if col.transform == "log1p":
        ticks, labels = _log_ticks(col)
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_xlabel("value (log1p scale)", fontsize=7)
    else:
        ax.tick_params(axis="x", labelsize=7)
    if pr[-1] > 0 or qr[-1] > 0:
        ax.text(
            0.98,
            0.95,
            f"missing: real {pr[-1]:.1%}, syn {qr[-1]:.1%}",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=6.5,
        )


def _categorical_panel(ax: Axes, col: Column, real: pl.DataFrame, syn: pl.DataFrame) -> None:
    p, labels = binned_counts(col, real)
    q, _ = binned_counts(col, syn)
    pr, qr = _share(p), _share(q)
    shown = [i for i in range(len(labels)) if pr[i] > 0 or qr[i] > 0]
    shown.sort(key=lambda i: -max(pr[i], qr[i]))
    rest = shown[MAX_CATEGORIES_SHOWN:]
    shown = shown[:MAX_CATEGORIES_SHOWN]
    names = [labels[i] for i in shown]
    a, b = [pr[i] for i in shown], [qr[i] for i in shown]
    if rest:
        names.append(f"{len(rest)} others")
        a.append(float(sum(pr[i] for i in rest)))
        b.append(float(sum(qr[i] for i in rest)))
    x = np.arange(len(names))
    ax.bar(x - 0.2, a, width=0.4, color=REAL, alpha=0.8, label="real")
    ax.bar(x + 0.2, b, width=0.4, color=SYN, alpha=0.8, label="synthetic")
    short = [n if len(n) <= 14 else n[:13] + "…" for n in names]
    ax.set_xticks(x, short, rotation=50, ha="right", fontsize=6.5, rotation_mode="anchor")


def marginals_figure(
    schema: Schema, real: pl.DataFrame, synthetic: pl.DataFrame, path: Path, tv: dict[str, float] | None = None
) -> Path:
    """Grid of per-column histograms (shares), real vs synthetic, as DP-HFlow Figure 3."""
    n = len(schema.columns)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.1 * ncols, 3.1 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, col in enumerate(schema.columns):
        ax = axes[k // ncols][k % ncols]
        (_categorical_panel if col.is_categorical else _numeric_panel)(ax, col, real, synthetic)
        title = col.name + (f"   (TV {tv[col.name]:.3f})" if tv and col.name in tv else "")
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylabel("share of rows", fontsize=7)
    for k in range(n, nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] != "real")
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside upper right", ncols=2, fontsize=9)
    fig.suptitle("Marginal distributions: real (blue bars) vs synthetic (orange)", fontsize=11)
    return _save(fig, path)


def matrix_figure(
    names: Sequence[str],
    real: np.ndarray,
    synthetic: np.ndarray,
    path: Path,
    title: str,
    vmin: float = -1.0,
    vmax: float = 1.0,
    cmap: str = "RdBu_r",
) -> Path:
    """Real and synthetic association matrices side by side, and their difference (colour
    scale +/- max(0.2, largest |difference|), so small errors stay visible)."""
    m = len(names)
    fig = Figure(figsize=(15, 5.2), layout="constrained")
    axes = fig.subplots(1, 3)
    if m < 2:
        for ax in axes:
            ax.axis("off")
        axes[1].text(0.5, 0.5, "fewer than two columns of this kind", ha="center", va="center")
        fig.suptitle(title)
        return _save(fig, path)
    diff = synthetic - real
    lim = float(np.ceil(10 * max(0.2, float(np.abs(diff).max()))) / 10)
    panels = (
        (real, "real", cmap, vmin, vmax),
        (synthetic, "synthetic", cmap, vmin, vmax),
        (diff, "synthetic − real", "PuOr_r", -lim, lim),
    )
    short = [n if len(n) <= 12 else n[:11] + "…" for n in names]
    fs = 8 if m <= 8 else 6 if m <= 12 else 0
    for ax, (mat, sub, cmap, lo, hi) in zip(axes, panels, strict=True):
        im = ax.imshow(mat, cmap=cmap, vmin=lo, vmax=hi)
        ax.set_xticks(range(m), short, rotation=60, ha="right", fontsize=7, rotation_mode="anchor")
        ax.set_yticks(range(m), short, fontsize=7)
        ax.set_title(sub, fontsize=10)
        if fs:
            for i in range(m):
                for j in range(m):
                    ax.text(
                        j,
                        i,
                        f"{mat[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=fs,
                        color="white" if _dark(mat[i, j], lo, hi, cmap) else "black",
                    )
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def _dark(v: float, lo: float, hi: float, cmap: str) -> bool:
    """Whether a cell's colour is dark enough to need white text."""
    t = (v - lo) / (hi - lo)
    if cmap in ("RdBu_r", "PuOr_r"):
        return abs(t - 0.5) > 0.3
    if cmap == "viridis":
        return t < 0.6
    return t > 0.55


def projection_figure(
    schema: Schema, real: pl.DataFrame, synthetic: pl.DataFrame, path: Path, max_points: int = 3000, seed: int = 0
) -> Path:
    """2-D PCA projection, real and synthetic in side-by-side panels with the same axes.

    The PCA is fitted on the SYNTHETIC rows (public-bounds encoding); real rows are only
    projected. Synthetic data is the DP model's output, so fitting on it is post-processing
    and looks at no private row; the real points appear only in this diagnostic. With fewer
    than 3 synthetic rows a fixed random Gaussian projection (seeded) is used instead.
    """
    xs, _ = feature_matrix(schema, synthetic.sample(n=min(synthetic.height, max_points), seed=seed))
    xr, _ = feature_matrix(schema, real.sample(n=min(real.height, max_points), seed=seed + 1))
    method = "PCA fitted on the synthetic rows"
    if xs.shape[0] >= 3 and xs.shape[1] >= 2 and float(xs.var(axis=0).sum()) > 0:
        pca = PCA(n_components=2, random_state=seed).fit(xs)
        ps, pr = pca.transform(xs), pca.transform(xr)
        ev = pca.explained_variance_ratio_
        axis_names = (f"PC1 ({ev[0]:.0%} of synthetic variance)", f"PC2 ({ev[1]:.0%})")
    else:
        w = np.random.default_rng(seed).normal(size=(xr.shape[1], 2)) / math.sqrt(max(xr.shape[1], 1))
        ps, pr = xs @ w, xr @ w
        method = "fixed random projection (too few synthetic rows for PCA)"
        axis_names = ("projection 1", "projection 2")
    both = np.vstack([pr, ps]) if ps.size else pr
    lo, hi = both.min(axis=0), both.max(axis=0)
    pad = 0.05 * (hi - lo + 1e-9)
    fig = Figure(figsize=(11, 5), layout="constrained")
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    for ax, pts, color, name in ((axes[0], pr, REAL, "real"), (axes[1], ps, SYN, "synthetic")):
        ax.scatter(pts[:, 0], pts[:, 1], s=5, alpha=0.3, color=color, linewidths=0)
        ax.set_title(f"{name} ({pts.shape[0]} rows shown)", fontsize=10)
        ax.set_xlabel(axis_names[0], fontsize=8)
        ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
        ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
    axes[0].set_ylabel(axis_names[1], fontsize=8)
    fig.suptitle(f"2-D projection: {method}", fontsize=11)
    return _save(fig, path)


def utility_vs_epsilon_figure(
    points: Sequence[tuple[float, float, float]],
    path: Path,
    metric: str = "AUROC",
    reference: float | None = None,
) -> Path:
    """Utility (mean +/- std over classifiers) against epsilon, log x axis, as DP-HFlow Fig. 5;
    `reference` draws the train-on-real score as a dashed line."""
    pts = sorted(points)
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    if pts:
        e, m, s = (np.array(v, dtype=np.float64) for v in zip(*pts, strict=True))
        ax.errorbar(e, m, yerr=s, marker="o", capsize=3, color=SYN, label="trained on synthetic")
        ax.set_xscale("log")
        ax.set_xticks(e, [f"{v:g}" for v in e])
        ax.xaxis.set_minor_formatter(NullFormatter())
    if reference is not None:
        ax.axhline(reference, ls="--", color=REAL, label="trained on real")
    ax.set_xlabel("epsilon")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs privacy budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def dcr_figure(to_train: np.ndarray, to_holdout: np.ndarray, path: Path) -> Path:
    """Histograms of the synthetic rows' distance to the closest train and holdout record."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    both = np.concatenate([to_train, to_holdout])
    hi = float(np.quantile(both, 0.99)) if both.size else 1.0
    # matplotlib's stub has bins as a Sequence[float]; it takes the array as it is
    bins = cast(Sequence[float], np.linspace(0.0, max(hi, 1e-6), 40))
    ax.hist(np.minimum(to_train, hi), bins=bins, color=REAL, histtype="step", lw=1.8, label="to closest train row")
    ax.hist(
        np.minimum(to_holdout, hi),
        bins=bins,
        color="#2ca02c",
        histtype="step",
        lw=1.8,
        ls="--",
        label="to closest holdout row",
    )
    ax.set_xlabel("distance (public-bounds encoding; 99th percentile and above in the last bin)", fontsize=8)
    ax.set_ylabel("synthetic rows")
    ax.set_title("Distance to closest record")
    ax.legend(fontsize=8)
    return _save(fig, path)


def loglik_figure(logliks: dict[str, np.ndarray], path: Path) -> Path:
    """Histograms of per-row model log-likelihood for each split (e.g. train vs holdout)."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    arrays = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in logliks.items()}
    finite = np.concatenate([v[np.isfinite(v)] for v in arrays.values()] or [np.zeros(1)])
    lo, hi = np.quantile(finite, [0.01, 0.99]) if finite.size else (0.0, 1.0)
    bins = cast(Sequence[float], np.linspace(lo, hi if hi > lo else lo + 1.0, 50))  # an array (matplotlib's stub)
    colors = {"train": REAL, "holdout": "#2ca02c", "test": "#9467bd"}
    for k, v in arrays.items():
        v = np.clip(v[np.isfinite(v)], bins[0], bins[-1])
        ax.hist(v, bins=bins, density=True, histtype="step", lw=1.6, color=colors.get(k), label=f"{k} ({v.size} rows)")
    ax.set_xlabel("log-likelihood per row (nats; 1st-99th percentile, tails in the end bins)", fontsize=8)
    ax.set_ylabel("density")
    ax.set_title("Model log-likelihood by split")
    ax.legend(fontsize=8)
    return _save(fig, path)
