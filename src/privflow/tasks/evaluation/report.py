"""`evaluate`: every diagnostic of one run, and ONE self-contained HTML report (rendered by
`privflow.tasks.evaluation.html`).

The metrics follow DP-HFlow's Experimental Results (marginals, Kendall's tau RMSE/MAE of
Table 1, nine-classifier train-on-synthetic / test-on-real utility of Tables 2-3), plus
held-out likelihood and empirical privacy-risk checks. They are computed on real rows, so
they are NOT differentially private: they are for the data owner only and are never part of
the released model or synthetic data (diagnostics computed on real rows go to the curator-only
store, never into a release). The report says so in a banner at its top.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

from privflow.core.config import EvaluateConfig
from privflow.data.features import check_columns
from privflow.data.schema import Schema
from privflow.tasks.evaluation.fidelity import FidelityResult, fidelity, range_fidelity
from privflow.tasks.evaluation.html import RANGE_PREFIX, render_html

if TYPE_CHECKING:
    from privflow.tasks.evaluation.risk import DCRResult, MIAResult
    from privflow.tasks.evaluation.utility import UtilityResult


@dataclass(frozen=True)
class EvaluationResult:
    """Flat metrics ('group/name'), the per-classifier and per-column tables, figure paths,
    the HTML path (`html_path`, None when the report is off), wall-clock seconds per section,
    and notes on what was skipped and why."""

    metrics: dict[str, float]
    classifiers: pl.DataFrame | None
    columns: pl.DataFrame | None
    figures: dict[str, Path]
    html_path: Path | None
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def _mean_finite(x: np.ndarray) -> tuple[float, float]:
    a = np.asarray(x, dtype=np.float64).ravel()
    ok = np.isfinite(a)
    return (float(a[ok].mean()) if ok.any() else float("nan")), (float(1.0 - ok.mean()) if a.size else float("nan"))


def likelihood_metrics(loglik: dict[str, Any]) -> dict[str, float]:
    """Mean nats/row per split (over finite rows; the non-finite share is reported beside it),
    the held-out figure ('test', else 'holdout') and the train - held-out gap."""
    out: dict[str, float] = {}
    for k, v in loglik.items():
        mean, bad = _mean_finite(v)
        out[f"likelihood/{k}_nats_per_row"] = mean
        out[f"likelihood/{k}_nonfinite_share"] = bad
    held = "test" if "test" in loglik else "holdout" if "holdout" in loglik else None
    if held:
        out["likelihood/heldout_nats_per_row"] = out[f"likelihood/{held}_nats_per_row"]
        if "train" in loglik:
            out["likelihood/generalization_gap"] = (
                out["likelihood/train_nats_per_row"] - out["likelihood/heldout_nats_per_row"]
            )
    return out


def evaluate(
    schema: Schema,
    real_train: pl.DataFrame,
    real_test: pl.DataFrame | None,
    synthetic: pl.DataFrame,
    config: EvaluateConfig,
    out_dir: Path | str,
    loglik: dict[str, Any] | None = None,
    seed: int = 0,
) -> EvaluationResult:
    """Run the diagnostics that `config` switches on and write the report into `out_dir`.

    Fidelity compares `synthetic` with `real_train`; utility trains on each and tests on
    `real_test`; DCR uses `real_test` as the holdout; the MIA takes loglik['train'] as members
    and loglik['holdout'] (else loglik['test']) as non-members. Parts whose inputs are absent
    (no test table: pass None, or an empty one; no target; no log-likelihoods) are skipped with
    a note that says which, not an error.
    `config.synthetic_rows` and `config.test_data` are the caller's (sampling, loading).
    """
    with threadpool_limits(limits=1):  # one core: predictable on a shared worker (see utility.classify)
        return _evaluate(schema, real_train, real_test, synthetic, config, Path(out_dir), loglik, seed)


@dataclass
class _Diagnostics:
    """What the diagnostics produced so far (metrics, timings, notes and the parts' results)."""

    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fid: FidelityResult | None = None
    util: UtilityResult | None = None
    dcr: DCRResult | None = None
    mia: MIAResult | None = None
    no_test: str = "no real test table was given (--test-data)"  # why the parts needing one are skipped


def _fidelity_and_utility(
    d: _Diagnostics,
    schema: Schema,
    real_train: pl.DataFrame,
    real_test: pl.DataFrame | None,
    synthetic: pl.DataFrame,
    config: EvaluateConfig,
    seed: int,
) -> None:
    if config.fidelity:
        t = time.perf_counter()
        d.fid = fidelity(schema, real_train, synthetic)
        d.metrics.update(d.fid.metrics())
        # on the real rows' own range: what 20 bins over wide public bounds cannot show
        d.metrics.update({f"{RANGE_PREFIX}{k}": v for k, v in range_fidelity(schema, real_train, synthetic).items()})
        d.timings["fidelity"] = time.perf_counter() - t
    if not config.utility:
        return
    if schema.target is None:
        d.notes.append("Utility skipped: the schema names no target column.")
    elif real_test is None:
        d.notes.append(f"Utility skipped: {d.no_test}.")
    else:
        # scikit-learn is imported here, not at module top: a run that skips utility never pays for it
        from privflow.tasks.evaluation.utility import utility

        t = time.perf_counter()
        d.util = utility(schema, synthetic, real_train, real_test, repeats=config.repeats, seed=seed)
        d.metrics.update(d.util.metrics())
        d.timings["utility"] = time.perf_counter() - t


def _likelihood_and_risk(
    d: _Diagnostics,
    schema: Schema,
    real_train: pl.DataFrame,
    real_test: pl.DataFrame | None,
    synthetic: pl.DataFrame,
    config: EvaluateConfig,
    loglik: dict[str, Any] | None,
    seed: int,
) -> None:
    if config.likelihood:
        if loglik:
            d.metrics.update(likelihood_metrics(loglik))
        else:
            d.notes.append("Likelihood skipped: no per-row log-likelihoods were given.")
    if not config.privacy_risk:
        return
    from privflow.tasks.evaluation.risk import dcr, likelihood_mia  # scikit-learn: only when asked for

    t = time.perf_counter()
    if real_test is not None:
        d.dcr = dcr(schema, synthetic, real_train, real_test, seed=seed)
        d.metrics.update(d.dcr.metrics())
    else:
        d.notes.append(f"Distance to closest record skipped (it needs a real test table as holdout): {d.no_test}.")
    non_members = None if not loglik else loglik.get("holdout", loglik.get("test"))
    if loglik and "train" in loglik and non_members is not None:
        d.mia = likelihood_mia(np.asarray(loglik["train"]), np.asarray(non_members))
        d.metrics.update(d.mia.metrics())
    else:
        d.notes.append("Membership inference skipped: needs log-likelihoods of 'train' and 'holdout' (or 'test') rows.")
    d.timings["privacy_risk"] = time.perf_counter() - t


def _figures(
    d: _Diagnostics,
    schema: Schema,
    real_train: pl.DataFrame,
    synthetic: pl.DataFrame,
    config: EvaluateConfig,
    fdir: Path,
    loglik: dict[str, Any] | None,
    seed: int,
) -> dict[str, Path]:
    from privflow.tasks.evaluation import figures as figs  # matplotlib: only for the HTML report's figures

    fid, metrics = d.fid, d.metrics
    paths = {
        "marginals": figs.marginals_figure(
            schema, real_train, synthetic, fdir / "marginals.png", fid.tv if fid else None
        )
    }
    if fid:
        k_rmse = metrics["fidelity/kendall_rmse"]
        paths["kendall"] = figs.matrix_figure(
            fid.numeric,
            fid.kendall_real,
            fid.kendall_synthetic,
            fdir / "kendall.png",
            f"Kendall's tau of numeric columns (RMSE {k_rmse:.3f}, MAE {metrics['fidelity/kendall_mae']:.3f})",
        )
        paths["cramers_v"] = figs.matrix_figure(
            fid.categorical,
            fid.cramer_real,
            fid.cramer_synthetic,
            fdir / "cramers_v.png",
            f"Cramér's V of categorical columns (MAE {metrics['fidelity/cramers_v_mae']:.3f})",
            vmin=0.0,
            vmax=1.0,
            cmap="viridis",
        )
    paths["projection"] = figs.projection_figure(schema, real_train, synthetic, fdir / "projection.png", seed=seed)
    if d.dcr is not None:
        paths["dcr"] = figs.dcr_figure(d.dcr.to_train, d.dcr.to_holdout, fdir / "dcr.png")
    if loglik and (config.likelihood or config.privacy_risk):
        paths["loglik"] = figs.loglik_figure({k: np.asarray(v) for k, v in loglik.items()}, fdir / "loglik.png")
    return paths


def _evaluate(
    schema: Schema,
    real_train: pl.DataFrame,
    real_test: pl.DataFrame | None,
    synthetic: pl.DataFrame,
    config: EvaluateConfig,
    out: Path,
    loglik: dict[str, Any] | None,
    seed: int,
) -> EvaluationResult:
    out.mkdir(parents=True, exist_ok=True)
    d = _Diagnostics()
    if real_test is not None and real_test.height == 0:
        real_test = None
        d.no_test = "the real test table (--test-data) is empty"
        d.notes.append("The real test table (--test-data) is empty; it is treated as absent.")
    check_columns(schema, real_train, "real training")
    check_columns(schema, synthetic, "synthetic")
    if real_test is not None:
        check_columns(schema, real_test, "real test")
    t_all = time.perf_counter()
    _fidelity_and_utility(d, schema, real_train, real_test, synthetic, config, seed)
    _likelihood_and_risk(d, schema, real_train, real_test, synthetic, config, loglik, seed)
    classifiers = d.util.table() if d.util else None
    fid = d.fid
    columns = (
        pl.DataFrame(
            {"column": list(fid.tv), "type": [schema.column(c).type for c in fid.tv], "tv": list(fid.tv.values())}
        )
        if fid
        else None
    )
    paths: dict[str, Path] = {}
    html_path: Path | None = None
    if config.report:
        t = time.perf_counter()
        paths = _figures(d, schema, real_train, synthetic, config, out / "figures", loglik, seed)
        d.timings["figures"] = time.perf_counter() - t
        d.timings["total"] = time.perf_counter() - t_all
        html_path = out / "evaluation.html"
        rows = {
            "real train": real_train.height,
            "real test": None if real_test is None else real_test.height,
            "synthetic": synthetic.height,
        }
        html_path.write_text(
            render_html(schema, d.metrics, classifiers, columns, paths, d.timings, d.notes, rows=rows, mia=d.mia),
            encoding="utf-8",
        )
    d.timings["total"] = time.perf_counter() - t_all
    return EvaluationResult(d.metrics, classifiers, columns, paths, html_path, d.timings, tuple(d.notes))


# ---------------------------------------------------------------- HTML
