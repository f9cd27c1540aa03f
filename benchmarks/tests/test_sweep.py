"""The benchmark: its 2-D datasets, the NLL convention, the DP-MoG plan and density, and a
quick sweep run as Prefect tasks on a local Dask cluster of two worker processes."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import multivariate_normal, norm

from benchmarks import datasets as dm
from benchmarks.cells import Cell, build_cells, dpmog_plan, parse_epsilon
from benchmarks.report import summarise
from privflow.models import build_flow
from privflow.privacy.accounting.accountant import PLDAccountant, PRVAccountant
from privflow.tasks.fit import exact_mog_prior, exact_statistics


@pytest.mark.parametrize("name", dm.TWO_D)
def test_generator_is_reproducible_in_bounds_and_seed_dependent(name: str) -> None:
    a, b, c = dm.generate(name, 2000, 3), dm.generate(name, 2000, 3), dm.generate(name, 2000, 4)
    assert a.shape == (2000, 2) and np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    (x_lo, x_hi), (y_lo, y_hi) = dm.BOUNDS[name]
    assert (a[:, 0] >= x_lo).all() and (a[:, 0] <= x_hi).all() and (a[:, 1] >= y_lo).all() and (a[:, 1] <= y_hi).all()
    assert dm.generate(name, 0, 1).shape == (0, 2)


def test_generators_have_their_documented_geometry() -> None:
    rng_free = 20_000
    g = dm.eight_gaussians(rng_free, 0)
    centres = np.array([[3 + 2 * math.cos(k * math.pi / 4), 3 + 2 * math.sin(k * math.pi / 4)] for k in range(8)])
    dist = np.linalg.norm(g[:, None, :] - centres[None], axis=2)
    nearest = dist.argmin(1)
    assert np.bincount(nearest, minlength=8).min() > rng_free / 8 * 0.9  # equal weights
    resid = g - centres[nearest]
    assert abs(resid.std() - 0.2) < 0.01
    p = dm.pinwheel(rng_free, 0)
    radius = np.linalg.norm(p, axis=1)  # 10 * |(1 + 0.3 e1, 0.05 e2)|: mean ~ 10, std ~ 3
    assert abs(radius.mean() - 10.0) < 0.15 and abs(radius.std() - 3.0) < 0.15
    m = dm.half_moons(rng_free, 0)
    upper = np.abs(np.linalg.norm(m, axis=1) - 1.0)
    lower = np.abs(np.linalg.norm(m - np.array([1.0, 0.5]), axis=1) - 1.0)
    assert np.median(np.minimum(upper, lower)) < 0.05  # on one of the two unit half circles, noise 0.05


def test_two_d_split_is_fixed_and_schema_encodes_inside_the_unit_box() -> None:
    data, again = dm.load("pinwheel"), dm.load("pinwheel")
    assert (data.train.height, data.test.height) == (27_000, 3_000)
    assert data.train.equals(again.train) and data.test.equals(again.test)
    assert data.schema.dataset.expected_rows == 27_000
    u = data.codec.encode(data.test)
    assert u.shape == (3_000, 2) and (u > 0).all() and (u < 1).all()


def test_nll_offset_matches_a_gaussian_scored_in_both_coordinate_systems() -> None:
    """Independent check of the conversion: one Gaussian density of the raw points, scored by
    scipy once in privflow's encoded coordinates and once in standardised coordinates."""
    name = "half-moons"
    x = dm.generate(name, 5_000, 11)
    (m0, m1), (s0, s1) = dm.standardisation(name)
    lo = np.array([b[0] for b in dm.BOUNDS[name]])
    width = np.array([b[1] - b[0] for b in dm.BOUNDS[name]])
    mu, cov = x.mean(0), np.cov(x.T)
    u = (x - lo) / width
    nll_encoded = -multivariate_normal((mu - lo) / width, cov / np.outer(width, width)).logpdf(u).mean()
    sd = np.array([s0, s1])
    s = (x - np.array([m0, m1])) / sd
    nll_std = -multivariate_normal((mu - np.array([m0, m1])) / sd, cov / np.outer(sd, sd)).logpdf(s).mean()
    assert nll_encoded + dm.std_nll_offset(name) == pytest.approx(nll_std, abs=1e-9)


def test_standardisation_is_the_population_moments() -> None:
    mean, std = dm.standardisation("8-gaussians")
    # mixture of 8 N(c_k, 0.04 I) on a circle of radius 2 around (3, 3): var = 2 + 0.04 per axis
    assert mean == pytest.approx((3.0, 3.0), abs=0.01)
    assert std == pytest.approx((math.sqrt(2.04), math.sqrt(2.04)), rel=0.005)


def test_dpmog_plan_meets_the_target_under_two_accountants() -> None:
    plan = dpmog_plan(1.0, 1e-5, 0.03, 10)
    assert [s.name for s in plan.stages] == ["dp_stats", "dp_prior"]
    assert 0.99 <= plan.epsilon <= 1.0
    assert PLDAccountant().epsilon(plan.events, 1e-5) <= 1.0
    assert PRVAccountant().epsilon(plan.events, 1e-5) == pytest.approx(plan.epsilon, rel=0.03)


def test_dpmog_density_is_the_mixture_under_the_change_of_variables() -> None:
    """The DP-MoG model's log_prob equals a numpy/scipy evaluation of the same mixture:
    logit map, DP standardisation, mixture log-density, and both log-Jacobians."""
    x = dm.load("8-gaussians", max_train=2_000).codec.encode(dm.load("8-gaussians", max_train=2_000).train)
    torch.manual_seed(0)
    model = build_flow("maf", [None, None], blocks=1, hidden=8, prior="mog", mog_components=4)
    mean, std = exact_statistics(model, x)
    params = exact_mog_prior(model, x, mean, std, k=4, iterations=5, seed=0)
    probe = x[:300].astype(np.float64)
    with torch.no_grad():
        got = model.eval().log_prob(torch.as_tensor(probe, dtype=torch.float32)).numpy()
    a = model.logit.alpha
    s = a + (1 - 2 * a) * probe
    y = np.log(s) - np.log1p(-s)
    log_jac = (math.log(1 - 2 * a) - np.log(s) - np.log1p(-s)).sum(1) - np.log(std).sum()
    z = (y - mean) / std
    comp = norm.logpdf(z[:, None, :], params.means[None], params.stds[None]).sum(-1) + np.log(params.weights)[None]
    want = logsumexp(comp, axis=1) + log_jac
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3)


def test_cells_and_epsilon_parsing() -> None:
    assert parse_epsilon("inf") is None and parse_epsilon("1") == 1.0 and parse_epsilon("non-private") is None
    with pytest.raises(ValueError):
        parse_epsilon("0")
    cells = build_cells(["adult", "pinwheel"], ["dpmog"], [1.0, None], [0, 1])
    assert len(cells) == 2 * 2 * 2 + 2  # + one real-data reference per (table, seed)
    with pytest.raises(ValueError):
        build_cells(["nope"], ["maf"], [1.0], [0])


def test_summary_is_mean_and_sample_std_over_seeds() -> None:
    recs = [
        {"dataset": "d", "model": "maf", "epsilon": 1.0, "seed": s, "status": "ok", "nll": v}
        for s, v in enumerate([1.0, 2.0, 4.0])
    ]
    recs.append({"dataset": "d", "model": "maf", "epsilon": 1.0, "seed": 9, "status": "error"})
    mean, std, n = summarise(recs)[("d", "maf", 1.0)]["nll"]
    assert (mean, n) == (pytest.approx(7 / 3), 3) and std == pytest.approx(np.std([1, 2, 4], ddof=1))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_quick_sweep_on_a_local_dask_cluster(tmp_path) -> None:
    from benchmarks.sweep import benchmark

    out = tmp_path / "RESULTS.md"
    records = benchmark(
        datasets=["pinwheel", "adult"],
        models=["dphflow", "dpmog"],  # a maf cell runs in test_sweep_dask.py's sweep
        epsilons=[1.0, None],
        seeds=[0],
        out=out,
        task_runner="dask",
        workers=2,
        quick=True,
        work_dir=str(tmp_path / "data"),
    )
    assert len(records) == 2 * 2 * 2 + 1
    bad = [
        (Cell(r["dataset"], r["model"], r["epsilon"], r["seed"]).label, r.get("error"))
        for r in records
        if r["status"] != "ok"
    ]
    assert not bad, bad
    for r in records:
        keys = ["macro_f1", "auroc", "ap"] if r["model"] == "real-data" else ["tv_mean", "quality_score"]
        if r["model"] != "real-data":
            # the test NLL is reported in the schema codec's space only (a copula codec's is the cell's own)
            keys += ["nll_copula"] if "nll_copula" in r else ["nll", "nll_encoded"]
            assert r["model"] != "dpmog" or "nll" in r  # DP-MoG always fits in the schema codec
        if r["dataset"] == "adult" and r["model"] != "real-data":
            keys += ["macro_f1", "auroc", "ap", "kendall_rmse", "kendall_mae"]
        for k in keys:
            assert np.isfinite(r[k]), (r["dataset"], r["model"], r["epsilon"], k, r[k])
        if r["model"] != "real-data" and r["epsilon"] is not None:
            assert r["epsilon_spent"] <= r["epsilon"]
    text = out.read_text()
    assert "## pinwheel" in text and "## adult" in text and "quick mode" in text
    assert "python -m benchmarks.sweep --datasets pinwheel,adult" in text
    assert pl.Series([r["seconds"] for r in records]).min() > 0
