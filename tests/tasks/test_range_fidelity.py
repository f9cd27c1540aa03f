"""Tests of `range_fidelity` (tasks/evaluation/fidelity.py) against references computed by hand
with numpy and scipy (np.histogram, np.std, np.corrcoef, scipy.stats.spearmanr), and of where
its figures go: the curator-only evaluation metrics, the HTML report and the run summary
(why: a table that fills 3..11 of bounds 0..60 hides wide synthetic tails from 20 bins)."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.stats import spearmanr

from privflow.core.config import EvaluateConfig
from privflow.data.schema import Schema
from privflow.tasks.evaluation import evaluate
from privflow.tasks.evaluation.fidelity import correlation_matrix, marginal_tv, range_fidelity


def _schema() -> Schema:
    return Schema.model_validate(
        {
            "dataset": {"name": "measures"},
            "columns": [
                {"name": "a", "type": "numeric", "bounds": [0, 60]},
                {"name": "b", "type": "numeric", "bounds": [0, 60], "nullable": True},
                {"name": "n", "type": "integer", "bounds": [0, 100]},
                {"name": "y", "type": "numeric", "bounds": [0, 1000], "transform": "log1p"},
                {"name": "c", "type": "categorical", "categories": ["u", "v"]},
            ],
        }
    )


def _frames(rng: np.random.Generator, n_real: int = 300, n_syn: int = 400) -> tuple[pl.DataFrame, pl.DataFrame]:
    def table(n: int, spread: float) -> pl.DataFrame:
        a = 7 + spread * rng.normal(0, 1.2, n)
        b = 0.6 * a + spread * rng.normal(0, 1.0, n)
        b_null = rng.random(n) < 0.15
        return pl.DataFrame(
            {
                "a": np.clip(a, 3, 11) if spread == 1 else np.clip(a, 0, 60),
                "b": [None if m else float(v) for m, v in zip(b_null, np.clip(b, 0, 60), strict=True)],
                "n": rng.integers(10, 30, n) + (a > 7).astype(np.int64) * 5,
                "y": np.expm1(rng.uniform(0, 6, n)),
                "c": rng.choice(["u", "v"], n),
            },
            schema_overrides={"b": pl.Float64, "n": pl.Int64},
        )

    return table(n_real, 1.0), table(n_syn, 2.5)


def _reference(schema: Schema, real: pl.DataFrame, syn: pl.DataFrame, n_bins: int) -> dict[str, float]:
    """The figures computed independently: np.histogram, np.std, np.corrcoef, scipy's spearmanr."""
    ref: dict[str, float] = {}
    names = ["a", "b", "n", "y"]
    for name in names:
        r = real.get_column(name).drop_nulls().cast(pl.Float64).to_numpy()
        s = syn.get_column(name).drop_nulls().cast(pl.Float64).to_numpy()
        lo, hi = r.min(), r.max()
        ref[f"range/outside/{name}"] = np.mean((s < lo) | (s > hi))
        ref[f"range/std_ratio/{name}"] = np.std(s, ddof=1) / np.std(r, ddof=1)
        f = np.log1p if schema.column(name).transform == "log1p" else (lambda v: v)
        s_in = s[(s >= lo) & (s <= hi)]
        hr, _ = np.histogram(f(r), bins=n_bins, range=(f(lo), f(hi)))
        hs, _ = np.histogram(f(s_in), bins=n_bins, range=(f(lo), f(hi)))
        p = np.concatenate([[0], hr, [0]]) / r.size
        q = np.concatenate([[np.sum(s < lo)], hs, [np.sum(s > hi)]]) / s.size
        ref[f"range/tv_fine/{name}"] = 0.5 * np.abs(p - q).sum()
    ratios = np.array([ref[f"range/std_ratio/{n}"] for n in names])
    ref["range/outside_max"] = max(ref[f"range/outside/{n}"] for n in names)
    ref["range/std_ratio_worst"] = ratios[np.argmax(np.abs(np.log(ratios)))]
    ref["range/tv_fine_mean"] = np.mean([ref[f"range/tv_fine/{n}"] for n in names])
    for method in ("pearson", "spearman"):
        errs = []
        for i, u in enumerate(names):
            for v in names[i + 1 :]:
                rs = []
                for df in (real, syn):
                    pair = df.select(u, v).drop_nulls().cast(pl.Float64).to_numpy()
                    if method == "pearson":
                        rs.append(np.corrcoef(pair[:, 0], pair[:, 1])[0, 1])
                    else:
                        rs.append(spearmanr(pair[:, 0], pair[:, 1]).statistic)
                errs.append(abs(rs[0] - rs[1]))
        ref[f"corr/{method}_max_error"] = max(errs)
        ref[f"corr/{method}_mean_error"] = float(np.mean(errs))
    return ref


@pytest.mark.parametrize("n_bins", [100, 7])
def test_range_fidelity_matches_an_independent_reference(n_bins: int) -> None:
    schema = _schema()
    real, syn = _frames(np.random.default_rng(4))
    got = range_fidelity(schema, real, syn, n_bins=n_bins)
    ref = _reference(schema, real, syn, n_bins)
    assert set(got) == set(ref)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert not any(k.endswith("/c") for k in got)  # categoricals have no range


def test_a_narrow_table_is_caught_where_twenty_public_bins_are_not() -> None:
    """Real rows in 3..11 of the public 0..60; 3% of the synthetic rows in a thin tail over the
    bounds: the 20 public bins barely move, the figures on the real range show it."""
    schema = Schema.model_validate(
        {"dataset": {"name": "m"}, "columns": [{"name": "a", "type": "numeric", "bounds": [0, 60]}]}
    )
    rng = np.random.default_rng(1)
    real = pl.DataFrame({"a": np.clip(rng.normal(7, 1.2, 4000), 3, 11)})
    body = np.clip(rng.normal(7, 1.2, 4000), 3, 11)
    syn = pl.DataFrame({"a": np.where(rng.random(4000) < 0.03, rng.uniform(0, 60, 4000), body)})
    assert marginal_tv(schema, real, syn)["a"] < 0.04
    fine = range_fidelity(schema, real, syn)
    assert 0.02 < fine["range/outside/a"] == fine["range/outside_max"] < 0.04
    assert fine["range/std_ratio/a"] > 2 and fine["range/std_ratio_worst"] == fine["range/std_ratio/a"]
    assert fine["range/tv_fine/a"] > fine["range/outside/a"]


def test_a_table_against_itself_is_perfect_and_undefined_figures_are_nan() -> None:
    schema = _schema()
    real, _ = _frames(np.random.default_rng(2))
    same = range_fidelity(schema, real, real)
    for name in ("a", "b", "n", "y"):
        assert same[f"range/outside/{name}"] == 0.0
        assert same[f"range/std_ratio/{name}"] == pytest.approx(1.0)
        assert same[f"range/tv_fine/{name}"] == 0.0
    assert same["corr/pearson_max_error"] == 0.0 and same["corr/spearman_mean_error"] == 0.0
    constant = real.with_columns(pl.lit(5.0).alias("a"))
    got = range_fidelity(schema, constant, real)
    assert np.isnan(got["range/std_ratio/a"])  # real std 0
    # all real values at 5: one interior bin; synthetic values elsewhere fall in the overflow bins
    a = real.get_column("a").to_numpy()
    assert got["range/outside/a"] == pytest.approx(np.mean(a != 5.0))
    assert got["range/tv_fine/a"] == pytest.approx(np.mean(a != 5.0))


def test_worst_ratio_is_the_farthest_from_one_in_log_terms() -> None:
    schema = Schema.model_validate(
        {
            "dataset": {"name": "toy"},
            "columns": [
                {"name": "x", "type": "numeric", "bounds": [0, 100]},
                {"name": "z", "type": "numeric", "bounds": [0, 100]},
            ],
        }
    )
    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    real = pl.DataFrame({"x": base, "z": base})
    syn = pl.DataFrame({"x": 3 + 0.5 * (base - 3), "z": 3 + 1.8 * (base - 3)})  # ratios 0.5 and 1.8
    got = range_fidelity(schema, real, syn)
    assert got["range/std_ratio/x"] == pytest.approx(0.5) and got["range/std_ratio/z"] == pytest.approx(1.8)
    assert got["range/std_ratio_worst"] == pytest.approx(0.5)  # |log 0.5| = 0.69 > |log 1.8| = 0.59


def test_single_numeric_column_has_no_correlation_error() -> None:
    schema = Schema.model_validate(
        {"dataset": {"name": "toy"}, "columns": [{"name": "x", "type": "numeric", "bounds": [0, 1]}]}
    )
    df = pl.DataFrame({"x": [0.1, 0.5, 0.9]})
    got = range_fidelity(schema, df, df)
    assert np.isnan(got["corr/pearson_max_error"]) and np.isnan(got["corr/spearman_mean_error"])


def test_dates_are_compared_as_their_lowered_integers() -> None:
    schema = Schema.model_validate(
        {
            "dataset": {"name": "toy"},
            "columns": [
                {"name": "d", "type": "date", "bounds": ["2015-01-01", "2024-12-31"]},
                {"name": "x", "type": "numeric", "bounds": [0, 10]},
            ],
        }
    )
    rng = np.random.default_rng(3)
    days_r, days_s = rng.integers(17000, 18000, 200), rng.integers(16800, 18300, 250)
    x_r, x_s = rng.uniform(0, 10, 200), rng.uniform(0, 10, 250)

    def dates(days: np.ndarray) -> list[date]:
        return [date(1970, 1, 1) + timedelta(days=int(d)) for d in days]

    as_dates = range_fidelity(
        schema, pl.DataFrame({"d": dates(days_r), "x": x_r}), pl.DataFrame({"d": dates(days_s), "x": x_s})
    )
    as_days = range_fidelity(schema, pl.DataFrame({"d": days_r, "x": x_r}), pl.DataFrame({"d": days_s, "x": x_s}))
    assert as_dates == pytest.approx(as_days)
    assert as_days["range/outside/d"] == pytest.approx(np.mean((days_s < days_r.min()) | (days_s > days_r.max())))


def test_correlations_subsample_large_tables_with_a_fixed_seed() -> None:
    schema = _schema()
    real, _ = _frames(np.random.default_rng(5), 500, 10)
    names = ["a", "b", "n", "y"]
    got = correlation_matrix(schema, real, names, "spearman", max_rows=120, seed=0)
    assert np.array_equal(got, correlation_matrix(schema, real, names, "spearman", max_rows=120, seed=0))
    sub = real.sample(n=120, seed=0)
    assert np.allclose(got, correlation_matrix(schema, sub, names, "spearman", max_rows=None))
    pair = sub.select("a", "b").drop_nulls().to_numpy()
    assert got[0, 1] == pytest.approx(spearmanr(pair[:, 0], pair[:, 1]).statistic)


def test_range_figures_reach_the_curator_report_not_only_the_function(tmp_path: Path) -> None:
    schema = _schema()
    real, syn = _frames(np.random.default_rng(6), 400, 400)
    cfg = EvaluateConfig(utility=False, likelihood=False, privacy_risk=False, report=True)
    res = evaluate(schema, real, None, syn, cfg, tmp_path)
    direct = range_fidelity(schema, real, syn)
    for key, value in direct.items():
        assert res.metrics[f"fidelity/{key}"] == pytest.approx(value, nan_ok=True), key
    assert res.html_path is not None
    page = res.html_path.read_text(encoding="utf-8")
    assert "Synthetic values against the real range" in page
    assert "outside the real range" in page and "Spearman" in page


def test_the_run_summary_names_the_column_most_outside(capsys) -> None:
    from types import SimpleNamespace

    from privflow.cli import print_summary

    metrics = {
        "fidelity/tv_mean": 0.007,
        "fidelity/range/outside/a": 0.026,
        "fidelity/range/outside/b": 0.004,
        "fidelity/range/outside_max": 0.026,
    }
    summary = SimpleNamespace(
        epsilon=1.0, delta=1e-5, epsilon_rdp=1.1, stages={}, dataset_epsilon=1.0, dataset_delta=1e-5,
        metrics=metrics, wall_seconds=1.0, model_name="m", model_version="1", alias="champion",
        alias_version="1", promotion=None, curator_dir="/c", synthetic_path="/s.csv", report_path=None,
        mlflow_run_id="x", run_id="r",
    )  # fmt: skip
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert "synthetic outside the real range (not DP) │ max 2.6% (a)" in out, out
    print_summary(SimpleNamespace(**{**vars(summary), "metrics": {"fidelity/tv_mean": 0.007}}))
    assert "outside the real range" not in capsys.readouterr().out
