"""`privflow run --engine local` (flows/pipeline.py `train_in_process`): the same pipeline without
Prefect's engine records what the Prefect flow records, and never reaches a Prefect API.

One small run each way, into the same store under two model names: the MLflow run (param
names and values, metric and tag names, artifacts), the registered version's and the model's
tags, the ledger entry (stages, planned and spent events) and the synthetic table match; the
in-process run works with every Prefect client and server start made to fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.data.validation import validate
from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.ledger import Ledger, RunRecord
from tests.data_slices import adult_slice

pytestmark = pytest.mark.usefixtures("prefect_server")

ROWS = 1500


def _no_prefect_api(*args: object, **kwargs: object) -> None:
    raise AssertionError("train_in_process reached Prefect's API")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_dir: Path, empty_store: Path):
    """(config, summary) of the Prefect flow and of the in-process run, in one store (new, its
    MLflow database already made: tests/conftest.py, `empty_store`)."""
    import prefect.client.orchestration as orchestration
    from prefect.server.api.server import SubprocessASGIServer

    from privflow.flows.pipeline import train_in_process
    from privflow.flows.train import train_pipeline
    from tests.stores import copy_store

    tmp = tmp_path_factory.mktemp("inprocess")
    data, schema = adult_slice(tmp, demo_dir, ROWS)
    store = copy_store(empty_store, tmp / "store")

    def config(model_name: str) -> RunConfig:
        return RunConfig.build(
            data=data,
            schema_path=schema,
            store=store,
            model_name=model_name,
            privacy={"epsilon": 2.0, "delta": 1e-5},
            model={"name": "maf", "blocks": 1, "hidden": 8},
            head={"steps": 20},
            train={"epochs": 1, "batch_size": 256, "checkpoint_every": 2, "min_effective_batch": 0},
            evaluate={"synthetic_rows": 300, "utility": False, "privacy_risk": False, "report": False},
        )

    engine_cfg = config("privflow-adult-engine")
    engine = train_pipeline(engine_cfg, show_progress=False)
    local_cfg = config("privflow-adult-inprocess")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(orchestration, "get_client", _no_prefect_api)
        mp.setattr(SubprocessASGIServer, "start", _no_prefect_api)
        local = train_in_process(local_cfg, show_progress=False)
    return (engine_cfg, engine), (local_cfg, local)


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    out: list[str] = []
    for item in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def _ledger_run(cfg: RunConfig, run_id: str) -> RunRecord:
    (record,) = [r for r in Ledger(cfg.store / "ledger.db").runs() if r.run_id == run_id]
    return record


def test_the_mlflow_run_and_registry_hold_the_same_entries(runs) -> None:
    (_, engine), (_, local) = runs
    client = MlflowClient()
    a, b = client.get_run(engine.mlflow_run_id).data, client.get_run(local.mlflow_run_id).data
    assert a.params and a.metrics and a.tags  # nothing vacuous

    def params(data, summary) -> dict[str, str]:  # noqa: ANN001
        """Param values with this run's own ids and model name (the one chosen difference) masked."""
        return {
            k: v.replace(summary.run_id, "<run>").replace(summary.model_name, "<model>") for k, v in data.params.items()
        }

    assert params(b, local) == params(a, engine)  # the same plan, noise and settings, name by name
    assert set(b.metrics) == set(a.metrics)
    assert set(b.tags) == set(a.tags)
    assert sorted(p.replace(local.run_id, "<run>") for p in _artifacts(client, local.mlflow_run_id)) == sorted(
        p.replace(engine.run_id, "<run>") for p in _artifacts(client, engine.mlflow_run_id)
    )
    va = client.get_model_version(engine.model_name, engine.model_version)
    vb = client.get_model_version(local.model_name, local.model_version)
    assert set(vb.tags) == set(va.tags)
    assert set(client.get_registered_model(local.model_name).tags) == set(
        client.get_registered_model(engine.model_name).tags
    )
    assert str(client.get_model_version_by_alias(local.model_name, local.alias).version) == local.model_version


def test_the_ledger_entry_is_the_flows(runs) -> None:
    (engine_cfg, engine), (local_cfg, local) = runs
    assert re.fullmatch(r"[0-9a-f-]{36}", local.run_id)  # a UUID, as a flow run's id is; no suffix on a first attempt
    a, b = _ledger_run(engine_cfg, engine.run_id), _ledger_run(local_cfg, local.run_id)
    assert a.status == b.status == "settled"
    assert b.stages == a.stages
    assert b.reserved_events == a.reserved_events  # the plan is a function of public inputs only
    assert [type(e) for e in b.events] == [type(e) for e in a.events]
    assert b.events == a.events  # the same mechanisms ran with the same noise
    assert PLDAccountant().epsilon(list(b.events), local.delta) == pytest.approx(local.epsilon, rel=1e-9)
    assert local.epsilon == pytest.approx(engine.epsilon, rel=1e-12)
    assert local.stages == engine.stages


def test_the_synthetic_table_is_released_the_same_way(runs) -> None:
    (engine_cfg, engine), (local_cfg, local) = runs
    schema = Schema.from_yaml(local_cfg.schema_path)
    a = pl.read_csv(engine.synthetic_path, infer_schema=False)
    b = pl.read_csv(local.synthetic_path, infer_schema=False)
    assert b.columns == a.columns == schema.names and b.height == a.height == 300
    clean, _ = validate(b, schema, policy="strict", quarantine_path=None)
    assert clean.height == 300
    assert Path(local.curator_dir).is_dir() and Path(local.curator_dir).name == local.run_id


def test_the_plan_preflight_made_is_the_one_reserved(tmp_path: Path, demo_dir: Path) -> None:
    """One plan: pre-flight computes it and the in-process run reserves exactly it, without
    planning again."""
    from privflow.flows import pipeline
    from privflow.preflight import preflight

    data, schema_path = adult_slice(tmp_path, demo_dir, 300)
    cfg = RunConfig.build(data=data, schema_path=schema_path, store=tmp_path / "store")
    checked = preflight(cfg)

    def no_step(fn: object, *args: object, **kwargs: object) -> None:  # a runner: any step is the plan again
        raise AssertionError(f"planned twice ({fn})")

    schema = Schema.from_yaml(schema_path)
    plan, ledger = pipeline._reserve(checked.config, schema, tmp_path / "store", "run-1", no_step, plan=checked.plan)
    assert plan is checked.plan
    assert list(ledger.runs(schema.dataset.name)[0].reserved_events) == checked.plan.events
