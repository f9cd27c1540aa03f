"""The operations wiring without real servers: the watcher's state and events, the deployment
declarations, the trigger on a temporary Prefect server, and the infra files."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest
import yaml

import privflow.flows.watch as watch

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Capture emit_event calls instead of sending them (no server)."""
    import prefect.events
    from prefect.events.worker import EventsWorker

    sent: list[dict] = []

    def fake_emit(**kwargs):
        sent.append(kwargs)
        return object()

    monkeypatch.setattr(prefect.events, "emit_event", fake_emit)
    monkeypatch.setattr(watch, "_api_ready", lambda: None)
    monkeypatch.setattr(EventsWorker, "drain_all", classmethod(lambda cls, timeout=None, at_exit=True: None))
    return sent


def test_watcher_announces_each_file_once(tmp_path: Path, emitted: list[dict]) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("x\n1\n")
    (folder / "b.parquet").write_bytes(b"PAR1 not really")
    (folder / "c.csv.part").write_text("x\n1\n")  # still being copied
    (folder / ".hidden.csv").write_text("x\n1\n")
    (folder / "notes.txt").write_text("hello")
    (folder / "empty.csv").write_text("")
    fresh = folder / "fresh.csv"
    fresh.write_text("x\n2\n")
    old = time.time() - 60  # settled: older than the 30 s however long the test takes
    for p in folder.iterdir():
        if p != fresh:
            os.utime(p, (old, old))
    soon = time.time() + 86_400  # still being written: younger than 30 s however long the test takes
    os.utime(fresh, (soon, soon))

    store = tmp_path / "store"
    first = watch.scan_once(folder, settle=30, store=store)
    assert sorted(a.path.name for a in first) == ["a.csv", "b.parquet"]
    ev = {e["resource"]["prefect.resource.name"]: e for e in emitted}
    a = ev["a.csv"]
    assert a["event"] == "privflow.data.arrived"
    assert a["resource"]["prefect.resource.id"] == str((folder / "a.csv").resolve())
    assert a["resource"]["privflow.folder"] == str(folder.resolve())
    assert a["id"] == watch.event_id((folder / "a.csv").resolve(), a["payload"]["fingerprint"])

    assert watch.scan_once(folder, settle=30, store=store) == []  # nothing new: nothing emitted
    assert len(emitted) == 2
    os.utime(fresh, (old, old))
    assert [x.path.name for x in watch.scan_once(folder, settle=30, store=store)] == ["fresh.csv"]

    (folder / "a.csv").write_text("x\n1\n3\n")  # new content under the same name: new data
    os.utime(folder / "a.csv", (old, old))
    again = watch.scan_once(folder, settle=30, store=store)
    assert [x.path.name for x in again] == ["a.csv"] and again[0].event_id != a["id"]
    state = json.loads((folder / ".privflow-watch.json").read_text())["emitted"]
    assert set(state) == {str((folder / n).resolve()) for n in ("a.csv", "b.parquet", "fresh.csv")}


def test_the_watchers_event_carries_a_keyed_fingerprint_only(tmp_path: Path, emitted: list[dict]) -> None:
    """The file is private: its event (payload and id) and the watcher's state hold no unkeyed
    hash of its bytes and no size, only the HMAC under the store's secret key."""
    import hashlib

    from privflow.privacy.fingerprint import keyed_fingerprint, store_key

    folder, store = tmp_path / "in", tmp_path / "store"
    folder.mkdir()
    data = folder / "a.csv"
    data.write_text("x\n1\n2\n")
    (arrival,) = watch.scan_once(folder, settle=0, store=store)
    (event,) = emitted
    keyed = keyed_fingerprint(data, store_key(store))
    assert event["payload"] == {"fingerprint": keyed} and arrival.fingerprint == keyed
    assert event["id"] == watch.event_id(data.resolve(), keyed)
    plain = hashlib.sha256(data.read_bytes()).hexdigest()
    state_text = (folder / ".privflow-watch.json").read_text()
    for text in (json.dumps(event, default=str), state_text):
        assert plain not in text and '"bytes"' not in text and 'sha256"' not in text
    assert event["id"] != watch.event_id(data.resolve(), plain)
    # another store's key: another fingerprint, so the file is new to a watcher keyed by it
    other = watch.scan_once(folder, settle=0, store=tmp_path / "other-store", state=tmp_path / "other.json")
    assert [x.fingerprint for x in other] != [keyed]


def test_a_state_file_of_an_older_watcher_announces_nothing_again(tmp_path: Path, emitted: list[dict]) -> None:
    """An entry recorded with the unkeyed SHA-256 (older watchers) is matched once and rewritten
    with the keyed fingerprint: the file is not announced (and retrained on) a second time."""
    import hashlib

    folder, store = tmp_path / "in", tmp_path / "store"
    folder.mkdir()
    data = folder / "a.csv"
    data.write_text("x\n1\n")
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    old_id = str(uuid.uuid5(watch._NAMESPACE, f"{data.resolve()}\0{digest}"))
    entry = {"sha256": digest, "event_id": old_id, "emitted_at": "2026-01-01T00:00:00+00:00"}
    watch.save_state(watch.default_state(folder), {str(data.resolve()): entry})
    assert watch.scan_once(folder, settle=0, store=store) == [] and emitted == []
    state = watch.load_state(watch.default_state(folder))[str(data.resolve())]
    assert "sha256" not in state and state["fingerprint"].startswith("hmac-sha256:")
    assert digest not in watch.default_state(folder).read_text()
    data.write_text("x\n1\n2\n")  # then changed: announced as new data
    assert [a.path.name for a in watch.scan_once(folder, settle=0, store=store)] == ["a.csv"]


def test_watcher_records_nothing_when_the_api_is_down(
    tmp_path: Path, emitted: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.csv").write_text("x\n1\n")

    def down() -> None:
        raise ConnectionError("no API")

    monkeypatch.setattr(watch, "_api_ready", down)
    store = tmp_path / "store"
    with pytest.raises(ConnectionError):
        watch.scan_once(tmp_path, settle=0, store=store)
    assert emitted == [] and watch.load_state(watch.default_state(tmp_path)) == {}
    monkeypatch.setattr(watch, "_api_ready", lambda: None)
    assert len(watch.scan_once(tmp_path, settle=0, store=store)) == 1


def test_event_id_is_deterministic_per_path_and_content() -> None:
    p = Path("/data/x.csv")
    assert watch.event_id(p, "ab") == watch.event_id(p, "ab")
    assert len({watch.event_id(p, "ab"), watch.event_id(p, "ac"), watch.event_id(Path("/data/y.csv"), "ab")}) == 3
    assert isinstance(watch.event_id(p, "ab"), uuid.UUID)


def _site(tmp_path: Path):
    from infra.deployments import Site

    return Site.from_env(
        schema=ROOT / "src" / "privflow" / "demo" / "adult.yaml",
        watch_folder=tmp_path / "in",
        store=tmp_path / "store",
        train_data=ROOT / "src" / "privflow" / "demo" / "adult_train.csv",
        cron="15 2 * * 1",
    )


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--cron", "not a cron"], "is not a cron expression"),
        (["--schema", "nope.yaml"], "is not a file"),
        (["--config", "nope.yaml"], "is not a file (--config"),
        (["--config", "BAD"], "train.epochz"),  # a config with an unknown setting (fuzzing round 6: exit 1)
    ],
)
def test_a_bad_site_is_one_line_and_status_2(tmp_path: Path, capsys, flags: list[str], needle: str) -> None:
    """`python -m infra.deployments show --cron 'not a cron'` printed a traceback and exited 1, and
    a config file that was missing or held an unknown setting did too."""
    from infra.deployments import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {epochz: 1}\n")
    flags = [str(bad) if f == "BAD" else f for f in flags]
    assert main(["show", "--store", str(tmp_path / "store"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and "Traceback" not in err


def test_deployments_are_declared_once_with_schedule_and_trigger(tmp_path: Path) -> None:
    from infra.deployments import EVENT, FOLDER_LABEL, deployments

    assert EVENT == watch.EVENT and FOLDER_LABEL == watch.FOLDER_LABEL
    site = _site(tmp_path)
    train, retrain = deployments(site)
    assert (train.flow_name, train.name, train.entrypoint) == (
        "privflow-train",
        "scheduled",
        "privflow.flows.train.train_pipeline",
    )
    assert train.schedules[0].schedule.cron == "15 2 * * 1"
    assert train.parameters["config"]["data"] == str(site.train_data) and train.parameters["show_progress"] is False
    assert retrain.entrypoint == "privflow.flows.retrain.retrain_on_new_data" and not retrain.schedules
    (trigger,) = retrain.triggers
    assert trigger.expect == {"privflow.data.arrived"}
    assert trigger.match.root == {"privflow.folder": str(site.watch_folder)}
    assert trigger.parameters == {"data_path": "{{ event.resource.id }}"}
    assert retrain.parameters["schema_path"] == str(site.schema) and retrain.parameters["store"] == str(site.store)


@pytest.mark.slow
def test_event_from_the_watcher_starts_the_retraining_deployment(tmp_path: Path, prefect_server) -> None:
    """On the temporary Prefect server: apply the deployments, emit for a file, see the flow run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from infra.deployments import deployments

    site = _site(tmp_path)
    site.watch_folder.mkdir()
    ids = {dep.name: dep.apply() for dep in deployments(site)}
    new = site.watch_folder / "rows.csv"
    new.write_text("age\n1\n")
    (arrival,) = watch.scan_once(site.watch_folder, settle=0, store=site.store)
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60
        runs = []
        while time.monotonic() < deadline and not runs:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[ids["on-new-data"]]))
            )
            time.sleep(0.5)
    assert len(runs) == 1
    assert runs[0].parameters["data_path"] == str(arrival.path)
    assert runs[0].parameters["schema_path"] == str(site.schema)  # deployment defaults merged in


def test_compose_file_declares_the_stack() -> None:
    compose = yaml.safe_load((INFRA / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "mlflow", "prefect-server", "worker", "watcher", "deploy"} <= set(services)
    mlflow_cmd = " ".join(services["mlflow"]["command"])
    assert (
        "--backend-store-uri postgresql+psycopg2://" in mlflow_cmd
        and "--artifacts-destination /mlartifacts" in mlflow_cmd
    )
    assert any(v.startswith("mlartifacts:") for v in services["mlflow"]["volumes"])
    assert services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"].startswith(
        "postgresql+asyncpg://"
    )
    assert (
        services["worker"]["command"][:3] == ["prefect", "worker", "start"]
        and "process" in services["worker"]["command"]
    )
    assert services["worker"]["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    init = (INFRA / "postgres" / "init.sql").read_text()
    assert "CREATE DATABASE mlflow" in init and "CREATE DATABASE prefect" in init
    for name, svc in services.items():
        if "build" in svc:  # paths relative to the compose file's folder, then to the context
            context = (INFRA / svc["build"]["context"]).resolve()
            assert context == ROOT and (context / svc["build"]["dockerfile"]).exists(), name


def test_dockerfile_installs_cpu_torch_before_the_package() -> None:
    text = (INFRA / "Dockerfile").read_text()
    torch_at = text.index('pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"')
    assert "whl/cpu" in text and torch_at < text.index("pip install .")


def test_gpu_work_pool_template_requests_gpus_and_declares_its_variables() -> None:
    template = json.loads((INFRA / "k8s" / "gpu-base-job-template.json").read_text())
    manifest = template["job_configuration"]["job_manifest"]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_count }}"
    assert container["name"] == "prefect-job" and manifest["kind"] == "Job"
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used <= declared, used - declared
    assert template["variables"]["properties"]["gpu_count"]["default"] >= 1
