"""Each store gets its own MLflow tracking database, run after run in one process."""

from __future__ import annotations

from pathlib import Path

import mlflow

from privflow.tasks.mlflow_store import tracking


def test_a_second_store_in_the_same_process_is_not_sent_to_the_first(tmp_path: Path) -> None:
    # mlflow.set_tracking_uri also writes MLFLOW_TRACKING_URI: reading that variable back would
    # send the second store's runs into the first store's database.
    first = tracking(tmp_path / "a")
    second = tracking(tmp_path / "b")
    assert first != second and str(tmp_path / "b") in second
    assert mlflow.get_tracking_uri() == second


def _first_use(store: str) -> str:
    """One process's first use of a store: MLflow's schema and the dataset's experiment."""
    from privflow.core import env
    from privflow.tasks.mlflow_store import experiment_for

    env.configure(Path(store))
    tracking(Path(store))
    return experiment_for("adult", Path(store))


def test_runs_started_together_on_a_new_store_all_set_it_up(tmp_path: Path, monkeypatch) -> None:
    """Two runs started together on a new store raced in MLflow's schema creation: one failed
    ('table ... already exists', or an alembic migration error). The store's lock serialises it."""
    import multiprocessing

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # set by this process's own tracking(): not an operator's
    store = str(tmp_path / "store")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        names = pool.map(_first_use, [store] * 4)
    assert names == ["privflow-adult"] * 4
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    assert [e.name for e in client.search_experiments() if e.name == "privflow-adult"] == ["privflow-adult"]
