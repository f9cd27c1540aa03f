"""Each store gets its own MLflow tracking database, run after run in one process."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from privflow.tasks.mlflow_store import tracking


def test_a_second_store_in_the_same_process_is_not_sent_to_the_first(tmp_path: Path) -> None:
    # mlflow.set_tracking_uri also writes MLFLOW_TRACKING_URI: reading that variable back would
    # send the second store's runs into the first store's database.
    first = tracking(tmp_path / "a")
    second = tracking(tmp_path / "b")
    assert first != second and str(tmp_path / "b") in second
    assert mlflow.get_tracking_uri() == second


# One process's first use of a store: MLflow's schema and the dataset's experiment. A script,
# not a function pickled to a spawn Pool: the children then need only the installed package,
# whatever an earlier test in this worker did to sys.path (loading a registered model put its
# bundled copy of privflow first, pool children died importing it, and the Pool waited forever).
FIRST_USE = """
import sys
from pathlib import Path
from privflow.core import env
from privflow.tasks.mlflow_store import experiment_for, tracking
env.configure(Path(sys.argv[1]))
tracking(Path(sys.argv[1]))
print(experiment_for("adult", Path(sys.argv[1])))
"""


@pytest.mark.slow  # four processes that each import MLflow cold: about 20 s
def test_runs_started_together_on_a_new_store_all_set_it_up(tmp_path: Path) -> None:
    """Two runs started together on a new store raced in MLflow's schema creation: one failed
    ('table ... already exists', or an alembic migration error). The store's lock serialises it."""
    import os
    import subprocess
    import sys

    store = str(tmp_path / "store")
    # as a user starts them: this process's own tracking() set MLFLOW_TRACKING_URI, not an operator
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE, store], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    assert [out.strip().splitlines()[-1] for out, _ in outs] == ["privflow-adult"] * 4
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    assert [e.name for e in client.search_experiments() if e.name == "privflow-adult"] == ["privflow-adult"]
