"""The peers' comparison: the main side's public spec, discretisation and decoding
(ordinary unit tests), the new cells' bookkeeping and the results file's targets; and, when
.venv-peers exists, MST/AIM end to end, the i.i.d. sampler against exact marginals, and a quick
sweep with the peers beside privflow's ablations."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap

import numpy as np
import polars as pl
import pytest

from benchmarks.bench_common import ROOT as REPO
from benchmarks.cells import PEERS, Cell, build_cells, copula_cell, run_config
from benchmarks.peers import driver as peers
from benchmarks.presets import PRESETS, TARGET_SETS, Target, default_out
from benchmarks.report import worst_seed, write_results
from benchmarks.sweep import parser, resolve
from privflow.data.features import binned_counts, numeric_bin_edges
from privflow.data.schema import Schema
from privflow.privacy.accounting.accountant import PLDAccountant

HAVE_PEERS = peers.peers_python() is not None
NEEDS_PEERS = pytest.mark.skipif(
    not HAVE_PEERS,
    reason=f"no peers venv at {peers.peers_venv()} (CI does not build it; `{peers.SETUP_COMMAND}` does)",
)

SCHEMA = Schema.model_validate(
    {
        "dataset": {"name": "peers-test", "expected_rows": 3000},
        "target": "y",
        "columns": [
            {"name": "city", "type": "categorical", "categories": ["a", "b", "c"], "nullable": True},
            {"name": "rate", "type": "integer", "bounds": [1, 4]},
            {"name": "hours", "type": "integer", "bounds": [1, 100]},
            {"name": "gain", "type": "integer", "bounds": [0, 100000], "transform": "log1p"},
            {"name": "score", "type": "numeric", "bounds": [-5.0, 5.0], "nullable": True},
            {"name": "y", "type": "categorical", "categories": ["no", "yes"]},
        ],
    }
)


def _rows(n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    hours = np.clip(rng.normal(40, 12, n).round(), 1, 100).astype(np.int64)
    gain = np.where(rng.random(n) < 0.9, 0, np.exp(rng.uniform(0, 11.5, n)).astype(np.int64))
    score = np.where(rng.random(n) < 0.1, np.nan, np.clip(rng.normal(0, 2, n), -5, 5))
    y = np.where(hours + rng.normal(0, 5, n) > 45, "yes", "no")
    return pl.DataFrame(
        {
            "city": [c or None for c in rng.choice(["a", "b", "c", ""], n).tolist()],
            "rate": rng.integers(1, 5, n),
            "hours": hours,
            "gain": np.clip(gain, 0, 100000),
            "score": score,
            "y": y,
        }
    ).with_columns(
        pl.col("city").cast(pl.Enum(["a", "b", "c"])),
        pl.col("score").fill_nan(None),
        pl.col("y").cast(pl.Enum(["no", "yes"])),
    )


# ---------------------------------------------------------------------------- main side (CI)


def test_code_domains_come_from_the_schema() -> None:
    cols = {c.name: c for c in peers.peer_columns(SCHEMA)}
    assert (cols["city"].kind, cols["city"].size) == ("categorical", 4)  # 3 declared + null
    assert (cols["rate"].kind, cols["rate"].size) == ("atoms", 4)  # a small integer support: exact
    assert (cols["hours"].kind, cols["hours"].size) == ("bins", 20)
    assert (cols["gain"].kind, cols["gain"].size) == ("bins", 20)
    assert (cols["score"].kind, cols["score"].size) == ("bins", 21)  # + null
    # the bins are the benchmark's marginal-TV bins: public bounds, transform scale, 20 equal widths
    for name in ("hours", "gain", "score"):
        np.testing.assert_allclose(cols[name].edges, numeric_bin_edges(SCHEMA.column(name)))
    assert cols["gain"].edges[-1] == pytest.approx(math.log1p(100000))


def test_spec_is_public_and_checked() -> None:
    spec = peers.peer_spec(SCHEMA, "aim", 1.0, 1e-5, 7, 3000)
    assert spec["aim_rounds"] == 48 and spec["bins"] == 20 and spec["rows"] == 3000 and spec["seed"] == 7
    assert [c["name"] for c in spec["columns"]] == SCHEMA.names
    assert spec["columns"][0]["categories"] == ["a", "b", "c"]
    json.dumps(spec)  # JSON-ready
    again = peers.peer_spec(SCHEMA, "aim", 1.0, 1e-5, 7, 3000)
    assert again == spec  # a function of the public inputs only
    assert peers.quick_aim_rounds(SCHEMA) == 14
    for bad in (dict(method="gan"), dict(epsilon=0.0), dict(delta=1.0), dict(rows=0), dict(method="aim", aim_rounds=5)):
        args = {"method": "mst", "epsilon": 1.0, "delta": 1e-5, "seed": 0, "rows": 10} | bad
        with pytest.raises(ValueError):
            peers.peer_spec(SCHEMA, **args)


def test_codes_match_the_evaluation_bins() -> None:
    df = _rows(4000, 0)
    codes = peers.encode_for_peer(SCHEMA, df)
    assert codes.columns == SCHEMA.names and all(t == pl.Int64 for t in codes.dtypes)
    for name in ("hours", "gain", "score"):
        counts, _ = binned_counts(SCHEMA.column(name), df)  # 20 bins + missing, as marginal TV bins them
        got = np.bincount(codes[name].to_numpy(), minlength=21)
        np.testing.assert_array_equal(got[:20], counts[:20])
        assert got[20:].sum() == counts[20]
    assert codes["rate"].to_list() == (df["rate"] - 1).to_list()
    assert (codes["city"].to_numpy() == 3).sum() == df["city"].null_count()


def test_decoding_keeps_every_value_in_its_cell_with_schema_types() -> None:
    df = _rows(4000, 1)
    codes = peers.encode_for_peer(SCHEMA, df)
    back = peers.decode_from_peer(SCHEMA, codes, seed=5)
    assert back.schema == df.schema  # Enum / Int64 / Float64, as validate returns them
    assert peers.encode_for_peer(SCHEMA, back).equals(codes)  # every value decodes inside its own cell
    for name in ("city", "rate", "y"):
        assert back[name].to_list() == df[name].to_list()  # categories and atoms exactly
    assert back["score"].is_null().to_list() == df["score"].is_null().to_list()
    assert peers.decode_from_peer(SCHEMA, codes, seed=5).equals(back)  # the public seed fixes the draws
    assert not peers.decode_from_peer(SCHEMA, codes, seed=6).equals(back)


def test_integer_bins_decode_to_every_integer_they_hold() -> None:
    """Uniform on the transform scale over the dequantized span of the bin's integers, floored:
    the top bin's 96..100 all appear (the bound included), nothing else does."""
    top = pl.DataFrame({n: [0] * 4000 for n in SCHEMA.names}).with_columns(pl.lit(19).alias("hours"))
    back = peers.decode_from_peer(SCHEMA, top, seed=0)
    assert sorted(back["hours"].unique().to_list()) == [96, 97, 98, 99, 100]
    # log1p: the first bins of [0, 1e5] hold single integers or short runs; every draw stays in its bin
    codes = pl.DataFrame({n: list(range(20)) * 200 if n == "gain" else [0] * 4000 for n in SCHEMA.names})
    back = peers.decode_from_peer(SCHEMA, codes, seed=0)
    assert peers.encode_for_peer(SCHEMA, back)["gain"].to_list() == codes["gain"].to_list()
    assert back["gain"].min() == 0 and back["gain"].max() <= 100000


def test_bad_codes_and_values_are_refused() -> None:
    codes = peers.encode_for_peer(SCHEMA, _rows(10, 2))
    with pytest.raises(ValueError, match="codes outside"):
        peers.decode_from_peer(SCHEMA, codes.with_columns(pl.lit(4).alias("rate")), seed=0)
    with pytest.raises(ValueError, match="lacks"):
        peers.encode_for_peer(SCHEMA, _rows(10, 2).drop("y"))
    not_nullable = _rows(10, 2).with_columns(pl.lit(None, dtype=pl.Int64).alias("hours"))
    with pytest.raises(ValueError, match="not nullable"):
        peers.encode_for_peer(SCHEMA, not_nullable)


def test_a_missing_venv_names_the_command(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRIVFLOW_PEERS_VENV", str(tmp_path / "nowhere"))
    assert peers.peers_python() is None
    with pytest.raises(peers.PeersUnavailable, match="bash benchmarks/peers/setup.sh"):
        peers.ensure_peers_venv(install=False)


# ---------------------------------------------------------------------------- benchmark side (CI)


def test_peer_cells_are_private_only_and_ablations_switch_one_stage_off() -> None:
    cells = build_cells(["german"], ["mst", "aim", "flow-nohead", "copula"], [1.0, None], [0])
    assert {(c.model, c.epsilon) for c in cells if c.model in PEERS} == {("mst", 1.0), ("aim", 1.0)}
    assert {(c.model, c.epsilon) for c in cells if c.model == "flow-nohead"} == {
        ("flow-nohead", 1.0),
        ("flow-nohead", None),
    }
    data = type("D", (), {"kind": "tabular", "name": "german"})()
    cfg = lambda m: run_config(data, Cell("german", m, 1.0, 0), quick=True)  # noqa: E731
    default = cfg("dphflow")
    assert default.marginals.enabled == type(default.marginals)().enabled  # the default config
    assert default.head.enabled == type(default.head)().enabled
    assert not cfg("flow-nomarg").marginals.enabled and cfg("flow-nomarg").head.enabled == default.head.enabled
    assert not cfg("flow-nohead").head.enabled and cfg("flow-nohead").marginals.enabled == default.marginals.enabled
    assert {cfg(m).model.name for m in ("dphflow", "flow-nomarg", "flow-nohead")} == {"dphflow"}


def test_copula_cell_spends_its_epsilon_once_and_keeps_the_schema(tmp_path) -> None:
    df = _rows(3000, 3)
    data = type("D", (), {"kind": "tabular", "name": "peers-test", "schema": SCHEMA, "train": df})()
    cell = Cell("peers-test", "copula", 1.0, 0)
    synthetic, events, facts = copula_cell(data, cell, run_config(data, cell, quick=True), 2500)
    assert synthetic.height == 2500 and synthetic.schema == df.schema
    assert len(events) == 1 and 0.98 <= PLDAccountant().epsilon(events, 1e-5) <= 1.0
    again, _, _ = copula_cell(data, cell, run_config(data, cell, quick=True), 2500)
    assert again.height == 2500  # fresh DP noise each time; the sampling seed is public
    exact, none, _ = copula_cell(data, Cell("peers-test", "copula", None, 0), run_config(data, cell, True), 2500)
    assert none == [] and exact["rate"].n_unique() == 4


def _record(model: str, seed: int, dataset: str = "adult", **metrics: float) -> dict:
    return {"dataset": dataset, "model": model, "epsilon": 1.0, "seed": seed, "status": "ok", **metrics}


def test_targets_are_judged_on_the_worst_seed_and_against_mst(tmp_path) -> None:
    recs = [
        _record("flow-nohead", s, macro_f1=f, auroc=0.85, ap=0.6, tv_mean=t, kendall_rmse=0.04)
        for s, f, t in ((0, 0.72, 0.008), (1, 0.69, 0.009), (2, 0.71, 0.012))
    ]
    recs += [_record("mst", s, "german", auroc=0.6, tv_mean=0.1) for s in range(3)]
    recs += [_record("flow-nohead", s, "german", auroc=0.65, tv_mean=0.05) for s in range(3)]
    recs += [_record("copula", s, "german", auroc=0.5, tv_mean=0.04) for s in range(3)]
    worst = worst_seed(recs)[("adult", "flow-nohead", 1.0)]
    assert worst["macro_f1"] == 0.69 and worst["tv_mean"] == 0.012 and worst["auroc"] == 0.85
    out = write_results(recs, tmp_path / "results" / "peers.md", "cmd", 60.0, "process x2", False, "peers")
    text = out.read_text()
    line = lambda *parts: next(x for x in text.splitlines() if all(p in x for p in parts))  # noqa: E731
    assert "**not met**" in line("| adult | macro_f1 |", "flow-nohead", "worst of 3 seeds", "0.690")
    assert "**met**" in line("| adult | auroc |", "flow-nohead", "0.850")
    assert "**not met**" in line("| adult | tv_mean |", "flow-nohead", "0.0120")
    assert "**met**" in line("| adult | kendall_rmse |", "flow-nohead")
    assert "**met**" in line("| german | auroc | > mst (0.600) |", "flow-nohead")
    assert "**not met**" in line("| german | auroc | > mst", "| copula |")
    assert "**met**" in line("| german | tv_mean | < mst (0.1000) |", "copula")
    assert not any("| mst" in x and "> mst" in x for x in text.splitlines())
    assert "Worst seed:" in text and "min macro-F1" in text and "Commit:" in text and "machine:" in text


def test_command_line_resolves_presets_and_explicit_options() -> None:
    peers_run = resolve(parser().parse_args(["--preset", "peers"]))
    assert peers_run == {
        "datasets": ["adult", "german"],
        "models": ["dphflow", "flow-nomarg", "flow-nohead", "copula", "mst", "aim"],
        "epsilons": [1.0],
        "seeds": [0, 1, 2],
        "targets": "peers",
    }
    narrowed = resolve(parser().parse_args(["--preset", "peers", "--datasets", "german", "--seeds", "0"]))
    assert narrowed["datasets"] == ["german"] and narrowed["seeds"] == [0] and narrowed["models"] == peers_run["models"]
    plain = resolve(parser().parse_args([]))
    assert plain["models"] == ["dphflow", "maf", "dpmog"] and plain["epsilons"][-1] is None
    assert plain["targets"] == "papers"


def test_ceiling_preset_sets_the_private_pipeline_beside_its_non_private_twin() -> None:
    run = resolve(parser().parse_args(["--preset", "ceiling"]))
    assert run["datasets"] == ["adult"] and run["models"] == ["dphflow", "flow-nohead"]
    assert run["epsilons"] == [1.0, None] and len(run["seeds"]) >= 3  # None: non-private, same model and steps
    assert default_out("ceiling", False) == REPO / "benchmarks" / "results" / "ceiling.md"
    for name, preset in PRESETS.items():
        assert preset["targets"] in TARGET_SETS, name


def test_presets_write_their_own_file() -> None:
    assert default_out(None, False) == REPO / "benchmarks" / "results" / "sweep.md"
    assert default_out("peers", False) == REPO / "benchmarks" / "results" / "peers.md"
    assert default_out("peers", True) == REPO / "benchmarks" / "results" / "peers-quick.md"
    p = PRESETS["peers"]
    assert p["models"].split(",") == ["dphflow", "flow-nomarg", "flow-nohead", "copula", "mst", "aim"]
    assert (p["datasets"], p["epsilons"], p["seeds"]) == ("adult,german", "1", "0,1,2")
    assert p["targets"] in TARGET_SETS
    assert Target("adult", 1.0, "tv_mean", "<=", 0.01).met(0.01)
    assert not Target("german", 1.0, "auroc", ">", versus="mst").met(0.6, float("nan"))


# ---------------------------------------------------------------------------- the peers' venv


@NEEDS_PEERS
@pytest.mark.slow
@pytest.mark.parametrize("method", ["mst", "aim"])
def test_peer_fits_and_samples_the_schema(method: str) -> None:
    df = _rows(1500, 4)
    result = peers.run_peer(method, SCHEMA, df, 1.0, 1e-5, 3, 700, aim_rounds=peers.quick_aim_rounds(SCHEMA))
    out = result.frame
    assert out.height == 700 and out.schema == df.schema
    assert out["rate"].is_between(1, 4).all() and out["gain"].is_between(0, 100000).all()
    assert result.facts["preprocessor_epsilon"] == 0.0 and result.facts["epsilon"] == 1.0
    assert result.facts["cliques"] and all(set(cl) <= set(SCHEMA.names) for cl in result.facts["cliques"])


SAMPLER_CHECK = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, sys.argv[1])
    import run_peer
    from mbi import CliqueVector, Domain, Factor, MarkovRandomField, marginal_oracles
    dom = Domain(["a", "b", "c", "d"], [2, 3, 2, 3])
    cliques = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]  # a 4-cycle: not chordal
    rng = np.random.default_rng(0)
    logs = {cl: Factor(dom.project(cl), rng.normal(0, 1.5, dom.project(cl).shape)) for cl in cliques}
    pots = CliqueVector(dom, cliques, logs)
    model = MarkovRandomField(potentials=pots, marginals=marginal_oracles.message_passing_stable(pots), total=1.0)
    n = 200_000
    draws = run_peer.sample_iid(model, n, np.random.default_rng(1))
    worst = 0.0
    for cl in cliques + [("a", "c"), ("b", "d")]:
        exact = np.asarray(model.project(cl).datavector(flatten=False))
        idx = np.ravel_multi_index(tuple(draws[x] for x in cl), exact.shape)
        freq = np.bincount(idx, minlength=exact.size).reshape(exact.shape) / n
        worst = max(worst, float(np.abs(freq - exact / exact.sum()).max()))
    print(worst)
    """
)


@NEEDS_PEERS
def test_iid_sampler_matches_the_model_even_on_a_cycle(tmp_path) -> None:
    """sample_iid draws rows whose pair frequencies match the model's exact marginals (4-cycle
    cliques, so the junction tree has a fill-in edge), to Monte Carlo error."""
    script = tmp_path / "check.py"
    script.write_text(SAMPLER_CHECK)
    done = subprocess.run(
        [str(peers.peers_python()), str(script), str(REPO / "benchmarks" / "peers")],
        capture_output=True,
        text=True,
        env=peers._clean_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 0.006  # ~5 standard errors at n = 200k


@NEEDS_PEERS
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_quick_peers_sweep(tmp_path) -> None:
    from benchmarks.sweep import benchmark

    out = tmp_path / "peers.md"
    records = benchmark(
        datasets=["german"],
        models=["flow-nohead", "copula", "mst", "aim"],
        epsilons=[1.0],
        seeds=[0],
        out=out,
        quick=True,
        workers=2,
        work_dir=str(tmp_path / "data"),
        target_set="peers",
    )
    bad = [(r["model"], r.get("error")) for r in records if r["status"] != "ok"]
    assert not bad, bad
    for r in records:
        keys = ["macro_f1", "auroc", "ap"]
        if r["model"] != "real-data":
            keys += ["tv_mean", "kendall_rmse", "quality_score", "quality_column_shapes", "quality_column_pair_trends"]
            assert r["epsilon_spent"] <= 1.0
        for k in keys:
            assert np.isfinite(r[k]), (r["model"], k)
    text = out.read_text()
    assert "## Targets (peers)" in text and "quick mode" in text and "| german | auroc | > mst" in text


def test_spread_targets_need_their_seeds_and_judge_the_sample_std(tmp_path) -> None:
    aurocs = [0.850, 0.855, 0.860, 0.852, 0.858]
    recs = [_record("dphflow", s, auroc=a, macro_f1=0.72) for s, a in enumerate(aurocs)]
    recs += [{**_record("dphflow", s, "pinwheel", nll=2.0 + 0.1 * s)} for s in range(5)]
    text = write_results(recs, tmp_path / "s.md", "cmd", 1.0, "process x2", False, "stability").read_text()
    line = lambda *parts: next(x for x in text.splitlines() if all(p in x for p in parts))  # noqa: E731
    spread = line("| adult | auroc | <= 0.01 |", "sample std over 5 seeds")
    assert f"{np.std(aurocs, ddof=1):.3f}" in spread and "**met**" in spread
    assert "**met**" in line("| pinwheel | nll | < 2.65 |", "worst of 5 seeds", "2.400")
    few = write_results(recs[:3], tmp_path / "f.md", "cmd", 1.0, "process x2", False, "stability")
    short = next(x for x in few.read_text().splitlines() if "sample std over 3 seeds" in x)
    assert "(needs 5)" in short and "**not met**" in short
