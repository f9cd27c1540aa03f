"""What a run releases, and only that: nothing leaks.

One small run on a slice of real data (Adult) with one bad row, then:
- the release inventory: every param, metric and tag of the MLflow run behind the
  registered model, every artifact, every tag of the version and the model, is covered by
  the allowlist in tasks/release.py (public, or a mechanism's output); anything new fails;
- the replay test: the released table is a function of the released model and the public
  sampling seed only, whatever happened to the global RNG (e.g. draws whose number depends
  on the private row count);
- diagnostics on real rows are in the curator-only folder and nowhere in MLflow;
- the data fingerprint is a keyed HMAC, kept out of MLflow;
- the released run is timeless: one moment (the start of its UTC day) for its start, its end
  and every metric, so no duration of the private work shows; the MLmodel file's creation time
  and `ledger show` say the day only, and so do the times MLflow's registry stamps itself (the
  version's, the registered and logged model's, the experiment's), floored after registration;
- the validation gate's stop is a charged DP decision whose message carries no exact count.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from privflow.core.config import RunConfig
from privflow.core.errors import ValidationFailed
from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.ledger import Ledger
from privflow.serving.sampler import sample_rows
from privflow.tasks import release
from privflow.tasks.promote import load_version
from tests.data_slices import adult_slice

SEED = 20261123


def _slice(tmp: Path, demo_dir: Path, rows: int, bad_age: int = 0) -> tuple[Path, Path]:
    return adult_slice(tmp, demo_dir, rows, bad_age)


def _config(data: Path, schema: Path, store: Path, **extra: object) -> RunConfig:
    return RunConfig.build(
        data=data,
        schema_path=schema,
        store=store,
        privacy={"epsilon": 2.0, "delta": 1e-5},
        model={"name": "maf", "blocks": 1, "hidden": 8},
        train={"epochs": 1, "batch_size": 256, "checkpoint_every": 4},
        **extra,
    )


@pytest.fixture()
def run(trained_store: dict):
    """The session's shared trained store (tests/stores.py: 2,000 rows with one bad age, the
    in-process run, whose release tests/flows/test_train_in_process.py shows to be the Prefect
    flow's), read only."""
    from types import SimpleNamespace

    from privflow.tasks import mlflow_store

    mlflow_store.tracking(trained_store["store"])
    return trained_store["config"], SimpleNamespace(**trained_store["summary"])


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    out: list[str] = []
    for item in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def _uncovered(allowlist: dict[str, str], keys) -> list[str]:
    return sorted(k for k in keys if release.reason(allowlist, k) is None)


def test_every_released_entry_is_on_the_allowlist(run) -> None:
    cfg, summary = run
    client = MlflowClient()
    data = client.get_run(summary.mlflow_run_id).data
    artifacts = _artifacts(client, summary.mlflow_run_id)
    assert data.params and data.metrics and data.tags and artifacts  # nothing vacuous
    assert _uncovered(release.PARAMS, data.params) == []
    assert _uncovered(release.TAGS, data.tags) == []
    assert _uncovered(release.METRICS, data.metrics) == []
    assert _uncovered(release.ARTIFACTS, artifacts) == []
    version = client.get_model_version(summary.model_name, summary.model_version)
    assert _uncovered(release.VERSION_TAGS, version.tags) == []
    assert _uncovered(release.MODEL_TAGS, client.get_registered_model(summary.model_name).tags) == []
    # the gate's DP count is released; no diagnostic metric is
    assert "gate.noisy_failing_rows" in data.metrics
    assert not any(k.startswith("diag") for k in data.metrics)


def test_the_released_run_shows_one_moment_and_no_duration(run) -> None:
    cfg, summary = run
    client = MlflowClient()
    version = client.get_model_version(summary.model_name, summary.model_version)
    assert version.run_id == summary.mlflow_run_id  # the run behind the registered model
    info = client.get_run(summary.mlflow_run_id).info
    day = 86_400_000
    assert info.start_time % day == 0 and info.end_time == info.start_time  # a calendar day, no duration
    assert info.status == "FINISHED"
    metrics = client.get_run(summary.mlflow_run_id).data.metrics
    history = [m for key in metrics for m in client.get_metric_history(summary.mlflow_run_id, key)]
    assert len(history) > len(metrics)  # epsilon_cumulative has a point per checkpoint
    assert {m.timestamp for m in history} == {info.start_time}
    assert {"run.start_time", "run.end_time", "metric.timestamp"} <= set(release.TIMING)


def _finer_than_the_day(ms: int | None) -> bool:
    return ms is not None and int(ms) % 86_400_000 != 0


def test_nothing_released_carries_a_time_finer_than_the_day(run) -> None:
    """Privacy rule 10: every timestamp of a release is a UTC day: the run's times and metrics,
    the MLmodel file's utc_time_created, `ledger show`, and the times MLflow's store stamps
    itself at registration (the version, the registered and the logged model, the experiment),
    which privflow floors to the day afterwards (mlflow_store.coarsen_registry_times); all read
    back through MLflow's client, as anyone reading the store sees them."""
    from datetime import datetime

    import mlflow

    from privflow.tasks.mlflow_store import model_created_day

    cfg, summary = run
    client = MlflowClient()
    version = client.get_model_version(summary.model_name, summary.model_version)
    info = client.get_run(summary.mlflow_run_id).info
    # the MLmodel file, as `mlflow.pyfunc.load_model` and a download see it
    mlmodel = mlflow.models.get_model_info(f"models:/{summary.model_name}/{summary.model_version}")
    created = datetime.fromisoformat(mlmodel.utc_time_created)
    assert (created.hour, created.minute, created.second, created.microsecond) == (0, 0, 0, 0), created
    assert mlmodel.utc_time_created == model_created_day(info.start_time)  # the run's day
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{summary.model_name}/{summary.model_version}/MLmodel"))
    assert f"utc_time_created: '{mlmodel.utc_time_created}'" in local.read_text()
    # every timestamp of the released run, its metrics, the version, the registered and logged
    # model, and the run's experiment
    stamps: dict[str, int | None] = {"run.start_time": info.start_time, "run.end_time": info.end_time}
    metrics = client.get_run(summary.mlflow_run_id).data.metrics
    for key in metrics:
        for i, m in enumerate(client.get_metric_history(summary.mlflow_run_id, key)):
            stamps[f"metric.timestamp[{key}#{i}]"] = m.timestamp
    registered = client.get_registered_model(summary.model_name)
    assert mlmodel.model_id  # MLflow 3 records a logged model behind the version
    logged = client.get_logged_model(mlmodel.model_id)
    [searched] = [m for m in client.search_logged_models([info.experiment_id]) if m.model_id == mlmodel.model_id]
    experiment = client.get_experiment(info.experiment_id)
    for prefix, entity in (
        ("version", version),
        ("registered_model", registered),
        ("logged_model", logged),
        ("logged_model.searched", searched),
    ):
        for attr in ("creation_timestamp", "last_updated_timestamp"):
            stamps[f"{prefix}.{attr}"] = getattr(entity, attr)
    default = client.get_experiment("0")  # MLflow's own, made with the store on the first run
    for attr in ("creation_time", "last_update_time"):
        stamps[f"experiment.{attr}"] = getattr(experiment, attr)
        stamps[f"experiment[Default].{attr}"] = getattr(default, attr)
    registry = [k for k in stamps if k.startswith(("version.", "registered_model.", "logged_model.", "experiment."))]
    assert len(registry) == 10, registry  # none missing
    for m in logged.metrics or []:
        stamps[f"logged_model.metric.timestamp[{m.key}]"] = m.timestamp
    fine = sorted(k for k, ms in stamps.items() if ms is None or _finer_than_the_day(ms))
    assert fine == [], {k: stamps[k] for k in fine}
    # registered the day the run began (or the next, for a run across midnight)
    day = 86_400_000
    assert all(info.start_time - day <= int(stamps[k] or 0) <= info.start_time + day for k in registry), stamps
    floored = {k for k in registry if ".searched." not in k}
    assert {"run.start_time", "run.end_time", "metric.timestamp", "model.utc_time_created", *floored} <= set(
        release.TIMING
    )
    # the publishable ledger summary: dates only
    text = Ledger(cfg.store.resolve() / "ledger.db").describe()
    assert re.search(r"\d{4}-\d{2}-\d{2}", text) and not re.search(r"\d{2}:\d{2}", text), text


def test_allowlist_rejects_what_it_does_not_name() -> None:
    assert release.reason(release.METRICS, "diag.train_loss") is None
    assert release.reason(release.ARTIFACTS, "diagnostics_not_dp/validation.json") is None
    assert release.reason(release.TAGS, "privflow.data_fingerprint") is None
    assert release.reason(release.METRICS, "plan.train.share") is not None


def test_fingerprint_is_a_keyed_hmac_kept_out_of_mlflow(run) -> None:
    cfg, summary = run
    record = Ledger(cfg.store.resolve() / "ledger.db").datasets()[0]
    plain = hashlib.sha256(Path(cfg.data).read_bytes()).hexdigest()
    assert record.fingerprint.startswith("hmac-sha256:") and plain not in record.fingerprint
    data = MlflowClient().get_run(summary.mlflow_run_id).data
    values = [*data.tags.values(), *data.params.values()]
    assert not any(record.fingerprint[12:24] in v or plain[:12] in v for v in values)


def test_diagnostics_on_real_rows_live_only_in_the_curator_folder(run) -> None:
    cfg, summary = run
    curator = Path(summary.curator_dir)
    assert curator.is_dir() and (curator.stat().st_mode & 0o077) == 0
    validation = json.loads((curator / "validation.json").read_text())
    assert validation["total_rows"] == 2000 and validation["failing_rows"] == 1  # exact, curator only
    training = json.loads((curator / "training.json").read_text())
    assert len(training["train_losses"]) > 0
    assert summary.report_path is not None and Path(summary.report_path).is_relative_to(curator)
    arts = _artifacts(MlflowClient(), summary.mlflow_run_id)
    assert not any("validation" in a or "diagnostic" in a or a.endswith(".html") for a in arts)


def test_released_table_depends_only_on_model_and_sampling_seed(run, tmp_path: Path) -> None:
    cfg, summary = run
    released = Path(summary.synthetic_path).read_bytes()
    loaded = load_version(summary.model_name, summary.model_version)
    codec = loaded.codec  # the codec it was released in (DP marginals and target head included)
    # whatever the global RNG went through (say, draws counted by private rows)...
    for count in (1999, 2000, 2001):
        torch.manual_seed(cfg.train.seed)
        torch.rand(count)
        sample_rows(loaded.flows, codec, 300, seed=SEED).write_csv(tmp_path / "replay.csv")
        assert (tmp_path / "replay.csv").read_bytes() == released, f"replay differs after {count} global draws"
    # ...and without a seed the table is fresh from the CSPRNG each time
    a = sample_rows(loaded.flows, codec, 300)
    b = sample_rows(loaded.flows, codec, 300)
    assert not a.equals(b)


@pytest.mark.gate_odds
def test_gate_limit_is_raised_to_the_configured_false_stop_floor(tmp_path: Path, demo_dir: Path) -> None:
    """gate.false_stop sets the noise floor: the count a clean table exceeds with that probability."""
    from types import SimpleNamespace

    from privflow.data.schema import Schema
    from privflow.preflight import gate_limit

    data, schema_path = _slice(tmp_path, demo_dir, 2000)
    schema = Schema.from_yaml(schema_path)
    stage = SimpleNamespace(event=LaplaceEvent(50.0))  # the gate at epsilon 0.02
    plan = SimpleNamespace(stage=lambda name: stage)
    for false_stop in (1e-3, 1e-6):
        cfg = _config(data, schema_path, tmp_path / "store", gate={"false_stop": false_stop})
        limit = gate_limit(cfg, schema, plan)
        assert limit > 0.01 * 2000  # the floor, not the policy's 1% of expected_rows
        assert 0.5 * math.exp(-limit / 50.0) == pytest.approx(false_stop)


@pytest.mark.gate_odds
def test_gate_stop_is_charged_and_speaks_in_dp_counts(tmp_path: Path, demo_dir: Path, new_store: Path) -> None:
    from privflow.flows.pipeline import train_in_process

    data, schema = _slice(tmp_path, demo_dir, 2000, bad_age=600)  # 30% of the rows: far above 1%
    cfg = _config(data, schema, new_store)
    with pytest.raises(ValidationFailed) as info:
        train_in_process(cfg, show_progress=False)
    message = str(info.value)
    # the DP count is printed rounded, so it equals the exact 600 about 2% of the time: strip it
    assert re.search(r"about \d+ rows fail", message)
    rest = re.sub(r"about \d+ rows fail", "", message)
    assert not re.search(r"\b(600|2000)\b", rest)  # no exact count anywhere else
    assert "DP count" in message and "curator-only" in message
    ledger = Ledger(cfg.store.resolve() / "ledger.db")
    [charged] = ledger.runs("adult")
    assert charged.status == "settled"
    assert len(charged.events) == 1 and isinstance(charged.events[0], LaplaceEvent)
    assert 1.0 / charged.events[0].noise_multiplier == pytest.approx(cfg.privacy.epsilon * cfg.privacy.gate_share)
    report = json.loads(next((cfg.store.resolve() / "curator").glob("*/validation.json")).read_text())
    assert report["failing_rows"] == 600
