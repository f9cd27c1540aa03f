"""Scoring each new file: the flow a `privflow.data.arrived` event starts (infra/deployments.py,
`privflow-score/score-new-file`), the likelihood thresholding of DP-NF section 5.

    header check (no row read) -> log-likelihood of every row under the released model
    (total: a row that fails the schema's checks is kept with an empty score)
    -> anomaly = loglik < a PUBLIC threshold -> <folder>/scored/<name>.scored.<ext>
    -> the run's public settings to MLflow, its counts (and failing rows) to the curator-only store

Privacy: scoring under a registered (released) model is post-processing of that release, and a
public threshold is public: the flow spends nothing and writes nothing to the ledger (the
`privflow score` logic, tasks/score.py). A DP threshold is a release of its own: buy it once
with `privflow score --fpr q --reference REF.csv --epsilon E` (charged then, once) and pass the
printed value here; every file after that is free.

The scored file goes to a `scored/` folder beside the input, not into the watched folder
itself: the watcher does not descend into folders, so the output is never announced as new
data (which would score it again, forever). The MLflow run (experiment `privflow-scoring`, never
a dataset's experiment and never behind a registered model) holds public settings only: the
model version, the threshold, the file's name and where its outputs went. The rows scored and
flagged are exact counts of the operator's file, not differentially private: they are
operator-only, written to `<store>/curator/scoring-<MLflow run id>/scoring.json` (privacy rules
5 and 8) and to neither MLflow nor the flow run's log, which a deployment shares; so are the
rows that failed the schema's checks (`quarantine.csv` there), which never stop the run.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Param
from prefect import flow, get_run_logger

from privflow.core.curator import curator_dir, write_json
from privflow.core.errors import ConfigError
from privflow.data.io import write_table
from privflow.preflight import check_table
from privflow.tasks import mlflow_store
from privflow.tasks.score import load_model, score_table

EXPERIMENT = "privflow-scoring"
SCORED_FOLDER = "scored"
NOT_DP = (
    "public settings only; the scored file's row counts (not differentially private) are operator-only, "
    "in the curator store: see the curator_report parameter"
)
REPORT = "scoring.json"  # in <store>/curator/scoring-<run id>/: the counts, for the operator only
QUARANTINE = "quarantine.csv"  # beside it: the rows that failed the schema's checks (empty scores)


@dataclass(frozen=True)
class ScoredFile:
    """What one run scored and where it went."""

    data_path: str
    output_path: str
    model: str
    version: str
    threshold: float
    rows: int  # operator-only (not DP): in the curator report and this return value, never in MLflow
    flagged: int  # operator-only, likewise
    mlflow_run_id: str
    curator_report: str = ""
    unscored: int = 0  # operator-only: rows that failed the schema's checks (kept, with an empty score)


def scored_path(data_path: Path, out_dir: Path | None = None) -> Path:
    """`<folder>/scored/<stem>.scored.csv` (or `.parquet` for a Parquet input)."""
    suffix = ".csv" if data_path.suffix.lower() == ".csv" else ".parquet"
    folder = out_dir if out_dir is not None else data_path.parent / SCORED_FOLDER
    return folder / f"{data_path.stem}.scored{suffix}"


def _log() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - called as a plain function (tests, scripts): no flow run
        return logging.getLogger(__name__)


def log_scoring_run(
    store: Path, result: ScoredFile, dataset: str, quarantine: Path | None = None, validation: dict | None = None
) -> tuple[str, Path]:
    """One MLflow run in `privflow-scoring` with the run's public parameters (no metric, no
    artifact: the scored rows stay in the operator's folder), and the curator-only report of
    its counts (with the `quarantine` file of failing rows moved beside it, and the exact
    `validation` report): (MLflow run id, report path)."""
    mlflow_store.tracking(store)
    client = MlflowClient()
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        remote = mlflow.get_tracking_uri().startswith(("http://", "https://"))
        location = None if remote else (store.resolve() / "artifacts").as_uri()
        exp_id = client.create_experiment(EXPERIMENT, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    run = client.create_run(
        exp_id,
        run_name=f"score {Path(result.data_path).name}",
        tags={"privflow.kind": "scoring", "privflow.dataset": dataset, "privflow.not_dp": NOT_DP},
    )
    rid = run.info.run_id
    folder = curator_dir(store.resolve(), f"scoring-{rid}")
    if quarantine is not None and quarantine.exists():
        shutil.move(str(quarantine), folder / QUARANTINE)
    report = write_json(
        folder,
        REPORT,
        {
            "mlflow_run_id": rid,
            "data_path": result.data_path,
            "output_path": result.output_path,
            "rows_scored": result.rows,
            "rows_unscored": result.unscored,
            "rows_flagged": result.flagged,
            "flagged_share": result.flagged / result.rows if result.rows else 0.0,
            "validation": validation or {},
        },
    )
    params = {
        "model": result.model,
        "model_version": result.version,
        "threshold": f"{result.threshold:g}",
        "data_file": Path(result.data_path).name,
        "output_path": result.output_path,
        "curator_report": str(report),
    }
    client.log_batch(rid, params=[Param(k, v) for k, v in params.items()])
    client.set_terminated(rid)
    return rid, report


@flow(name="privflow-score", persist_result=False)  # the return value holds operator-only counts
def score_new_file(
    data_path: str, model: str, threshold: float, store: str = ".privflow", out_dir: str | None = None
) -> dict[str, Any]:
    """Score one new file under a released model with a public threshold; write it beside the
    input (`scored/`), its counts to the curator-only store. Spends no privacy (DP-NF section 5: likelihood
    thresholding is post-processing of the DP model). Total over rows: a row that fails the
    schema's checks is kept with an empty score and counted for the operator only."""
    log = _log()
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise ConfigError(f"The scoring threshold must be a number (nats), got {threshold!r}.") from None
    if t != t or t in (float("inf"), float("-inf")):
        raise ConfigError(f"The scoring threshold must be a finite number (nats), got {threshold!r}.")
    root = Path(store).expanduser().resolve()
    name, loaded = load_model(model, root)
    path = Path(data_path).expanduser().resolve()
    check_table(path, loaded.schema, "New data file")  # format and header only: a wrong file reads no row
    out = scored_path(path, Path(out_dir).expanduser().resolve() if out_dir else None)
    with tempfile.TemporaryDirectory(prefix="privflow-score-") as tmp:  # owner-only until moved to the curator
        quarantine = Path(tmp) / QUARANTINE
        scored = score_table(loaded, path, t, quarantine)
        write_table(scored.table, out)
        rows = scored.table.height
        result = ScoredFile(
            str(path), str(out), name, str(loaded.version), t, rows - scored.unscored, scored.flagged, "",
            unscored=scored.unscored,
        )  # fmt: skip
        rid, report = log_scoring_run(root, result, loaded.schema.dataset.name, quarantine, scored.report.to_dict())
    result = ScoredFile(**{**asdict(result), "mlflow_run_id": rid, "curator_report": str(report)})
    log.info(  # no count: the flow run's log is shared with whoever sees the deployment
        "scored %s under %s v%s (anomaly: loglik < %g); wrote %s; counts (operator-only) in %s; no privacy spent",
        path.name,
        name,
        loaded.version,
        t,
        out,
        report,
    )
    return asdict(result)


__all__ = [
    "EXPERIMENT",
    "QUARANTINE",
    "REPORT",
    "SCORED_FOLDER",
    "ScoredFile",
    "log_scoring_run",
    "score_new_file",
    "scored_path",
]
