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
