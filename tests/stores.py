"""One small trained store for the whole test session, shared read-only by the tests that need
a released model (the release allowlist, generate, score, ...), and copies of it for the tests
that change a store (a charged DP threshold, a new version); and one empty store whose MLflow
database is already made, copied by the tests that train into a new store but do not test how
a store is first made (tests/conftest.py, `empty_store`).

The store is built once per session even under xdist: the first worker to get the file lock
trains it with an in-process run (no Prefect server), the others wait and read it.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

SEED = 20261123  # the public sampling seed of the shared run's synthetic table
ROWS = 2000


def build(root: Path, demo_dir: Path) -> dict[str, Any]:
    """Train the shared store under `root`: 2,000 Adult rows (one with an age outside the
    public bounds, so the gate has something to count), a one-block MAF, one epoch."""
    from privflow.core.config import RunConfig
    from privflow.flows.pipeline import train_in_process
    from tests.data_slices import adult_slice

    root.mkdir(parents=True, exist_ok=True)
    data, schema = adult_slice(root, demo_dir, ROWS, bad_age=1)
    config = RunConfig.build(
        data=data,
        schema_path=schema,
        store=root / "store",
        privacy={"epsilon": 2.0, "delta": 1e-5},
        model={"name": "maf", "blocks": 1, "hidden": 8},
        train={"epochs": 1, "batch_size": 256, "checkpoint_every": 4},
        evaluate={
            "synthetic_rows": 300,
            "sampling_seed": SEED,
            "utility": False,
            "privacy_risk": False,
            "report": True,
        },
    )
    summary = train_in_process(config, show_progress=False)
    return {"config": config.model_dump(mode="json"), "summary": summary.to_dict()}


def copy_store(src: Path, dst: Path) -> Path:
    """A copy of a store that a test may change: the files, with every absolute path that
    MLflow recorded in its database (artifact locations, model sources) moved to the copy."""
    shutil.copytree(src, dst)
    old, new = str(src.resolve()), str(dst.resolve())
    db = dst / "mlflow.db"
    with sqlite3.connect(db) as con:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for _, column, kind, *_ in con.execute(f'PRAGMA table_info("{table}")').fetchall():
                if "CHAR" in kind.upper() or "TEXT" in kind.upper() or kind == "":
                    con.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?)', (old, new))
    return dst


def build_empty(root: Path) -> Path:
    """A store folder that holds only MLflow's SQLite database, its schema made and nothing in it
    (MLflow's own Default experiment aside): what MLflow leaves after its first open of a store.
    Making the schema runs MLflow's ~60 database migrations, seconds each time a store is new."""
    from mlflow import MlflowClient

    store = root / "store"
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store.resolve() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # not the process's tracking URI
    client.search_experiments()  # the tracking store: creates the tables and the Default experiment
    client.search_registered_models()  # the registry store: finds its tables made
    return store


def load(info_path: Path) -> dict[str, Any]:
    return json.loads(info_path.read_text())
