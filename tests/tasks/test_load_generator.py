"""Loading a registered sampler leaves the process's import path as it was."""

from __future__ import annotations

import sys


def test_loading_a_generator_leaves_sys_path_alone(trained_store: dict) -> None:
    """MLflow put the model's bundled partial copy of privflow first on sys.path; spawned children
    (a Dask worker, a process pool) then imported the copy and died on 'No module named
    privflow.cli', and their parents waited forever (a CI run past its time limit)."""
    from privflow.tasks.mlflow_store import load_generator

    before = list(sys.path)
    name = trained_store["summary"]["model_name"]
    model = load_generator(f"{name}@champion", trained_store["store"])
    assert model is not None
    assert sys.path == before


# A fresh process in which the installed privflow is not importable: only MLflow and the model's
# own bundled code. It prints where privflow came from and the rows the model sampled.
PLAIN_MLFLOW = """
import sys
src = sys.argv[1]
sys.path[:] = [p for p in sys.path if p.rstrip('/') != src]
import mlflow, pandas as pd
mlflow.set_tracking_uri(sys.argv[2])
model = mlflow.pyfunc.load_model(sys.argv[3])
rows = model.predict(pd.DataFrame({"n": [7], "seed": [1]}))
import privflow
print(privflow.__file__)
print(len(rows), ",".join(rows.columns))
"""


def test_a_registered_model_loads_with_mlflow_alone(trained_store: dict) -> None:
    """The registered sampler carries the code it needs: MLflow alone, in a process where the
    installed privflow cannot be imported, loads it and samples (the bundled list of modules had
    fallen behind: 'No module named privflow.core.config')."""
    import os
    import subprocess
    from pathlib import Path

    import privflow

    src = str(Path(privflow.__file__).resolve().parent.parent)
    uri = f"sqlite:///{trained_store['store'].resolve() / 'mlflow.db'}"
    name = trained_store["summary"]["model_name"]
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_MLFLOW, src, uri, f"models:/{name}@champion"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    where, sampled = done.stdout.strip().splitlines()[-2:]
    assert not where.startswith(src)  # the model's own copy, not the installed package
    assert sampled.startswith("7 ") and "age" in sampled


def test_predict_takes_n_and_seed_as_mlflow_params(trained_store: dict) -> None:
    """MLflow's way: predict(data, params={"n", "seed"}); the older DataFrame columns still work
    and give the same rows for the same seed; without n it says how to ask."""
    import pandas as pd
    import pytest

    from privflow.tasks.mlflow_store import load_generator

    name = trained_store["summary"]["model_name"]
    model = load_generator(f"{name}@champion", trained_store["store"])
    by_params = model.predict(pd.DataFrame(), params={"n": 6, "seed": 3})
    by_columns = model.predict(pd.DataFrame({"n": [6], "seed": [3]}))
    assert len(by_params) == 6
    pd.testing.assert_frame_equal(by_params, by_columns)
    assert model.metadata.signature.params is not None
    with pytest.raises(Exception, match="number of rows"):
        model.predict(pd.DataFrame())
