"""Retraining on new data, the DP promotion of a new version, and retries vs the ledger."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.ledger import Ledger
from privflow.tasks.promote import (
    PromotionDecision,
    PromotionSettings,
    difference_statistic,
    margin_statistic,
    mixture_loglik,
    release_margin,
)

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"


# -- the statistic and its mechanism (no server) ----------------------------------------------


def test_margin_statistic_sensitivity_by_brute_force() -> None:
    """Removing or adding any one row moves S by at most high - low (add/remove adjacency)."""
    rng = np.random.default_rng(1)
    low, high = -20.0, 10.0
    a = rng.normal(-5, 12, 60)
    b = rng.normal(-5, 12, 60)
    a[3], b[7], a[9] = np.nan, -np.inf, np.inf
    s, sens = margin_statistic(a, b, low, high)
    assert sens == high - low
    ref = sum(
        min(max(x, low), high) - min(max(y, low), high)
        for x, y in zip(np.nan_to_num(a, nan=low), np.nan_to_num(b, nan=low, neginf=low), strict=False)
    )
    assert s == pytest.approx(ref)
    for i in range(len(a)):
        s_minus, _ = margin_statistic(np.delete(a, i), np.delete(b, i), low, high)
        assert abs(s - s_minus) <= sens + 1e-9
    worst, _ = margin_statistic(np.append(a, 1e9), np.append(b, -1e9), low, high)
    assert worst - s == pytest.approx(sens)
    with pytest.raises(ValueError):
        margin_statistic(a, b[:-1], low, high)


def test_difference_statistic_sensitivity_by_brute_force() -> None:
    """Versions in different copula codecs: each row's difference clipped to +-c, so adding or
    removing one row moves S by at most c; rows neither version covers add 0."""
    rng = np.random.default_rng(2)
    c = 1.0
    a = rng.normal(-25, 3, 80)
    b = a + rng.normal(0.1, 0.8, 80)
    a[3], b[7], a[9], b[9], a[11] = np.nan, -np.inf, -np.inf, -np.inf, np.inf
    s, sens = difference_statistic(a, b, c)
    assert sens == c
    ref = np.clip(np.nan_to_num(a, nan=-np.inf) - b, -c, c)
    ref[9] = 0.0
    assert s == pytest.approx(float(np.nansum(np.nan_to_num(ref, nan=0.0))))
    for i in range(len(a)):
        s_minus, _ = difference_statistic(np.delete(a, i), np.delete(b, i), c)
        assert abs(s - s_minus) <= sens + 1e-9
    for extra in ((1e9, -1e9), (-np.inf, 0.0), (np.nan, np.nan), (np.inf, -np.inf)):
        s_plus, _ = difference_statistic(np.append(a, extra[0]), np.append(b, extra[1]), c)
        assert abs(s_plus - s) <= sens + 1e-9
    with pytest.raises(ValueError):
        difference_statistic(a, b[:-1], c)


def test_copula_log_mass_is_the_cell_log_probability() -> None:
    """With the independent (uniform) copula the row's likelihood is the product of its cells'
    released masses; codecs over the same cells are comparable, others are not."""
    import polars as pl

    from privflow.data.copula import CopulaCodec, Marginals
    from privflow.data.schema import Schema

    schema = Schema.model_validate(
        {
            "dataset": {"name": "t", "expected_rows": 10, "budget": {"epsilon": 1.0, "delta": 1e-6}},
            "columns": [
                {"name": "c", "type": "categorical", "categories": ["a", "b", "z"]},
                {"name": "k", "type": "integer", "bounds": [0, 3]},
            ],
        }
    )
    m1 = Marginals({"c": np.array([0.5, 0.3, 0.2]), "k": np.array([0.1, 0.2, 0.3, 0.4])})
    m2 = Marginals({"c": np.array([0.2, 0.0, 0.8]), "k": np.array([0.25, 0.25, 0.25, 0.25])})
    m3 = Marginals({"c": np.array([0.2, 0.0, 0.8]), "k": np.array([0.5, 0.5])}, max_atoms=2, grid_bins=2)
    df = pl.DataFrame({"c": ["a", "b", "z"], "k": [0, 3, 1]})
    one, two = CopulaCodec(schema, m1), CopulaCodec(schema, m2)
    assert one.log_mass(df) == pytest.approx(np.log([0.5 * 0.1, 0.3 * 0.4, 0.2 * 0.2]))
    assert two.log_mass(df)[1] == -np.inf and np.isfinite(two.log_mass(df)[[0, 2]]).all()
    assert one.same_cells(two) and not one.same_cells(CopulaCodec(schema, m3))


def test_mixture_loglik_is_the_equal_weight_mixture() -> None:
    ll = np.array([[-1.0, -50.0, -3.0], [-2.0, -900.0, -3.0]])
    ref = np.log(0.5 * np.exp(ll[0]) + 0.5 * np.exp(ll[1].astype(np.longdouble))).astype(np.float64)
    assert np.allclose(mixture_loglik(ll), ref)
    assert np.allclose(mixture_loglik(ll[:1]), ll[0])


def test_release_margin_laplace_and_gaussian_scales() -> None:
    """Noise scale = sensitivity / epsilon (Laplace); the analytic Gaussian's multiplier otherwise."""
    lap = PromotionSettings(epsilon=0.5)
    draws = np.array([release_margin(10.0, 30.0, lap) for _ in range(4000)])
    assert np.median(draws) == pytest.approx(10.0, abs=3.0)
    assert np.mean(np.abs(draws - 10.0)) == pytest.approx(30.0 / 0.5, rel=0.06)  # E|Laplace(b)| = b
    assert lap.event() == LaplaceEvent(2.0)
    gau = PromotionSettings(epsilon=0.5, mechanism="gaussian", delta=1e-6)
    g = np.array([release_margin(0.0, 30.0, gau) for _ in range(4000)])
    assert np.std(g) == pytest.approx(30.0 * gau.noise_multiplier(), rel=0.05)
    from privflow.privacy.accounting.calibration import epsilon_for_gaussian

    assert epsilon_for_gaussian(gau.noise_multiplier(), 1e-6) == pytest.approx(0.5, rel=1e-3)
    with pytest.raises(ValueError):
        PromotionSettings(epsilon=0.0)


def test_ledger_id_changes_per_attempt_and_decision_tags() -> None:
    from privflow.privacy.ledger import attempt_run_id

    assert attempt_run_id("run:promote", 1) == "run:promote"
    assert attempt_run_id("run:promote", 2) == "run:promote#attempt2"
    d = PromotionDecision(False, "why", "m", "2", "1", "champion", noisy_margin=-3.5, epsilon=0.05, mechanism="laplace")
    tags = d.tags()
    assert tags["privflow.promotion.promoted"] == "no"
    assert tags["privflow.promotion.noisy_margin_nats"] == "-3.5"
    assert tags["privflow.promotion.epsilon_spent"] == "0.05"
    assert tags["privflow.promotion.compared_with"] == "1"


# -- promotion against a real (SQLite) registry ------------------------------------------------


def _slice(src: Path, dst: Path, start: int, rows: int) -> Path:
    lines = src.read_text().splitlines()
    dst.write_text("\n".join([lines[0], *lines[1 + start : 1 + start + rows]]) + "\n")
    return dst


def _schema(tmp: Path, name: str, budget: float, expected_rows: int) -> Path:
    raw = yaml.safe_load((DEMO / "adult.yaml").read_text())
    raw["dataset"].update({"name": name, "expected_rows": expected_rows, "budget": {"epsilon": budget, "delta": 1e-5}})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


TINY = {
    "privacy": {"epsilon": 1.0, "delta": 1e-5},
    "model": {"name": "maf", "blocks": 1, "hidden": 8},
    "train": {"epochs": 0.5, "batch_size": 128, "checkpoint_every": 2, "device": "cpu", "threads": 1},
    "head": {"steps": 20},
    "select": {"validation_fraction": 0.2},
    "evaluate": {
        "fidelity": False,
        "utility": False,
        "likelihood": False,
        "privacy_risk": False,
        "report": False,
        "synthetic_rows": 100,
    },
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, empty_store: Path):
    """A store with an SQLite MLflow registry and a small Adult slice under its own dataset name."""
    from privflow.tasks.mlflow_store import experiment_for, tracking
    from tests.stores import copy_store

    tmp = tmp_path_factory.mktemp("promote")
    store = copy_store(empty_store, tmp / "store")  # new, its MLflow database made (tests/conftest.py)
    tracking(store)  # the tests' MlflowClient() objects talk to this store
    experiment_for("adult-promote", store)
    schema_path = _schema(tmp, "adult-promote", 20.0, 600)
    data = _slice(DEMO / "adult_train.csv", tmp / "new.csv", 0, 600)
    # the pipeline run that registered a version registered its dataset: each test can run alone
    # (or in another pytest-xdist process than the test whose promotion would otherwise do it)
    Ledger(store / "ledger.db").ensure_dataset("adult-promote", 20.0, 1e-5)
    return {"tmp": tmp, "store": store, "schema": schema_path, "data": data}


def _register(name: str, state: dict, reg: dict) -> str:
    """A version of `name` holding `state`, logged like the pipeline logs one (alias 'candidate')."""
    import mlflow

    from privflow.data.schema import Schema
    from privflow.tasks.mlflow_store import experiment_for, register_model, tracking

    tracking(reg["store"])
    experiment_for("adult-promote", reg["store"])
    with mlflow.start_run():
        return register_model(
            name, "candidate", Schema.from_yaml(reg["schema"]), "maf", {"blocks": 1, "hidden": 8}, [state], {}
        ).version


def _model(seed: int, bad: bool = False) -> dict:
    """A fitted-looking version (first actnorm set from the slice's statistics: test only, not
    DP) or a bad one (a far too narrow first actnorm: every row lands deep in the tails)."""
    from privflow.data.codec import Codec
    from privflow.data.io import read_table
    from privflow.data.schema import Schema
    from privflow.models import build_flow

    schema = Schema.from_yaml(DEMO / "adult.yaml")
    codec = Codec.from_schema(schema)
    torch.manual_seed(seed)
    m = build_flow("maf", codec.cardinalities, blocks=1, hidden=8)
    with torch.no_grad():
        if bad:
            m.actnorms[0].log_scale.fill_(-6.0)
        else:
            rows = read_table(DEMO / "adult_train.csv").head(600).drop_nulls()
            pre = m.preprocess(torch.as_tensor(codec.encode(rows)))
            m.init_actnorm(pre.mean(0), pre.std(0))
    return m.state_dict()


def _config(reg: dict, **extra) -> RunConfig:  # noqa: F821
    from privflow.core.config import RunConfig

    return RunConfig.build(data=reg["data"], schema_path=reg["schema"], store=reg["store"], **TINY, **extra)


def test_first_version_becomes_champion_at_no_cost(registry: dict) -> None:
    from mlflow import MlflowClient

    from privflow.tasks.promote import promote_if_better

    name = "pf-first"
    v1 = _register(name, _model(0), registry)
    ledger_path = registry["store"] / "ledger.db"
    before = len(Ledger(ledger_path).runs()) if ledger_path.exists() else 0
    d = promote_if_better(
        name, v1, _config(registry), PromotionSettings(epsilon=1.0), str(ledger_path), "first:promote"
    )
    assert d.promoted and d.epsilon == 0.0 and d.champion_version is None
    client = MlflowClient()
    assert str(client.get_model_version_by_alias(name, "champion").version) == v1
    assert client.get_model_version(name, v1).tags["privflow.promotion.promoted"] == "yes"
    assert (len(Ledger(ledger_path).runs()) if ledger_path.exists() else 0) == before


def test_a_promotion_waits_for_the_stores_lock(registry: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Promotions on one store are serialised: while another process (here: this test) holds the
    store's lock, a promotion neither reads the alias nor moves it. The check is made once the
    promotion has asked for the lock (an event it reports here), not after a sleep."""
    import threading

    from mlflow import MlflowClient

    from privflow.tasks import promote
    from privflow.tasks.mlflow_store import store_lock
    from privflow.tasks.promote import promote_if_better

    name = "pf-locked"
    v1 = _register(name, _model(0), registry)
    ledger_path = str(registry["store"] / "ledger.db")
    decided: list[object] = []
    asked = threading.Event()

    def lock_asked_for(store: Path):  # noqa: ANN202
        asked.set()  # the promotion is at the lock: nothing after it can run while the test holds it
        return store_lock(store)

    monkeypatch.setattr(promote, "store_lock", lock_asked_for)
    run = lambda: decided.append(  # noqa: E731
        promote_if_better(name, v1, _config(registry), PromotionSettings(epsilon=1.0), ledger_path, "lock:promote")
    )
    with store_lock(registry["store"]):
        worker = threading.Thread(target=run)
        worker.start()
        assert asked.wait(timeout=120)  # a guard against a promotion that never asks, not a trigger
        assert worker.is_alive() and not decided  # waiting on the lock
        assert MlflowClient().get_registered_model(name).aliases.get("champion") is None
    worker.join(timeout=60)
    assert decided and decided[0].promoted  # type: ignore[attr-defined]


def test_better_version_is_promoted_and_the_comparison_is_in_the_ledger(registry: dict) -> None:
    import mlflow
    from mlflow import MlflowClient

    from privflow.data.schema import Schema
    from privflow.tasks.promote import promote_if_better

    name = "pf-better"
    client = MlflowClient()
    old = _register(name, _model(1, bad=True), registry)
    client.set_registered_model_alias(name, "champion", old)
    new = _register(name, _model(2), registry)
    ledger = Ledger(registry["store"] / "ledger.db")
    schema = Schema.from_yaml(registry["schema"])
    ledger.ensure_dataset(schema.dataset.name, schema.dataset.budget.epsilon, schema.dataset.budget.delta)
    spent_before = ledger.spent(schema.dataset.name)[0]
    settings = PromotionSettings(epsilon=2.0)
    d = promote_if_better(name, new, _config(registry), settings, str(ledger.path), "better:promote")
    assert d.promoted and d.champion_version == old and d.noisy_margin is not None and d.noisy_margin > 0
    assert str(client.get_model_version_by_alias(name, "champion").version) == new
    tags = client.get_model_version(name, new).tags
    assert tags["privflow.promotion.promoted"] == "yes" and float(tags["privflow.promotion.epsilon_spent"]) == 2.0
    assert float(tags["privflow.promotion.noisy_margin_nats"]) == pytest.approx(d.noisy_margin, rel=1e-5)
    assert client.get_model_version(name, old).tags["privflow.promotion.superseded_by"] == new
    run = next(r for r in ledger.runs(schema.dataset.name) if r.run_id == "better:promote")
    assert run.status == "settled" and list(run.events) == [LaplaceEvent(0.5)]
    assert ledger.spent(schema.dataset.name)[0] > spent_before
    # nothing was set aside (strict policy): no empty curator folder is left (fuzzing round 6)
    assert not (registry["store"] / "curator" / "better:promote").exists()
    # the previous champion stays loadable by its version number, and samples
    previous = mlflow.pyfunc.load_model(f"models:/{name}/{old}")
    import pandas as pd

    assert len(previous.predict(pd.DataFrame({"n": [5]}))) == 5


def test_worse_version_is_not_promoted_and_still_pays(registry: dict) -> None:
    from mlflow import MlflowClient

    from privflow.tasks.promote import promote_if_better

    name = "pf-worse"
    client = MlflowClient()
    good = _register(name, _model(3), registry)
    client.set_registered_model_alias(name, "champion", good)
    bad = _register(name, _model(4, bad=True), registry)
    ledger = Ledger(registry["store"] / "ledger.db")
    d = promote_if_better(
        name, bad, _config(registry), PromotionSettings(epsilon=2.0), str(ledger.path), "worse:promote"
    )
    assert not d.promoted and d.noisy_margin is not None and d.noisy_margin < 0
    assert str(client.get_model_version_by_alias(name, "champion").version) == good
    assert client.get_model_version(name, bad).tags["privflow.promotion.promoted"] == "no"
    assert any(r.run_id == "worse:promote" and r.status == "settled" for r in ledger.runs())


def test_comparison_refused_by_the_budget_reads_nothing(registry: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    import privflow.tasks.promote as promote

    name = "pf-broke"
    client = MlflowClient()
    a = _register(name, _model(5), registry)
    client.set_registered_model_alias(name, "champion", a)
    b = _register(name, _model(6), registry)
    ledger = Ledger(registry["store"] / "ledger.db")

    def no_read(*args, **kwargs):
        raise AssertionError("rows were read although the ledger refused")

    monkeypatch.setattr("privflow.data.io.read_table", no_read)
    from privflow.data.schema import Schema

    dataset = Schema.from_yaml(registry["schema"]).dataset
    ledger.ensure_dataset(dataset.name, dataset.budget.epsilon, dataset.budget.delta)
    ledger.set_budget(dataset.name, ledger.spent(dataset.name)[0] + 0.01, dataset.budget.delta)  # almost spent
    before = len(ledger.runs())
    try:
        d = promote.promote_if_better(
            name, b, _config(registry), PromotionSettings(epsilon=1.0), str(ledger.path), "broke:promote"
        )
    finally:
        ledger.set_budget(dataset.name, dataset.budget.epsilon, dataset.budget.delta)
    assert not d.promoted and "refused" in d.reason and d.epsilon == 0.0
    assert len(ledger.runs()) == before
    assert str(client.get_model_version_by_alias(name, "champion").version) == a
    assert client.get_model_version(name, b).tags["privflow.promotion.promoted"] == "no"


def test_retried_promotion_task_reserves_again(registry: dict, prefect_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry reruns the mechanism with fresh noise, so the ledger must count it a second time."""
    from mlflow import MlflowClient
    from prefect import flow

    import privflow.tasks.promote as promote
    from privflow.flows.steps import PREFECT, prefect_task

    name = "pf-retry"
    client = MlflowClient()
    a = _register(name, _model(7), registry)
    client.set_registered_model_alias(name, "champion", a)
    b = _register(name, _model(8, bad=True), registry)
    ledger = Ledger(registry["store"] / "ledger.db")
    real = promote.record
    calls = {"n": 0}

    def flaky(c, decision):
        calls["n"] += 1
        if calls["n"] == 1:  # after the mechanism ran: e.g. the registry was briefly unreachable
            raise ConnectionError("registry unavailable")
        return real(c, decision)

    monkeypatch.setattr(promote, "record", flaky)

    @flow
    def run_promotion() -> PromotionDecision:  # the promotion task as the flows run it (flows/steps.py)
        task = prefect_task(promote.promote_if_better).with_options(retry_delay_seconds=0)
        settings = PromotionSettings(epsilon=1.0)
        return task(name, b, _config(registry), settings, str(ledger.path), "retry:promote", PREFECT.attempt)

    decision = run_promotion()
    assert calls["n"] == 2 and decision.ledger_run_id == "retry:promote#attempt2"
    runs = {r.run_id: r for r in ledger.runs()}
    for key in ("retry:promote", "retry:promote#attempt2"):  # both releases happened, both are counted
        assert runs[key].status == "settled" and list(runs[key].events) == [LaplaceEvent(1.0)]
    from privflow.privacy.ledger import compose_epsilon

    dataset = runs["retry:promote"].dataset
    everything = [e for r in ledger.runs(dataset) for e in r.events]
    assert ledger.spent(dataset)[0] == pytest.approx(compose_epsilon(everything, 1e-5))
    assert ledger.spent(dataset)[0] > compose_epsilon([LaplaceEvent(1.0)], 1e-5)


# -- the retraining flow end to end (SQLite registry, temporary Prefect server) ----------------


def test_retrain_flow_registers_promotes_and_refuses(tmp_path: Path, prefect_server, new_store: Path) -> None:
    from mlflow import MlflowClient

    from privflow.data.schema import Schema
    from privflow.flows.retrain import REFUSED, retrain_on_new_data

    schema_path = _schema(tmp_path, "adult-retrain", 2.6, 600)
    store = new_store
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text(yaml.safe_dump({**TINY, "privacy": {"epsilon": 5.0, "delta": 1e-5}}))
    first = _slice(DEMO / "adult_train.csv", tmp_path / "first.csv", 0, 600)
    second = _slice(DEMO / "adult_train.csv", tmp_path / "second.csv", 600, 600)
    third = _slice(DEMO / "adult_train.csv", tmp_path / "third.csv", 1200, 600)

    out1 = retrain_on_new_data(str(first), str(schema_path), str(cfg), str(store))
    name = out1["model_name"]
    assert out1["promoted"] and out1["promotion_epsilon"] == 0.0 and out1["champion_before"] is None
    client = MlflowClient()
    assert str(client.get_model_version_by_alias(name, "champion").version) == out1["model_version"]

    out2 = retrain_on_new_data(str(second), str(schema_path), str(cfg), str(store))
    assert out2["model_version"] != out1["model_version"] and out2["champion_before"] == out1["model_version"]
    assert out2["promotion_epsilon"] == 0.05
    tags = client.get_model_version(name, out2["model_version"]).tags
    assert tags["privflow.promotion.promoted"] == ("yes" if out2["promoted"] else "no")
    champion = str(client.get_model_version_by_alias(name, "champion").version)
    assert champion == (out2["model_version"] if out2["promoted"] else out1["model_version"])
    ledger = Ledger(store / "ledger.db")
    dataset = Schema.from_yaml(schema_path).dataset.name
    runs_before = ledger.runs(dataset)
    assert len(runs_before) == 3  # two trainings, one comparison
    versions_before = len(client.search_model_versions(f"name='{name}'"))

    state = retrain_on_new_data(str(third), str(schema_path), str(greedy), str(store), return_state=True)
    assert state.is_failed() and "refused before reading any row" in state.message
    assert len(ledger.runs(dataset)) == len(runs_before)
    assert len(client.search_model_versions(f"name='{name}'")) == versions_before
    refused = client.search_runs(
        [client.get_experiment_by_name(f"privflow-{dataset}").experiment_id],
        filter_string=f"tags.`privflow.outcome` = '{REFUSED}'",
    )
    assert len(refused) == 1 and "refused" in refused[0].data.tags["privflow.refusal"]
    assert math.isfinite(ledger.spent(dataset)[0])


def test_retrain_keeps_the_datasets_promotion_never(tmp_path: Path, prefect_server, new_store: Path) -> None:
    """A schema's `dataset.promotion: never` holds for scheduled retraining too: no comparison is
    planned or charged and the alias does not move (it ignored the setting and charged 0.05)."""
    from mlflow import MlflowClient

    from privflow.flows.retrain import retrain_on_new_data

    schema_path = _schema(tmp_path, "adult-never", 2.6, 600)
    raw = yaml.safe_load(schema_path.read_text())
    raw["dataset"]["promotion"] = "never"
    schema_path.write_text(yaml.safe_dump(raw))
    store = new_store
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = retrain_on_new_data(
        str(_slice(DEMO / "adult_train.csv", tmp_path / "a.csv", 0, 600)), str(schema_path), str(cfg), str(store)
    )
    assert not out["promoted"] and out["promotion_epsilon"] is None and "promotion: never" in out["reason"]
    assert MlflowClient().get_registered_model(out["model_name"]).aliases.get("champion") is None
    assert len(Ledger(store / "ledger.db").runs("adult-never")) == 1  # the training alone


def test_new_file_with_wrong_columns_fails_before_anything_is_spent(tmp_path: Path, prefect_server) -> None:
    from privflow.flows.retrain import retrain_on_new_data

    schema_path = _schema(tmp_path, "adult-wrong", 5.0, 600)
    bad = tmp_path / "bad.csv"
    bad.write_text("age,colour\n39,blue\n")
    state = retrain_on_new_data(str(bad), str(schema_path), None, str(tmp_path / "store"), return_state=True)
    assert state.is_failed()
    assert not (tmp_path / "store" / "ledger.db").exists() or not Ledger(tmp_path / "store" / "ledger.db").runs()


def test_retraining_runs_the_clis_pre_flight(tmp_path: Path, prefect_server) -> None:
    """The retraining flow used to check only the file's header (comma-separated, no gzip) and the
    budget: a delta above the budget's was trained on and charged 2.42 while reporting 0.99."""
    from privflow.flows.retrain import retrain_on_new_data

    schema_path = _schema(tmp_path, "adult-retrain-delta", 5.0, 600)
    data = _slice(DEMO / "adult_train.csv", tmp_path / "rows.csv", 0, 600)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "privacy": {"epsilon": 1.0, "delta": 0.01}}))
    state = retrain_on_new_data(str(data), str(schema_path), str(cfg), str(tmp_path / "store"), return_state=True)
    assert state.is_failed() and "delta" in state.message
    assert not (tmp_path / "store" / "ledger.db").exists() or not Ledger(tmp_path / "store" / "ledger.db").runs()


# -- retries of the training flow vs the ledger ------------------------------------------------


def _flaky(monkeypatch: pytest.MonkeyPatch, module: object, attr: str, exc: Exception) -> dict:
    """Make module.attr raise `exc` on its first call only (a pipeline step stays one: the
    wrapper names it, functools.wraps, so a runner finds its task options, flows/steps.py)."""
    real = getattr(module, attr)
    calls = {"n": 0}

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, wrapper)
    return calls


def _train_config(tmp: Path, name: str, store: Path) -> RunConfig:  # noqa: F821
    from privflow.core.config import RunConfig

    schema = _schema(tmp, name, 5.0, 600)
    data = _slice(DEMO / "adult_train.csv", tmp / "rows.csv", 2000, 600)
    return RunConfig.build(data=data, schema_path=schema, store=store, **TINY)


def test_retried_flow_run_that_failed_before_any_mechanism_counts_once(
    tmp_path: Path, prefect_server, monkeypatch: pytest.MonkeyPatch, new_store: Path
) -> None:
    """Same flow run id, second attempt: the reservation is not counted twice."""
    import privflow.flows.pipeline as pipeline
    import privflow.flows.train as train

    config = _train_config(tmp_path, "adult-retry-early", new_store)
    calls = _flaky(monkeypatch, pipeline, "validate_data", ConnectionError("data share unreachable"))
    summary = train.train_pipeline.with_options(retries=1, retry_delay_seconds=0)(config, show_progress=False)
    assert calls["n"] == 2
    ledger = Ledger(config.store / "ledger.db")
    runs = ledger.runs("adult-retry-early")
    counted = [r for r in runs if r.status != "released"]  # attempt 1 read nothing and released
    assert [(r.run_id, r.status) for r in counted] == [(summary.run_id, "settled")]
    assert len(runs) <= 2
    assert ledger.spent("adult-retry-early")[0] == pytest.approx(counted[0].epsilon)
    assert summary.dataset_epsilon == pytest.approx(counted[0].epsilon)


def test_retried_flow_run_that_failed_after_a_mechanism_counts_again(
    tmp_path: Path, prefect_server, monkeypatch: pytest.MonkeyPatch, new_store: Path
) -> None:
    """The retry reruns DP statistics, DP-SGD and selection with fresh noise: a second access."""
    import privflow.flows.pipeline as pipeline
    import privflow.flows.train as train

    config = _train_config(tmp_path, "adult-retry-late", new_store)
    # sampling the release fails once, after every mechanism ran (a diagnostics failure no longer
    # fails a run: test_a_diagnostics_crash_keeps_the_release)
    calls = _flaky(monkeypatch, pipeline, "_release_table", RuntimeError("sampling crashed"))
    summary = train.train_pipeline.with_options(retries=1, retry_delay_seconds=0)(config, show_progress=False)
    assert calls["n"] == 2
    ledger = Ledger(config.store / "ledger.db")
    runs = ledger.runs("adult-retry-late")
    assert len(runs) == 2 and runs[-1].run_id == summary.run_id and runs[-1].status == "settled"
    assert runs[0].status in {"settled", "failed"}  # spent before diagnostics crashed: stays counted
    assert runs[0].events == runs[1].events
    assert ledger.spent("adult-retry-late")[0] > summary.epsilon * 1.2


def test_a_diagnostics_crash_keeps_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_store: Path
) -> None:
    """Curator-only diagnostics run after the release and spend nothing: their failure is a note
    for the curator, not a failed run that spent its budget and registered nothing."""
    import privflow.flows.pipeline as pipeline

    config = _train_config(tmp_path, "adult-diagnostics-crash", new_store)
    _flaky(monkeypatch, pipeline, "evaluate_run", RuntimeError("diagnostics crashed"))
    summary = pipeline.train_in_process(config, show_progress=False)
    assert summary.model_version and "diagnostics failed (RuntimeError: diagnostics crashed)" in (
        summary.diagnostics_note or ""
    )
    ((run,),) = [Ledger(config.store / "ledger.db").runs("adult-diagnostics-crash")]
    assert run.status == "settled" and run.run_id == summary.run_id


def test_the_run_summary_counts_its_own_promotion_comparison(tmp_path: Path, new_store: Path) -> None:
    """`--promote if-better` against a holder charges a DP comparison after the run settles; the
    summary's dataset total is the ledger's after it, as `privflow ledger show` prints it."""
    from privflow.core.config import RunConfig
    from privflow.flows.pipeline import train_in_process

    schema_path = _schema(tmp_path, "adult-summary", 5.0, 600)
    data = _slice(DEMO / "adult_train.csv", tmp_path / "rows.csv", 0, 600)
    config = RunConfig.build(data=data, schema_path=schema_path, store=new_store, **TINY)
    train_in_process(config, show_progress=False)  # the first version takes the alias at no cost
    second = train_in_process(config, show_progress=False)
    ledger = Ledger(tmp_path / "store" / "ledger.db")
    assert f"{second.run_id}:promote" in {r.run_id for r in ledger.runs("adult-summary")}
    assert second.dataset_epsilon == pytest.approx(ledger.spent("adult-summary")[0], rel=1e-12)
