"""The scoring flow (flows/score.py) called as a plain function (no Prefect server), and its
deployment's trigger (infra/deployments.py): a new file is scored beside itself, its public
settings go to MLflow's `privflow-scoring` experiment, its exact counts (operator-only) to the
curator store, and nothing is charged."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from privflow.core.errors import DataError
from privflow.data.codec import Codec
from privflow.data.schema import Schema
from privflow.flows import score as score_flow
from privflow.models import build_flow
from privflow.serving.release import Release

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def released(monkeypatch, demo_dir: Path) -> Release:
    """A stand-in for a registered version (an untrained flow under the Adult schema): the
    flow under test loads it through `load_model`, which is patched to return it."""
    import torch

    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    torch.manual_seed(0)
    flow = build_flow("maf", Codec.from_schema(schema).cardinalities, blocks=1, hidden=8).eval()
    loaded = Release(schema, [flow], version="3")
    monkeypatch.setattr(score_flow, "load_model", lambda spec, store: ("privflow-adult", loaded))
    return loaded


def _drop(folder: Path, demo_dir: Path, name: str = "batch-001.csv", rows: int = 60) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=rows).write_csv(path)
    return path


def test_a_new_file_is_scored_beside_itself_and_counted_for_the_operator_only(
    tmp_path: Path, demo_dir: Path, released: Release, caplog, new_store: Path
) -> None:
    import logging

    from mlflow import MlflowClient

    caplog.set_level(logging.INFO, logger=score_flow.__name__)

    store = new_store  # its MLflow database made (tests/conftest.py)
    path = _drop(tmp_path / "incoming", demo_dir)
    result = score_flow.score_new_file.fn(str(path), "privflow-adult@champion", -25.0, str(store))
    out = Path(result["output_path"])
    assert out == tmp_path / "incoming" / "scored" / "batch-001.scored.csv"
    scored = pl.read_csv(out)
    assert scored.columns == [*pl.read_csv(path, infer_schema=False).columns, "loglik", "anomaly"]
    assert scored.height == result["rows"] == 60
    assert (scored["anomaly"] == (scored["loglik"] < -25.0)).all()
    assert int(scored["anomaly"].sum()) == result["flagged"]
    assert result["version"] == "3" and result["threshold"] == -25.0

    client = MlflowClient()
    exp = client.get_experiment_by_name(score_flow.EXPERIMENT)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.experiment_id == exp.experiment_id and run.info.status == "FINISHED"
    # exact counts of the file's rows are not DP: none in MLflow, which a deployment shares
    assert run.data.metrics == {}
    report = Path(result["curator_report"])
    assert run.data.params["curator_report"] == str(report) and report.parent.parent == (store / "curator").resolve()
    counts = json.loads(report.read_text())
    assert counts["rows_scored"] == 60 and counts["rows_flagged"] == result["flagged"]
    assert counts["label"].startswith("CURATOR ONLY")
    (said,) = [r.getMessage() for r in caplog.records if r.name == score_flow.__name__]
    assert "60 rows" not in said and "flagged" not in said and str(report) in said
    assert run.data.params["model_version"] == "3" and run.data.params["data_file"] == "batch-001.csv"
    assert run.data.tags["privflow.not_dp"] == score_flow.NOT_DP
    assert client.list_artifacts(run.info.run_id) == []  # the scored rows stay in the operator's folder
    assert not (store / "ledger.db").exists()  # public threshold: nothing charged


def test_failing_rows_are_kept_with_an_empty_score_and_counted_for_the_operator_only(
    tmp_path: Path, demo_dir: Path, released: Release, caplog, new_store: Path
) -> None:
    """Scoring is total: a line the reader cannot read and a row past a public bound stay in
    their places with an empty score; their count and the rows go to the curator store, never
    to the flow's log or MLflow, and the run does not stop on them."""
    import logging

    from mlflow import MlflowClient

    caplog.set_level(logging.INFO, logger=score_flow.__name__)
    store = new_store  # its MLflow database made (tests/conftest.py)
    path = _drop(tmp_path / "incoming", demo_dir, rows=20)
    lines = path.read_bytes().split(b"\n")
    lines[3] += b",extra"  # data row 2: a field too many
    lines[6] = b"999" + lines[6][lines[6].index(b",") :]  # data row 5: an age past the public bounds
    path.write_bytes(b"\n".join(lines))
    result = score_flow.score_new_file.fn(str(path), "privflow-adult@champion", -25.0, str(store))
    scored = pl.read_csv(result["output_path"], infer_schema=False)
    assert scored.height == 20 and scored["loglik"].is_null().arg_true().to_list() == [2, 5]
    assert scored["anomaly"].is_null().arg_true().to_list() == [2, 5]
    assert "_privflow_unreadable" not in scored.columns and scored["age"][5] == "999"
    assert result["rows"] == 18 and result["unscored"] == 2
    report = Path(result["curator_report"])
    counts = json.loads(report.read_text())
    assert counts["rows_scored"] == 18 and counts["rows_unscored"] == 2 and counts["validation"]["failing_rows"] == 2
    quarantine = report.parent / score_flow.QUARANTINE
    assert pl.read_csv(quarantine)["_privflow_row"].to_list() == [2, 5]
    run = MlflowClient().get_run(result["mlflow_run_id"])
    assert run.data.metrics == {}  # public settings only: no count of any kind
    assert set(run.data.params) == {"model", "model_version", "threshold", "data_file", "output_path", "curator_report"}
    (said,) = [r.getMessage() for r in caplog.records if r.name == score_flow.__name__]
    said = said.replace(str(report), "<report>").replace(str(tmp_path), "<tmp>")  # paths and ids hold digits
    assert "18" not in said and "unscored" not in said


def test_parquet_input_and_an_output_folder(tmp_path: Path, demo_dir: Path, released: Release, new_store: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    src = pl.read_csv(demo_dir / "adult_test.csv", n_rows=20)  # numbers typed, as a Parquet file holds them
    path = folder / "b.parquet"
    src.write_parquet(path)
    result = score_flow.score_new_file.fn(str(path), "m@champion", 0.0, str(new_store), str(tmp_path / "out"))
    assert Path(result["output_path"]) == tmp_path / "out" / "b.scored.parquet"
    assert pl.read_parquet(result["output_path"]).height == 20


def test_a_file_of_another_table_reads_no_row_and_writes_nothing(
    tmp_path: Path, demo_dir: Path, released: Release
) -> None:
    path = tmp_path / "incoming" / "wrong.csv"
    path.parent.mkdir()
    pl.DataFrame({"x": [1, 2]}).write_csv(path)
    with pytest.raises(DataError, match="does not match the schema"):
        score_flow.score_new_file.fn(str(path), "m@champion", -10.0, str(tmp_path / "s"))
    assert not (tmp_path / "incoming" / "scored").exists()


def test_scoring_deployment_is_triggered_by_its_own_folder(tmp_path: Path, monkeypatch) -> None:
    from infra.deployments import EVENT, FOLDER_LABEL, ScoreSite, Site, deployments, score_deployments

    site = Site.from_env(
        schema=ROOT / "src" / "privflow" / "demo" / "adult.yaml",
        watch_folder=tmp_path / "in",
        store=tmp_path / "store",
        train_data=ROOT / "src" / "privflow" / "demo" / "adult_train.csv",
    )
    monkeypatch.delenv("PRIVFLOW_SCORE_DIR", raising=False)
    assert score_deployments(site, {}) == [] and len(deployments(site)) == 2

    monkeypatch.setenv("PRIVFLOW_SCORE_DIR", str(tmp_path / "to-score"))
    monkeypatch.setenv("PRIVFLOW_SCORE_THRESHOLD", "-15")
    monkeypatch.setenv("PRIVFLOW_SCORE_MODEL", "privflow-adult@champion")
    *_, dep = deployments(site)
    assert (dep.flow_name, dep.name, dep.entrypoint) == (
        "privflow-score",
        "score-new-file",
        "privflow.flows.score.score_new_file",
    )
    assert dep.parameters == {"model": "privflow-adult@champion", "threshold": -15.0, "store": str(site.store)}
    (trigger,) = dep.triggers
    assert trigger.expect == {EVENT} and trigger.match.root == {FOLDER_LABEL: str(tmp_path / "to-score")}
    assert trigger.parameters == {"data_path": "{{ event.resource.id }}"}

    with pytest.raises(ValueError, match="its own folder"):
        score_deployments(site, {}, ScoreSite(site.watch_folder, "m@a", 0.0))
    monkeypatch.delenv("PRIVFLOW_SCORE_THRESHOLD")
    with pytest.raises(ValueError, match="PRIVFLOW_SCORE_THRESHOLD"):
        ScoreSite.from_env()
