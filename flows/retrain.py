"""Retraining on new data: the flow a `privflow.data.arrived` event starts (infra/deployments.py).

    check the file (no row read) -> check the ledger (no row read) -> train_pipeline
    (validate, plan + reserve, mechanisms, register a version WITHOUT moving the champion)
    -> promote (a DP comparison with the champion, its cost reserved in the ledger first)

A run the dataset's budget cannot hold is refused before any row is read: the flow run ends
Failed with a message that says so, and a tagged MLflow run (`privflow.outcome=refused`)
records the refusal next to the dataset's other runs.

Retries: this flow has none. A retry would rerun the training subflow as a new flow run (a
new ledger reservation, another registered version); an operator reruns it deliberately
instead. The registry task retries (it spends no privacy) and the promotion task retries
with a fresh ledger reservation per attempt (tasks/promote.py).
"""

from __future__ import annotations

import csv
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl
from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.runtime import flow_run
from prefect.states import Failed, State

from privflow.config import RunConfig
from privflow.errors import BudgetExceeded, DataError
from privflow.flows.train import train_pipeline
from privflow.io import TABLE_SUFFIXES
from privflow.privacy.events import Event
from privflow.privacy.ledger import Ledger
from privflow.schema import Schema
from privflow.tasks import mlflow_store
from privflow.tasks.plan import plan_privacy
from privflow.tasks.promote import PromotionSettings, promote_if_better

REFUSED = "refused"


@dataclass(frozen=True)
class BudgetCheck:
    """Whether the run fits what is left of the dataset's budget (computed from public values)."""

    fits: bool
    message: str


def _header(path: Path) -> list[str]:
    """Column names only: the first line of a CSV, the schema of a Parquet file."""
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as fh:
            return next(csv.reader(fh), [])
    return list(pl.read_parquet_schema(path))


@task(name="check-new-file")
def check_new_file(data_path: str, schema: Schema) -> str:
    """Refuse a file that cannot be this dataset, reading its header only (no row).

    The full validation (Great Expectations suite) runs inside the training flow, after the
    ledger reservation, like every read of the rows.
    """
    path = Path(data_path).expanduser().resolve()
    if not path.is_file():
        raise DataError(f"New data file '{path}' does not exist or is not a regular file.")
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise DataError(f"New data file '{path}' is neither CSV (.csv) nor Parquet (.parquet, .pq).")
    if path.stat().st_size == 0:
        raise DataError(f"New data file '{path}' is empty.")
    try:
        header = _header(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same user error
        raise DataError(f"New data file '{path}' has no readable header ({type(exc).__name__}: {exc}).") from None
    expected = [c.name for c in schema.columns]
    missing = [c for c in expected if c not in header]
    extra = [c for c in header if c not in expected]
    if missing or extra:
        raise DataError(
            f"New data file '{path}' does not match the schema of dataset '{schema.dataset.name}': "
            + (f"missing column(s) {', '.join(missing)}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"unexpected column(s) {', '.join(extra)}" if extra else "")
            + ". Nothing was read from its rows and nothing was spent."
        )
    return str(path)


@task(name="check-budget")
def check_budget(ledger_path: str, schema: Schema, events: list[Event]) -> BudgetCheck:
    """The ledger's own check (`Ledger.check`, as pre-flight and `reserve` use it) of this run's
    planned events against what is left of the dataset's budget; reserves nothing."""
    budget = schema.dataset.budget
    try:
        Ledger(ledger_path).check(
            schema.dataset.name,
            list(events),
            (budget.epsilon, budget.delta),
            who=f"Retraining on dataset '{schema.dataset.name}' (training and promotion)",
        )
    except BudgetExceeded as exc:
        return BudgetCheck(False, str(exc))
    return BudgetCheck(True, "fits")


def record_refusal(config: RunConfig, schema: Schema, data_path: str, message: str) -> str:
    """A tagged MLflow run in the dataset's experiment saying the run was refused, and why."""
    store = Path(config.store).resolve()
    mlflow_store.tracking(store)
    mlflow_store.experiment_for(schema.dataset.name, store)
    tags = {
        "privflow.outcome": REFUSED,
        "privflow.refusal": message,
        "privflow.dataset": schema.dataset.name,
        "privflow.data_path": data_path,
        "privflow.run_id": str(flow_run.id or ""),
        "privflow.trigger": "retrain",
    }
    params = {"privacy.epsilon": config.privacy.epsilon, "privacy.delta": config.privacy.delta}
    return mlflow_store.log_refusal(f"{schema.dataset.name}-refused", tags, params)


def load_config(data_path: str, schema_path: str, config_path: str | None, store: str) -> RunConfig:
    """The run configuration for this file: the YAML (if any) with data, schema and store set.

    `alias` names the champion alias that the promotion step may move.
    """
    overrides: dict[str, Any] = {"data": data_path, "schema_path": schema_path, "store": store}
    if config_path:
        config = RunConfig.from_yaml(config_path, **overrides)
    else:
        config = RunConfig.build(**overrides)
    return config


def candidate_config(config: RunConfig) -> RunConfig:
    """The same run, registering its version without touching any alias (`promotion: never`)."""
    return RunConfig.build(**{**config.model_dump(), "promotion": "never"})


@flow(name="privflow-retrain", retries=0)
def retrain_on_new_data(
    data_path: str,
    schema_path: str,
    config_path: str | None = None,
    store: str = ".privflow",
    promotion_epsilon: float = 0.05,
    promotion_mechanism: Literal["laplace", "gaussian"] = "laplace",
) -> dict[str, Any] | State:
    """Validate, check the ledger, train and register a version, then decide its promotion."""
    started = time.monotonic()
    log = get_run_logger()
    schema = Schema.from_yaml(schema_path)
    config = load_config(data_path, schema_path, config_path, store)
    champion_alias = config.alias
    settings = PromotionSettings(epsilon=promotion_epsilon, mechanism=promotion_mechanism, alias=champion_alias)
    data_path = check_new_file(data_path, schema)
    config = candidate_config(RunConfig.build(**{**config.model_dump(), "data": data_path}))
    store_dir = Path(config.store).resolve()
    ledger_path = str(store_dir / "ledger.db")

    # Before any row is read: does the training plan, plus the comparison if a champion
    # exists, fit what is left of the dataset's budget?
    mlflow_store.tracking(store_dir)
    model_name = config.model_name or f"privflow-{schema.dataset.name}"
    has_champion = mlflow_store.alias_holder(MlflowClient(), model_name, champion_alias) is not None
    plan = plan_privacy(config, schema)
    events = [*plan.events, *([settings.event()] if has_champion else [])]
    budget = check_budget(ledger_path, schema, events)
    if not budget.fits:
        record_refusal(config, schema, data_path, budget.message)
        log.warning(budget.message)
        return Failed(message=budget.message)

    try:
        summary = train_pipeline(config, show_progress=False)
    except BudgetExceeded as exc:  # another run took the budget since the check
        record_refusal(config, schema, data_path, str(exc))
        log.warning(str(exc))
        return Failed(message=str(exc))
    log.info("registered %s version %s (epsilon=%.4f)", summary.model_name, summary.model_version, summary.epsilon)

    promotion_id = f"{flow_run.id or uuid.uuid4()}:promote"
    decision = promote_if_better(summary.model_name, summary.model_version, config, settings, ledger_path, promotion_id)
    log.info("promotion of version %s: %s", summary.model_version, decision.reason)
    return {
        "model_name": summary.model_name,
        "model_version": summary.model_version,
        "promoted": decision.promoted,
        "reason": decision.reason,
        "champion_before": decision.champion_version,
        "run_epsilon": summary.epsilon,
        "promotion_epsilon": decision.epsilon,
        "mlflow_run_id": summary.mlflow_run_id,
        "data_path": data_path,
        "wall_seconds": time.monotonic() - started,
    }


__all__ = [
    "BudgetCheck",
    "REFUSED",
    "candidate_config",
    "check_budget",
    "check_new_file",
    "load_config",
    "record_refusal",
    "retrain_on_new_data",
]
