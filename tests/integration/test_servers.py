"""Real servers on loopback: PostgreSQL, an MLflow tracking server on it, a Prefect server,
the deployments registered on a process work pool with a worker polling it, the folder
watcher; a data file dropped in the folder must become a completed retraining flow run, a
larger ledger and a new model version in that MLflow server.

Every process is stopped by its process-group id in a finally block (tests/integration/
servers.py); the timings are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.servers import (
    BIN,
    Stack,
    mlflow_up,
    postgres_bin,
    prefect_up,
    start_mlflow,
    start_postgres,
    start_prefect,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "privflow" / "demo"
DATASET = "adult-it"
ROWS = 1500
TINY = {
    "privacy": {"epsilon": 1.0, "delta": 1e-5},
    "gate": {"false_stop": 1e-12},  # as in-process tests (tests/conftest.py): no chance stop of the clean file
    "model": {"name": "maf", "blocks": 1, "hidden": 8},
    "train": {"epochs": 0.5, "batch_size": 250, "checkpoint_every": 2, "device": "cpu", "threads": 1},
    "evaluate": {
        "fidelity": False,
        "utility": False,
        "likelihood": False,
        "privacy_risk": False,
        "report": False,
        "synthetic_rows": 100,
    },
}


def _flow_runs(api: str, deployment_id: str, state: list[str] | None = None) -> list[dict]:
    body: dict = {"deployments": {"id": {"any_": [deployment_id]}}}
    if state:
        body["flow_runs"] = {"state": {"type": {"any_": state}}}
    r = httpx.post(f"{api}/flow_runs/filter", json=body, timeout=10)
    r.raise_for_status()
    return r.json()


def _deployment_id(api: str, flow: str, name: str) -> str:
    r = httpx.get(f"{api}/deployments/name/{flow}/{name}", timeout=10)
    r.raise_for_status()
    return r.json()["id"]


@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL server binaries are not installed")
def test_dropped_file_is_retrained_and_registered(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from privflow.privacy.ledger import Ledger

    t0 = time.monotonic()
    timings: dict[str, float] = {}
    stack = Stack(tmp_path)
    store, watch, prefect_home = tmp_path / "store", tmp_path / "incoming", tmp_path / "prefect"
    watch.mkdir()
    raw = yaml.safe_load((DEMO / "adult.yaml").read_text())
    raw["dataset"].update({"name": DATASET, "expected_rows": ROWS, "budget": {"epsilon": 10.0, "delta": 1e-5}})
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump(raw))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(TINY))
    lines = (DEMO / "adult_train.csv").read_text().splitlines()
    try:
        backend = start_postgres(stack)
        timings["postgres_ready"] = time.monotonic() - t0
        mlflow_url, mlflow_proc = start_mlflow(stack, backend, tmp_path / "mlartifacts")
        api, prefect_proc = start_prefect(stack, prefect_home)
        wait_until(lambda: prefect_up(api), 240, "Prefect server healthy", prefect_proc)
        timings["prefect_ready"] = time.monotonic() - t0
        env = stack.env(
            PREFECT_API_URL=api,
            MLFLOW_TRACKING_URI=mlflow_url,
            PREFECT_HOME=str(prefect_home),
            PRIVFLOW_HOME=str(store),
            PREFECT_LOGGING_LEVEL="INFO",
            PREFECT_WORKER_QUERY_SECONDS="2",
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        )
        site = [
            "--schema",
            str(schema),
            "--watch-folder",
            str(watch),
            "--store",
            str(store),
            "--config",
            str(config),
            "--train-data",
            str(tmp_path / "train.csv"),
            "--cron",
            "0 3 1 1 *",
        ]
        (tmp_path / "train.csv").write_text("\n".join(lines[: ROWS + 1]) + "\n")
        deploy = subprocess.run(
            [sys.executable, "-m", "infra.deployments", "deploy", "--pool", "privflow-it", *site],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        timings["deployed"] = time.monotonic() - t0
        worker = stack.start(
            "worker",
            [str(BIN / "prefect"), "worker", "start", "--pool", "privflow-it", "--type", "process"],
            env,
            cwd=tmp_path,
        )
        wait_until(lambda: mlflow_up(mlflow_url), 240, "MLflow server healthy", mlflow_proc)
        timings["mlflow_ready"] = time.monotonic() - t0

        retrain_id = _deployment_id(api, "privflow-retrain", "on-new-data")
        train_id = _deployment_id(api, "privflow-train", "scheduled")
        automations = httpx.post(f"{api}/automations/filter", json={}, timeout=10).json()
        assert any(retrain_id in json.dumps(a["actions"]) for a in automations)

        # drop a new file (written aside, then renamed in: the watcher never sees half a file)
        part = watch / "batch-001.csv.part"
        part.write_text("\n".join([lines[0], *lines[ROWS + 1 : 2 * ROWS + 1]]) + "\n")
        dropped = part.rename(watch / "batch-001.csv")
        t_drop = time.monotonic()
        wall_drop = time.time()
        watcher = subprocess.run(
            [sys.executable, "-m", "privflow.flows.watch", str(watch), "--once", "--settle", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert watcher.returncode == 0, watcher.stdout + watcher.stderr
        assert str(dropped) in watcher.stdout
        again = subprocess.run(
            [sys.executable, "-m", "privflow.flows.watch", str(watch), "--once", "--settle", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0 and "announced" not in again.stdout  # never twice for one file

        wait_until(lambda: len(_flow_runs(api, retrain_id)) >= 1, 60, "the trigger creating a flow run", worker)
        timings["flow_run_created_after_drop"] = time.monotonic() - t_drop
        final = ["COMPLETED", "FAILED", "CRASHED", "CANCELLED"]
        wait_until(lambda: len(_flow_runs(api, retrain_id, final)) >= 1, 420, "the retraining run finishing", worker)
        timings["flow_run_final_after_drop"] = time.monotonic() - t_drop
        runs = _flow_runs(api, retrain_id)
        assert len(runs) == 1, "one file, one flow run"
        run = runs[0]
        assert run["state"]["type"] == "COMPLETED", (run["state"], worker.tail())
        assert run["parameters"]["data_path"] == str(dropped)

        ledger = Ledger(store / "ledger.db")
        assert [r.status for r in ledger.runs(DATASET)] == ["settled"]
        assert ledger.spent(DATASET)[0] > 0.0

        client = MlflowClient(tracking_uri=mlflow_url, registry_uri=mlflow_url)
        versions = client.search_model_versions(f"name='privflow-{DATASET}'")
        assert len(versions) == 1
        version = versions[0]
        timings["version_registered_after_drop"] = version.creation_timestamp / 1000 - wall_drop
        assert version.tags["privflow.promotion.promoted"] == "yes"  # the first version: champion at no cost
        assert str(client.get_model_version_by_alias(f"privflow-{DATASET}", "champion").version) == str(version.version)
        mlflow_run = client.get_run(version.run_id)
        assert mlflow_run.data.metrics["epsilon"] <= 1.0 + 1e-6

        assert _deployment_id(api, "privflow-train", "scheduled") == train_id
        timings["total"] = time.monotonic() - t0
        print("\nintegration timings (s):", json.dumps({k: round(v, 1) for k, v in timings.items()}))
        (tmp_path / "timings.json").write_text(json.dumps(timings))
    finally:
        stack.stop_all()
    assert not [p for p in stack.procs if p.popen.poll() is None]


def test_cron_deployment_is_scheduled_by_a_real_server(tmp_path: Path) -> None:
    """The scheduled training deployment gets runs from the server's scheduler service (the
    ephemeral test server does not run it). Prefect 3.8's scheduler fails under SQLAlchemy 2.1
    ('Can't evaluate bulk DML statement'): this test is what catches that."""
    stack = Stack(tmp_path)
    prefect_home = tmp_path / "prefect"
    try:
        api, prefect_proc = start_prefect(stack, prefect_home)
        wait_until(lambda: prefect_up(api), 240, "Prefect server healthy", prefect_proc)
        env = stack.env(
            PREFECT_API_URL=api,
            PREFECT_HOME=str(prefect_home),
            PRIVFLOW_HOME=str(tmp_path / "store"),
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        )
        deploy = subprocess.run(
            [
                sys.executable,
                "-m",
                "infra.deployments",
                "deploy",
                "--pool",
                "privflow-cron",
                "--store",
                str(tmp_path / "store"),
                "--watch-folder",
                str(tmp_path / "in"),
                "--cron",
                "30 4 * * *",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        train_id = _deployment_id(api, "privflow-train", "scheduled")
        wait_until(lambda: len(_flow_runs(api, train_id, ["SCHEDULED"])) >= 1, 90, "cron runs scheduled", prefect_proc)
        runs = _flow_runs(api, train_id, ["SCHEDULED"])
        starts = sorted(r["expected_start_time"] for r in runs)
        assert all("T04:30:00" in t for t in starts), starts
        assert runs[0]["parameters"]["config"]["schema_path"].endswith("adult.yaml")
    finally:
        stack.stop_all()
    assert not [p for p in stack.procs if p.popen.poll() is None]
