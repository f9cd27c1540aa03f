"""The training flow end to end on a slice of real data (Adult), with a tiny model.

Checks what a data owner relies on: the reported epsilon is the composition of the
recorded events (recomputed by an independent accountant), the per-step cumulative
epsilon ends at or under the target, the ledger holds the run, the synthetic table is
valid under the schema, and the registered model samples by alias without the data.
The runs are in process, as `privflow run` makes them by default (tests/flows/test_train_in_process.py
shows the Prefect flow records the same).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import polars as pl
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.data.validation import validate
from privflow.privacy.accounting.accountant import PLDAccountant, PRVAccountant
from privflow.privacy.accounting.events import events_from_json
from privflow.privacy.ledger import Ledger
from tests.data_slices import adult_slice, small_config


@pytest.fixture()
def run(trained_store: dict):
    """The session's shared trained store (tests/stores.py), read only."""
    from types import SimpleNamespace

    from privflow.tasks import mlflow_store

    mlflow_store.tracking(trained_store["store"])
    return trained_store["config"], SimpleNamespace(**trained_store["summary"])


def test_reported_epsilon_is_the_composition_of_recorded_events(run) -> None:
    cfg, summary = run
    assert summary.epsilon <= cfg.privacy.epsilon
    client = MlflowClient()
    path = client.download_artifacts(summary.mlflow_run_id, "privacy/events.json")
    events = events_from_json(Path(path).read_text())
    assert PLDAccountant().epsilon(events, summary.delta) == pytest.approx(summary.epsilon, rel=1e-9)
    # an independent accountant (PRV) agrees within 1%; its absolute error stays well under 1% of
    # epsilon (as in tests/privacy/test_plan.py)
    prv = PRVAccountant(eps_error=min(0.005, 0.004 * summary.epsilon))
    assert prv.epsilon(events, summary.delta) == pytest.approx(summary.epsilon, rel=0.01)
    plan = json.loads(Path(client.download_artifacts(summary.mlflow_run_id, "privacy/plan.json")).read_text())
    assert {s["name"] for s in plan["stages"]} == {"validate", "dp_marginals", "dp_head", "dp_stats", "train", "select"}


def test_cumulative_epsilon_per_step_ends_under_target(run) -> None:
    cfg, summary = run
    history = MlflowClient().get_metric_history(summary.mlflow_run_id, "epsilon_cumulative")
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert len(values) >= 3
    assert values == sorted(values)
    assert values[-1] == pytest.approx(summary.epsilon) and values[-1] <= cfg.privacy.epsilon


def test_ledger_holds_the_run(run) -> None:
    cfg, summary = run
    ledger = Ledger(cfg.store.resolve() / "ledger.db")
    spent, _ = ledger.spent("adult")
    assert spent == pytest.approx(summary.epsilon, rel=1e-6)
    assert [r.status for r in ledger.runs("adult")] == ["settled"]


def test_synthetic_table_is_valid_under_the_schema(run) -> None:
    cfg, summary = run
    synthetic = pl.read_csv(summary.synthetic_path, infer_schema=False)
    schema = Schema.from_yaml(cfg.schema_path)
    assert synthetic.columns == schema.names
    assert synthetic.height == cfg.evaluate.synthetic_rows
    clean, report = validate(synthetic, schema, policy="strict", quarantine_path=None)
    assert clean.height == cfg.evaluate.synthetic_rows


def test_generate_samples_the_registered_model_by_alias(run, store_copy: Path, tmp_path: Path) -> None:
    cfg, summary = run
    out = tmp_path / "gen.parquet"
    # a store moved away from the training data: generate must not need it
    cfg = cfg.model_copy(update={"store": store_copy})
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--model",
            f"{summary.model_name}@champion",
            "-n",
            "123",
            "-o",
            str(out),
            "--store",
            str(cfg.store),
        ],
    )
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    assert frame.height == 123 and frame.columns == Schema.from_yaml(cfg.schema_path).names
    version = MlflowClient().get_model_version_by_alias(summary.model_name, "champion")
    assert str(version.version) == summary.model_version
    assert float(version.tags["epsilon"]) == pytest.approx(summary.epsilon, rel=1e-5)


def test_generate_unknown_alias_is_a_clear_error(run, tmp_path: Path) -> None:
    cfg, summary = run
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--model",
            f"{summary.model_name}@nope",
            "-n",
            "5",
            "-o",
            str(tmp_path / "x.csv"),
            "--store",
            str(cfg.store),
        ],
    )
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in text and "has no alias @nope" in text, text
    assert "its aliases: @champion" in text  # what the model has, as Synthesizer.load and --init-from say


def test_dp_mog_prior_is_planned_spent_and_used_when_enabled(tmp_path: Path, demo_dir: Path, new_store: Path) -> None:
    from privflow.flows.pipeline import train_in_process

    data, schema = adult_slice(tmp_path, demo_dir, 2000)
    cfg = RunConfig.build(
        data=data,
        schema_path=schema,
        store=new_store,
        privacy={"epsilon": 3.0, "delta": 1e-5},
        model={"name": "maf", "blocks": 1, "hidden": 8, "prior": "mog", "mog_components": 3, "mog_iterations": 4},
        train={"epochs": 1, "batch_size": 256, "checkpoint_every": 4},
        evaluate={"synthetic_rows": 200, "utility": False, "privacy_risk": False, "report": False, "fidelity": False},
    )
    summary = train_in_process(cfg, show_progress=False)
    assert set(summary.stages) == {"validate", "dp_marginals", "dp_head", "dp_stats", "dp_prior", "train", "select"}
    assert summary.epsilon <= 3.0
    events = events_from_json(
        Path(MlflowClient().download_artifacts(summary.mlflow_run_id, "privacy/events.json")).read_text()
    )
    assert any(getattr(e, "count", None) == 4 for e in events)  # the 4 DP-EM releases, recorded
    # the registered generator samples from its mixture base without NaN
    model = mlflow.pyfunc.load_model(f"models:/{summary.model_name}/{summary.model_version}")
    frame = model.predict(pl.DataFrame({"n": [50]}).to_pandas())
    assert len(frame) == 50 and frame["age"].notna().all() and frame["age"].between(17, 100).all()


def test_dp_marginals_are_planned_spent_released_and_decoded_through(
    tmp_path: Path, demo_dir: Path, new_store: Path
) -> None:
    """marginals.enabled: one Gaussian release of all column histograms, in the plan and the
    recorded events; the registered model carries the marginals and decodes through them."""
    from privflow.flows.pipeline import train_in_process
    from privflow.privacy.accounting.events import GaussianEvent
    from privflow.tasks.mlflow_store import load_version

    data, schema = adult_slice(tmp_path, demo_dir, 2000)
    cfg = small_config(
        data,
        schema,
        new_store,
        "privflow-adult-marginals",
        3.0,
        marginals={"enabled": True, "share": 0.3, "grid_bins": 64},
        train={"checkpoint_every": 4},
        evaluate={"synthetic_rows": 400},
    )
    summary = train_in_process(cfg, show_progress=False)
    assert "dp_marginals" in summary.stages and summary.epsilon <= 3.0
    events = events_from_json(
        Path(MlflowClient().download_artifacts(summary.mlflow_run_id, "privacy/events.json")).read_text()
    )
    assert sum(isinstance(e, GaussianEvent) for e in events) == 2  # dp_stats and dp_marginals
    loaded = load_version(summary.model_name, summary.model_version)
    assert loaded.marginals is not None
    assert set(loaded.marginals["probs"]) == {*Schema.from_yaml(schema).names, "(missing)"}  # and the missing pattern
    # the synthetic table's categories and integers come only from cells with released mass
    synthetic = pl.read_csv(summary.synthetic_path, infer_schema=False)
    clean, _ = validate(synthetic, Schema.from_yaml(schema), policy="strict", quarantine_path=None)
    assert clean.height == 400
    frame = mlflow.pyfunc.load_model(f"models:/{summary.model_name}/{summary.model_version}").predict(
        pl.DataFrame({"n": [30]}).to_pandas()
    )
    assert len(frame) == 30 and frame["age"].between(17, 100).all()


def test_a_table_too_small_for_dp_sgd_releases_the_independent_copula(
    tmp_path: Path, demo_dir: Path, new_store: Path
) -> None:
    """With DP marginals, a plan whose DP-SGD would get too small an effective batch trains no
    flow: the marginals take its budget, the release is the independent copula, and the summary,
    the CLI and the registered version say so."""
    from privflow.flows.pipeline import train_in_process
    from privflow.privacy.accounting.events import GaussianEvent, LaplaceEvent, PoissonGaussianEvent

    data, schema = adult_slice(tmp_path, demo_dir, 1500)
    cfg = RunConfig.build(
        data=data,
        schema_path=schema,
        store=new_store,
        model_name="privflow-adult-small",
        privacy={"epsilon": 1.0, "delta": 1e-5},
        marginals={"enabled": True},
        model={"name": "maf", "blocks": 1, "hidden": 8},
        train={"batch_size": 64, "min_effective_batch": 1e6},
        evaluate={"synthetic_rows": 600, "utility": False, "privacy_risk": False, "report": False},
    )
    summary = train_in_process(cfg, show_progress=False)
    assert list(summary.stages) == ["validate", "dp_head", "dp_marginals"]
    assert 0.98 <= summary.epsilon <= 1.0  # the marginals took what the gate and the head left
    events = events_from_json(
        Path(MlflowClient().download_artifacts(summary.mlflow_run_id, "privacy/events.json")).read_text()
    )
    assert [type(e) for e in events] == [LaplaceEvent, GaussianEvent, PoissonGaussianEvent]  # spent in this order
    assert summary.release_note and "No flow was trained" in summary.release_note
    assert "the target 'income' from the DP target head" in summary.release_note
    version = MlflowClient().get_model_version(summary.model_name, summary.model_version)
    assert version.tags["release"] == "independent-copula"
    synthetic = pl.read_csv(summary.synthetic_path, infer_schema=False)
    clean, _ = validate(synthetic, Schema.from_yaml(schema), policy="strict", quarantine_path=None)
    assert clean.height == 600


def test_a_test_file_whose_rows_all_fail_skips_its_diagnostics_and_keeps_the_release(
    tmp_path: Path, demo_dir: Path, new_store: Path
) -> None:
    """Diagnostics come after the release: a --test-data file none of whose rows pass its checks
    used to end the run with a validation error after the budget was spent and before the model
    was registered. Now the curator is told and the release stands."""
    from privflow.flows.pipeline import train_in_process

    data, schema = adult_slice(tmp_path, demo_dir, 1500)
    test = tmp_path / "bad_test.csv"
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=50).with_columns(
        pl.lit("500").alias("age")
    ).write_csv(test)
    cfg = small_config(
        data,
        schema,
        new_store,
        "privflow-adult-badtest",
        1.0,
        train={"min_effective_batch": 0},
        evaluate={"test_data": test},
    )
    summary = train_in_process(cfg, show_progress=False)
    assert summary.model_version and Path(summary.synthetic_path).is_file()
    assert summary.diagnostics_note and "--test-data was not used" in summary.diagnostics_note
    assert (Path(summary.curator_dir) / "diagnostics_notes.json").is_file()
    version = MlflowClient().get_model_version(summary.model_name, summary.model_version)
    assert "--test-data" not in json.dumps(dict(version.tags))  # a curator-only note: never released


def test_a_crash_in_the_diagnostics_changes_nothing_released(
    tmp_path: Path, demo_dir: Path, monkeypatch: pytest.MonkeyPatch, new_store: Path
) -> None:
    """Registration does not wait on the curator-only diagnostics: a crash there that no handler
    sees (a memory kill, a native fault; here an exception no `except Exception` catches) leaves
    the version registered, its alias set and the ledger settled, as a clean run would."""
    from privflow.flows import pipeline

    class Crash(BaseException):
        pass

    def crash(*args: object, **kwargs: object) -> None:
        raise Crash

    monkeypatch.setattr(pipeline, "_diagnose", crash)
    data, schema = adult_slice(tmp_path, demo_dir, 1500)
    cfg = small_config(data, schema, new_store, "privflow-adult-crash", 1.0, train={"min_effective_batch": 0})
    with pytest.raises(Crash):
        pipeline.train_in_process(cfg, show_progress=False)
    client = MlflowClient()
    (version,) = client.search_model_versions("name='privflow-adult-crash'")
    assert client.get_model_version_by_alias("privflow-adult-crash", cfg.alias).version == version.version
    runs = Ledger(tmp_path / "store" / "ledger.db").runs("adult")
    assert [r.status for r in runs] == ["settled"]
    assert list((tmp_path / "store" / "synthetic").glob("adult-*.csv"))
