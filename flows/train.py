"""The training pipeline: validated table in, DP flow trained, checkpoint chosen, model and
cumulative epsilon in MLflow (ARCHITECTURE.md, "Data flow of the training pipeline").

Privacy bookkeeping: the plan is made and the dataset's ledger reserves its events before
any row is read; the run settles with the events actually spent; a run that fails after a
mechanism ran keeps its reservation counted. The reported epsilon is the PLD composition
of the run's recorded events, and nothing else.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from prefect import flow
from prefect.runtime import flow_run

from models import build_flow
from privacy.accountant import PLDAccountant, RDPAccountant
from privacy.events import Event, PoissonGaussianEvent, events_to_json
from privacy.ledger import Ledger
from privacy.mechanisms import report_noisy_max
from privflow.codec import Codec
from privflow.config import RunConfig
from privflow.io import fingerprint, read_table
from privflow.sampler import sample_rows
from privflow.schema import Schema
from privflow.validation import validate
from tasks.dp_prior import dp_prior
from tasks.dp_stats import dp_statistics
from tasks.encode import encode_rows
from tasks.evaluate import evaluate_run
from tasks.plan import plan_privacy
from tasks.register import experiment_for, register_model, tracking
from tasks.select import per_pick_epsilon, select_checkpoints
from tasks.train import cpu_threads, settings_for, train_flow_model
from tasks.validate import validate_data


@dataclass(frozen=True)
class RunSummary:
    """What a run produced, as the CLI prints it and Python callers receive it."""

    run_id: str
    mlflow_run_id: str
    model_name: str
    model_version: str
    alias: str
    epsilon: float
    delta: float
    epsilon_rdp: float
    dataset_epsilon: float
    stages: dict[str, float]
    synthetic_path: str
    report_path: str | None
    metrics: dict[str, float]
    rows_quarantined: int
    wall_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _flat_params(config: RunConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section, values in config.model_dump(mode="json").items():
        if isinstance(values, dict):
            out.update({f"{section}.{k}": v for k, v in values.items()})
        else:
            out[section] = values
    return out


def _cumulative_epsilon(before: list[Event], sgd: PoissonGaussianEvent, steps: list[int], delta: float) -> list[float]:
    pld = PLDAccountant()
    return [
        pld.epsilon([*before, PoissonGaussianEvent(sgd.sample_rate, sgd.noise_multiplier, t)], delta) for t in steps
    ]


@flow(name="privflow-train")
def train_pipeline(config: RunConfig, show_progress: bool = True) -> RunSummary:
    """Run the whole chain once; raises a PrivflowError subclass on bad input or budget."""
    started = time.monotonic()
    schema = Schema.from_yaml(config.schema_path)
    store = config.store.resolve()
    tracking(store)
    experiment_for(schema.dataset.name, store)
    model_name = config.model_name or f"privflow-{schema.dataset.name}"
    # One ledger entry per attempt: a retried flow run that reruns the mechanisms spends
    # again and is counted again; an attempt that read nothing releases its reservation.
    run_id = f"{flow_run.id or uuid.uuid4()}-attempt{flow_run.run_count or 1}"

    # 1. Plan and reserve: public inputs only, before any row is read.
    plan = plan_privacy(config, schema)
    ledger = Ledger(store / "ledger.db")
    budget = schema.dataset.budget
    notes = ledger.ensure_dataset(schema.dataset.name, budget.epsilon, budget.delta, None)
    stages = {s.name: f"eps {s.epsilon_alone:.4g} alone" for s in plan.stages}
    ledger.reserve(schema.dataset.name, run_id, plan.events, stages)

    # From here on, any failure settles the reservation: released if no mechanism ran,
    # kept (abandoned) if one did.
    mechanism_ran = False
    try:
        # The content fingerprint is taken only once the reservation stands.
        data_fingerprint = fingerprint(config.data)
        notes += ledger.ensure_dataset(schema.dataset.name, budget.epsilon, budget.delta, data_fingerprint)
        run_dir = store / "runs" / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        run_name = f"{schema.dataset.name}-eps{config.privacy.epsilon:g}"
        with cpu_threads(config.train.threads), mlflow.start_run(run_name=run_name) as active:
            mlflow.log_params(_flat_params(config))
            mlflow.set_tags(
                {
                    "privflow.run_id": run_id,
                    "privflow.dataset": schema.dataset.name,
                    "privflow.data_fingerprint": data_fingerprint,
                    **({"privflow.ledger_notes": " | ".join(notes)} if notes else {}),
                }
            )
            mlflow.log_dict(plan.to_dict(), "privacy/plan.json")
            mlflow.log_metrics({f"plan.{s.name}.epsilon_alone": s.epsilon_alone for s in plan.stages})
            mlflow.log_metrics({f"plan.{s.name}.share": s.share for s in plan.stages})

            # 2. Validate and encode (diagnostic report: for the data owner, not DP).
            df, report = validate_data(config.data, schema, config.policy, run_dir / "quarantine.csv")
            mlflow.log_dict(report.to_dict(), "diagnostics_not_dp/validation.json")
            codec = Codec.from_schema(schema)
            x_train, x_val = encode_rows(df, codec, config.select.validation_fraction, config.train.seed)

            torch.manual_seed(config.train.seed)
            model_cfg = config.model.model_dump(exclude={"name"})
            model = build_flow(config.model.name, codec.cardinalities, **model_cfg)

            # 3. Mechanisms: DP statistics, optional DP prior, DP-SGD, Report-Noisy-Max.
            mechanism_ran = True
            spent: list[Event] = []
            mean, std = dp_statistics(model, x_train, plan.stage("dp_stats"))
            spent.append(plan.stage("dp_stats").event)
            if plan.has("dp_prior"):
                dp_prior(model, x_train, mean, std, plan.stage("dp_prior"), config.model.mog_components)
                spent.append(plan.stage("dp_prior").event)
            train_stage = plan.stage("train")
            result = train_flow_model(model, x_train, settings_for(config.train, train_stage), show_progress)
            sgd_event = result.event
            assert sgd_event is not None
            logged = [step for step, _ in result.checkpoints]
            for step, eps in zip(logged, _cumulative_epsilon(spent, sgd_event, logged, plan.delta), strict=True):
                mlflow.log_metric("epsilon_cumulative", eps, step=step)
            for step, loss in enumerate(result.losses, start=1):
                if step % max(1, config.train.checkpoint_every // 5) == 0 or step == len(result.losses):
                    mlflow.log_metric("diag.train_loss", loss, step=step)  # not DP: for the data owner
            spent.append(sgd_event)

            def make_model(state: dict) -> torch.nn.Module:
                m = build_flow(config.model.name, codec.cardinalities, **model_cfg)
                m.load_state_dict(state)
                return m.eval()

            select_stage = plan.stage("select")
            chosen = select_checkpoints(make_model, result.checkpoints, x_val, select_stage, config.select)
            spent.append(report_noisy_max.rnm_event(per_pick_epsilon(select_stage), len(chosen)))
            ledger.settle(run_id, spent)
            epsilon = PLDAccountant().epsilon(spent, plan.delta)
            epsilon_rdp = RDPAccountant().epsilon(spent, plan.delta)
            mlflow.log_metric("epsilon_cumulative", epsilon, step=result.steps + 1)
            mlflow.log_metrics({"epsilon": epsilon, "delta": plan.delta, "epsilon_rdp": epsilon_rdp})
            mlflow.log_text(events_to_json(spent), "privacy/events.json")
            dataset_eps, _ = ledger.spent(schema.dataset.name)
            mlflow.log_metrics({"dataset_epsilon_cumulative": dataset_eps})

            # 4. Release: synthetic table from the chosen checkpoint(s); its size is public.
            states = [result.checkpoints[i][1] for i in chosen]
            flows = [make_model(s) for s in states]
            n_rows = config.evaluate.synthetic_rows or schema.dataset.expected_rows or 10_000
            synthetic = sample_rows(flows, codec, n_rows, seed=None)
            synthetic_path = store / "synthetic" / f"{schema.dataset.name}-{run_id}.csv"
            synthetic_path.parent.mkdir(parents=True, exist_ok=True)
            synthetic.write_csv(synthetic_path)
            mlflow.log_artifact(str(synthetic_path), "synthetic")

            # 5. Diagnostics for the data owner (not DP), then the registry.
            report_path = None
            test_df = None
            if config.evaluate.test_data is not None:
                test_df, _ = validate(
                    read_table(config.evaluate.test_data), schema, "quarantine", run_dir / "test_quarantine.csv"
                )
            evaluation = evaluate_run(
                schema, codec, flows[0], df, x_train, x_val, test_df, synthetic, config.evaluate, run_dir / "evaluation"
            )
            metrics = {k: float(v) for k, v in evaluation.metrics.items() if np.isfinite(v)}
            mlflow.log_metrics({f"diag.{k.replace('/', '.')}": v for k, v in metrics.items()})
            if evaluation.html_path is not None:
                report_path = str(evaluation.html_path)
                mlflow.log_artifact(report_path, "diagnostics_not_dp")
            for fig in evaluation.figures.values():
                mlflow.log_artifact(str(fig), "diagnostics_not_dp/figures")

            version = register_model(
                model_name,
                config.alias,
                schema,
                config.model.name,
                model_cfg,
                states,
                {
                    "epsilon": f"{epsilon:.6g}",
                    "delta": f"{plan.delta:g}",
                    "dataset": schema.dataset.name,
                    "dataset_epsilon_cumulative": f"{dataset_eps:.6g}",
                    "privflow_run_id": run_id,
                    "chosen_checkpoint_steps": json.dumps([result.checkpoints[i][0] for i in chosen]),
                },
                config.promotion,
            )
    except BaseException:
        if mechanism_ran:
            ledger.abandon(run_id)
        else:
            ledger.release(run_id)
        raise
    return RunSummary(
        run_id=run_id,
        mlflow_run_id=active.info.run_id,
        model_name=model_name,
        model_version=version,
        alias=config.alias,
        epsilon=epsilon,
        delta=plan.delta,
        epsilon_rdp=epsilon_rdp,
        dataset_epsilon=dataset_eps,
        stages={s.name: s.epsilon_alone for s in plan.stages},
        synthetic_path=str(synthetic_path),
        report_path=report_path,
        metrics=metrics,
        rows_quarantined=report.quarantined_rows,
        wall_seconds=time.monotonic() - started,
    )
