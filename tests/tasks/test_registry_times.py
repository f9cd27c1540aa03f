"""The times MLflow's store stamps itself when privflow registers a version or moves an alias
(the version's, the registered and logged model's, the experiment's) floored to the start of
their UTC day (mlflow_store.coarsen_registry_times; privacy rule 10), and the store still read
by MLflow afterwards. Against a small store: a dummy pyfunc model, registered as a run does."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from privflow.core import env
from privflow.tasks import mlflow_store
from privflow.tasks.mlflow_store import coarsen_registry_times, record_promotion, store_lock, tracking

DAY = 86_400_000
NAME, OTHER = "toy-model", "other-model"


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def _register(name: str) -> tuple[str, str]:
    """A released run that logs and registers a dummy pyfunc: (run id, logged model id)."""
    with mlflow_store.released_run("toy", f"{name}-run") as run:
        info = mlflow.pyfunc.log_model(
            name="generator",
            python_model=Echo(),
            registered_model_name=name,
            input_example=pd.DataFrame({"n": [1.0]}),
            # stated, not inferred: inferring them loads the model in a new process (seconds a model)
            pip_requirements=["mlflow"],
        )
    return run.info.run_id, str(info.model_id)


@pytest.fixture(scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory, empty_store: Path) -> SimpleNamespace:
    """The small store, built once: two versions of NAME (the first @champion), one of OTHER.
    It starts as a copy of the session's empty store (MLflow's database made: tests/conftest.py)."""
    from tests.stores import copy_store

    store = copy_store(empty_store, tmp_path_factory.mktemp("registry-times") / "store")
    tracking(store)
    mlflow_store.experiment_for("toy", store)
    run_id, model_id = _register(NAME)
    _register(NAME)  # a second version
    _register(OTHER)
    MlflowClient().set_registered_model_alias(NAME, "champion", "1")
    return SimpleNamespace(store=store, run_id=run_id, model_id=model_id)


@pytest.fixture()
def small_store(_built: SimpleNamespace, tmp_path: Path) -> SimpleNamespace:
    """A copy of the small store for one test (tests/stores.py: MLflow's paths moved to it)."""
    from tests.stores import copy_store

    store = copy_store(_built.store, tmp_path / "store")
    tracking(store)
    return SimpleNamespace(store=store, run_id=_built.run_id, model_id=_built.model_id)


def _times(name: str) -> dict[str, int]:
    """Every registry time of `name` as MLflow's client reads it."""
    client = MlflowClient()
    out: dict[str, int] = {}
    model = client.get_registered_model(name)
    out["registered_model.creation"] = model.creation_timestamp
    out["registered_model.last_updated"] = model.last_updated_timestamp
    for mv in client.search_model_versions(f"name = '{name}'"):
        version = client.get_model_version(name, mv.version)
        out[f"version{mv.version}.creation"] = version.creation_timestamp
        out[f"version{mv.version}.last_updated"] = version.last_updated_timestamp
        logged = client.get_logged_model(version.model_id or version.source.removeprefix("models:/"))
        out[f"logged{mv.version}.creation"] = logged.creation_timestamp
        out[f"logged{mv.version}.last_updated"] = logged.last_updated_timestamp
        experiment = client.get_experiment(client.get_run(version.run_id).info.experiment_id)
        out["experiment.creation"] = experiment.creation_time
        out["experiment.last_update"] = experiment.last_update_time
    default = client.get_experiment("0")  # MLflow's own, made with the store's schema
    out["default_experiment.creation"] = default.creation_time
    out["default_experiment.last_update"] = default.last_update_time
    return {k: int(v) for k, v in out.items()}


def test_registry_times_are_floored_to_the_day(small_store: SimpleNamespace) -> None:
    before, other_before = _times(NAME), _times(OTHER)
    # the model, two versions with their logged models, the run's experiment, the Default one
    assert len(before) == 2 + 2 * 4 + 2 + 2

    assert coarsen_registry_times(small_store.store, NAME) is True

    after = _times(NAME)
    assert after == {k: ms - ms % DAY for k, ms in before.items()}  # floored, nothing else changed
    assert all(ms % DAY == 0 for ms in after.values()), after
    # another model's versions and logged models are left alone (the experiment is shared)
    other_after = _times(OTHER)
    for key, ms in other_before.items():
        assert other_after[key] == (ms - ms % DAY if "experiment." in key else ms), key
    # the logged model as a search reads it, too
    [searched] = [
        m
        for m in MlflowClient().search_logged_models([mlflow.get_experiment_by_name("privflow-toy").experiment_id])
        if m.model_id == small_store.model_id
    ]
    assert searched.creation_timestamp % DAY == 0 and searched.last_updated_timestamp % DAY == 0
    # a second pass changes nothing
    assert coarsen_registry_times(small_store.store, NAME) is True
    assert _times(NAME) == after


def test_mlflow_still_reads_the_store_afterwards(small_store: SimpleNamespace) -> None:
    coarsen_registry_times(small_store.store, NAME)
    client = MlflowClient()
    assert sorted(int(v.version) for v in client.search_model_versions(f"name = '{NAME}'")) == [1, 2]
    assert {m.name for m in client.search_registered_models()} == {NAME, OTHER}
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    assert [r.info.run_id for r in mlflow.search_runs(experiment_names=["privflow-toy"], output_format="list")]
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    assert model.predict(pd.DataFrame({"n": [3.0]}))["n"].tolist() == [3.0]
    # and registering goes on as before: a third version, its times from MLflow's clock again
    _register(NAME)
    third, second = (client.get_model_version(NAME, v) for v in ("3", "2"))
    assert third.creation_timestamp >= second.creation_timestamp


def test_an_alias_move_is_followed_by_the_floor(small_store: SimpleNamespace) -> None:
    decision = SimpleNamespace(
        model_name=NAME,
        candidate_version="2",
        champion_version="1",
        alias="champion",
        promoted=True,
        tags=lambda: {"privflow.promotion.promoted": "yes"},
    )
    record_promotion(MlflowClient(), decision)
    assert str(MlflowClient().get_model_version_by_alias(NAME, "champion").version) == "2"
    assert all(ms % DAY == 0 for ms in _times(NAME).values()), _times(NAME)


def test_the_store_lock_is_reentrant_for_the_promotion(small_store: SimpleNamespace) -> None:
    """The promotion holds the store's lock while it moves the alias, then coarsens under it."""
    done: list[bool] = []

    def nested() -> None:
        with store_lock(small_store.store), store_lock(small_store.store):
            done.append(coarsen_registry_times(small_store.store, NAME))

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(60)
    assert done == [True], "a nested store_lock waited for itself"
    # released: another thread takes it
    other = threading.Thread(target=nested, daemon=True)
    other.start()
    other.join(60)
    assert done == [True, True]


def test_any_other_tracking_uri_is_left_alone(small_store: SimpleNamespace, tmp_path: Path, monkeypatch) -> None:
    before = _times(NAME)
    # MLflow pointed at another store: this one's times are not touched
    tracking(tmp_path / "elsewhere")
    assert coarsen_registry_times(small_store.store, NAME) is False
    # an operator's tracking URI (a server): nothing is rewritten, even in the local file
    tracking(small_store.store)
    monkeypatch.setattr(env, "operator_tracking_uri", lambda: f"sqlite:///{small_store.store.resolve() / 'mlflow.db'}")
    assert coarsen_registry_times(small_store.store, NAME) is False
    monkeypatch.undo()
    assert _times(NAME) == before
