"""DP-AD's ensemble (tasks/dpad.py): parts trained on disjoint rows vote sensibly, the ensemble
lives only in the curator store (never MLflow or the registry), fitting charges nothing but
registers the ensemble in the ledger, and every scoring call is reserved before any vote is
counted and settled with exactly what it answered."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from privflow.core.config import RunConfig
from privflow.core.errors import BudgetExceeded, DataError, PrivacyPlanError
from privflow.data.schema import Schema
from privflow.privacy.accounting.events import PureDPEvent, RepeatedEvent
from privflow.privacy.ledger import Ledger
from privflow.tasks import dpad
from privflow.tasks.select import row_loglik

TINY = {"model": {"name": "maf", "blocks": 1, "hidden": 8}, "train": {"epochs": 2, "batch_size": 128, "device": "cpu"}}


def _config(tmp: Path) -> RunConfig:
    return RunConfig.build(data=tmp / "unused.csv", schema_path=tmp / "unused.yaml", **TINY)


@pytest.fixture(scope="module")
def adult(tmp_path_factory, demo_dir: Path) -> dict:
    tmp = tmp_path_factory.mktemp("dpad")
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = 1500
    schema = tmp / "adult.yaml"
    schema.write_text(yaml.safe_dump(doc))
    train = tmp / "train.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=1500).write_csv(train)
    new = tmp / "new.csv"
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=40).write_csv(new)
    return {"tmp": tmp, "schema": Schema.from_yaml(schema), "schema_path": schema, "train": train, "new": new}


@pytest.fixture(scope="module")
def fitted(adult: dict) -> dict:
    """One ensemble (k=3) fitted with every MLflow entry point that could log or register broken."""
    import mlflow
    from mlflow import MlflowClient

    store = adult["tmp"] / "store"
    patch = pytest.MonkeyPatch()

    def forbidden(*_a, **_k):
        raise AssertionError("DP-AD touched MLflow")

    for name in ("start_run", "log_artifact", "log_artifacts", "log_param", "log_metric", "register_model"):
        patch.setattr(mlflow, name, forbidden)
    for name in ("create_run", "create_registered_model", "create_model_version", "log_artifact", "log_batch"):
        patch.setattr(MlflowClient, name, forbidden)
    try:
        settings = dpad.EnsembleSettings(partitions=3, epsilon_per_query=0.02)
        ens = dpad.fit_ensemble(adult["train"], adult["schema"], _config(adult["tmp"]), settings, store)
        loaded = dpad.load_ensemble(store, ens.ensemble_id)
        scored = dpad.score_queries(loaded, adult["new"], store)
    finally:
        patch.undo()
    return {"store": store, "ens": ens, "loaded": loaded, "scored": scored}


def test_ensemble_lives_only_in_the_curator_store(fitted: dict) -> None:
    store, ens = fitted["store"], fitted["ens"]
    assert ens.folder == store.resolve() / "curator" / ens.ensemble_id
    assert stat.S_IMODE(ens.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((store / "curator").stat().st_mode) == 0o700
    files = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())
    for f in files:
        assert f.startswith(f"curator/{ens.ensemble_id}/") or f.startswith("ledger.db"), f
    assert not (store / "mlflow.db").exists() and not (store / "artifacts").exists()
    assert len([f for f in files if f.endswith(".pt")]) == sum(flow is not None for flow in ens.models.flows)


def test_fit_charges_nothing_and_registers_the_ensemble(fitted: dict) -> None:
    ledger = Ledger(fitted["store"] / "ledger.db")
    (reg,) = [r for r in ledger.runs("adult") if r.run_id == fitted["ens"].ensemble_id]
    assert reg.status == "settled" and reg.events == () and reg.epsilon == 0.0
    assert "nothing released" in dict(reg.stages)["dpad"]


def test_loaded_ensemble_votes_like_the_fitted_one(fitted: dict, adult: dict) -> None:
    ens, loaded = fitted["ens"], fitted["loaded"]
    assert np.array_equal(ens.models.thresholds, loaded.models.thresholds)
    typed = dpad.read_queries(loaded, adult["new"])[1]
    x = loaded.codec.encode(typed)  # no dequantization offsets: the cell centres, same input for both
    for a, b in zip(ens.models.flows, loaded.models.flows, strict=True):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[key], sb[key]) for key in sa)
        same = [row_loglik(f, x, generator=torch.Generator().manual_seed(7)) for f in (a, b)]
        assert np.allclose(*same, atol=1e-5)


def test_scoring_is_charged_one_pure_event_per_row(fitted: dict, adult: dict) -> None:
    s = fitted["scored"]
    source = pl.read_csv(adult["new"], infer_schema=False)
    assert s.table.columns == [*source.columns, "anomaly"] and s.table.height == source.height == s.queries
    assert s.table["anomaly"].null_count() == 0 and s.answered == 40
    run = {r.run_id: r for r in Ledger(fitted["store"] / "ledger.db").runs("adult")}[s.ledger_run_id]
    assert run.status == "settled"
    assert list(run.events) == list(run.reserved_events) == [RepeatedEvent(PureDPEvent(0.02), 40)]
    assert s.epsilon == pytest.approx(run.epsilon)


def test_svt_charges_the_instances_it_ran(fitted: dict, adult: dict) -> None:
    ens, store = fitted["loaded"], fitted["store"]
    svt = ens.sparse_vector(max_flags=2)
    assert svt.threshold == 1.5 and svt.epsilon == 0.02
    s = dpad.score_queries(ens, adult["new"], store, svt)
    run = {r.run_id: r for r in Ledger(store / "ledger.db").runs("adult")}[s.ledger_run_id]
    assert list(run.reserved_events) == [RepeatedEvent(PureDPEvent(0.02), 2)]
    (spent,) = run.events
    assert spent.event == PureDPEvent(0.02) and 1 <= spent.count <= 2
    answers = s.table["anomaly"]
    assert s.flagged == int(answers.sum()) <= 2
    assert s.answered == answers.len() - answers.null_count()


def test_refused_before_any_vote_when_the_budget_cannot_pay(fitted: dict, adult: dict, monkeypatch) -> None:
    ens, store = fitted["loaded"], fitted["store"]
    ledger = Ledger(store / "ledger.db")
    before = ledger.runs("adult")
    expensive = dpad.Ensemble(
        ens.ensemble_id,
        ens.dataset,
        ens.schema,
        dpad.EnsembleSettings(3, 5.0),
        ens.model,
        ens.models,
        ens.folder,
    )
    monkeypatch.setattr(dpad, "ensemble_votes", lambda *a, **k: pytest.fail("votes counted before the reservation"))
    with pytest.raises(BudgetExceeded, match="refused before reading any row"):
        dpad.score_queries(expensive, adult["new"], store)  # 40 x 5.0 composes far past 10
    assert ledger.runs("adult") == before


def test_bad_query_file_costs_nothing(fitted: dict, adult: dict) -> None:
    store = fitted["store"]
    bad = adult["tmp"] / "bad.csv"
    pl.read_csv(adult["new"], infer_schema=False).with_columns(pl.lit("old").alias("age")).write_csv(bad)
    before = Ledger(store / "ledger.db").runs("adult")
    with pytest.raises(DataError):
        dpad.score_queries(fitted["loaded"], bad, store)
    assert Ledger(store / "ledger.db").runs("adult") == before


def test_an_ensemble_copied_to_another_store_is_refused(fitted: dict, adult: dict) -> None:
    other = adult["tmp"] / "other-store"
    ens = fitted["ens"]
    shutil.copytree(ens.folder, other / "curator" / ens.ensemble_id)
    Ledger(other / "ledger.db").ensure_dataset("adult", 10.0, 1e-5)
    with pytest.raises(PrivacyPlanError, match="not registered"):
        dpad.score_queries(dpad.load_ensemble(other, ens.ensemble_id), adult["new"], other)


def test_fit_is_refused_when_not_even_one_query_fits(adult: dict) -> None:
    store = adult["tmp"] / "poor-store"
    Ledger(store / "ledger.db").ensure_dataset("adult", 0.5, 1e-5)
    with pytest.raises(BudgetExceeded):
        dpad.fit_ensemble(adult["train"], adult["schema"], _config(adult["tmp"]), dpad.EnsembleSettings(3, 1.0), store)
    assert Ledger(store / "ledger.db").runs("adult") == []
    assert not (store / "curator").exists()


def test_parts_vote_anomalous_far_from_the_data(tmp_path: Path) -> None:
    """A 2-D blob: every part calls a far point anomalous and most typical points normal."""
    rng = np.random.default_rng(0)
    pts = rng.normal(0.0, 1.0, (3000, 2))
    df = pl.DataFrame({"x": pts[:, 0], "y": pts[:, 1]})
    schema = Schema.model_validate(
        {
            "dataset": {"name": "blob", "expected_rows": 3000, "budget": {"epsilon": 10, "delta": 1e-5}},
            "columns": [{"name": c, "type": "numeric", "bounds": [-6, 6]} for c in ("x", "y")],
        }
    )
    cfg = RunConfig.build(
        data=tmp_path / "u.csv",
        schema_path=tmp_path / "u.yaml",
        model={"name": "maf", "blocks": 2, "hidden": 16},
        train={"epochs": 8, "batch_size": 128, "device": "cpu"},
    )
    settings = dpad.EnsembleSettings(5, 1.0, fpr=0.05)
    models = dpad.train_partitions(df, schema, cfg, settings, salts=(11, 22))
    assert sum(models.train_rows) + sum(models.holdout_rows) == 3000
    assert all(f is not None for f in models.flows) and np.all(np.isfinite(models.thresholds))
    queries = pl.DataFrame({"x": [0.0, 0.3, -0.2, 5.0, -5.5], "y": [0.0, -0.4, 0.5, 5.0, 4.0]})
    votes = dpad.ensemble_votes(models, dpad.Codec.from_schema(schema), queries)
    assert votes[:3].max() <= 1 and votes[3:].min() == 5


def test_parts_train_in_the_schema_codec_whatever_the_marginals_setting(tmp_path: Path) -> None:
    on = RunConfig.build(data=tmp_path / "u.csv", schema_path=tmp_path / "u.yaml", marginals={"enabled": True}, **TINY)
    off = dpad.part_config(on)
    assert on.marginals.enabled and not off.marginals.enabled
    assert off.model == on.model and off.train == on.train
