"""Retraining on new data: the flow a `privflow.data.arrived` event starts (infra/deployments.py).

    pre-flight (no row read) -> check the ledger with the promotion (no row read) -> train_pipeline
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

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.runtime import flow_run
from prefect.states import Failed, State

from privflow.core.config import RunConfig
from privflow.core.errors import BudgetExceeded
from privflow.data.schema import Schema
from privflow.flows.steps import PREFECT
from privflow.flows.train import train_pipeline
from privflow.preflight import preflight
from privflow.privacy.accounting.events import Event
from privflow.privacy.ledger import Ledger
from privflow.tasks import mlflow_store
from privflow.tasks.promote import PromotionSettings, promote_if_better

REFUSED = "refused"


@dataclass(frozen=True)
class BudgetCheck:
    """Whether the run fits what is left of the dataset's budget (computed from public values)."""

    fits: bool
    message: str


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


def _refused(config: RunConfig, schema: Schema, data_path: str, message: str) -> State:
    """A refusal before any row is read: recorded next to the dataset's runs, logged, and the
    flow run's Failed state."""
    record_refusal(config, schema, data_path, message)
    get_run_logger().warning(message)
    return Failed(message=message)


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
    # the CLI's pre-flight, before anything is read or reserved: the file (its format, header and
    # row count; no value), the privacy parameters against the schema's budget, the store, the
    # device, a warm start's parent and the plan against what is left of the budget
    data_path = str(Path(data_path).expanduser().resolve())
    # exclude_unset: a `promotion` the config did not set stays unset, so pre-flight applies the schema's
    config = RunConfig.build(**{**config.model_dump(exclude_unset=True), "data": data_path})
    try:
        checked = preflight(config)
    except BudgetExceeded as exc:  # the run alone does not fit
        return _refused(config, schema, data_path, str(exc))
    for note in checked.notes:
        log.warning(note)
    # the promotion setting as pre-flight resolved it (the config's, else the schema's
    # dataset.promotion): only if_better compares here; always and never are the registry's
    promotion = checked.config.promotion
    config = candidate_config(checked.config) if promotion == "if_better" else checked.config
    store_dir = Path(config.store).resolve()
    ledger_path = str(store_dir / "ledger.db")

    # Before any row is read: does the training plan, plus the comparison if a champion
    # exists, fit what is left of the dataset's budget?
    mlflow_store.tracking(store_dir)
    model_name = config.model_name or f"privflow-{schema.dataset.name}"
    holder = mlflow_store.alias_holder(MlflowClient(), model_name, champion_alias)
    compare = promotion == "if_better" and holder is not None
    assert checked.plan is not None  # `preflight` plans every private run (only pretraining's has none)
    events = [*checked.plan.events, *([settings.event()] if compare else [])]
    budget = check_budget(ledger_path, schema, events)
    if not budget.fits:
        return _refused(config, schema, data_path, budget.message)

    try:
        summary = train_pipeline(config, show_progress=False)
    except BudgetExceeded as exc:  # another run took the budget since the check
        return _refused(config, schema, data_path, str(exc))
    log.info("registered %s version %s (epsilon=%.4f)", summary.model_name, summary.model_version, summary.epsilon)

    if promotion != "if_better":  # the registry step applied it; nothing compared, nothing spent
        promoted = promotion == "always"
        reason = f"promotion: {promotion}: " + (
            f"'{champion_alias}' moved without a comparison" if promoted else f"'{champion_alias}' not moved"
        )
        log.info("promotion of version %s: %s", summary.model_version, reason)
        champion_before, promotion_spent = holder, None
    else:
        promotion_id = f"{flow_run.id or uuid.uuid4()}:promote"
        decision = PREFECT(  # a task run, retried with a fresh ledger reservation per attempt
            promote_if_better,
            summary.model_name,
            summary.model_version,
            config,
            settings,
            ledger_path,
            promotion_id,
            PREFECT.attempt,
        )
        log.info("promotion of version %s: %s", summary.model_version, decision.reason)
        promoted, reason = decision.promoted, decision.reason
        champion_before, promotion_spent = decision.champion_version, decision.epsilon
    return {
        "model_name": summary.model_name,
        "model_version": summary.model_version,
        "promoted": promoted,
        "reason": reason,
        "champion_before": champion_before,
        "epsilon": summary.epsilon,  # the version's: its private lineage composed
        "run_epsilon": summary.epsilon_run,  # this run alone
        "promotion_epsilon": promotion_spent,
        "mlflow_run_id": summary.mlflow_run_id,
        "data_path": data_path,
        "wall_seconds": time.monotonic() - started,
    }


__all__ = [
    "BudgetCheck",
    "REFUSED",
    "candidate_config",
    "check_budget",
    "load_config",
    "record_refusal",
    "retrain_on_new_data",
]
