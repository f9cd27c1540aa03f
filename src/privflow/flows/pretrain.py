"""Public pretraining (`privflow pretrain`): the configured flow trained NON-privately on a
table the operator declares public, and registered as a parent for warm starts
(`privflow run --init-from`, tasks/warm_start.py; the DP-GAN note, Boob et al. 2018, 3.2).

Nothing here is private, so nothing is a mechanism: no ledger charge, no DP statistic. The
steps are the non-private reference of `fit` (tasks/fit.py): exact actnorm statistics (and
exact EM for a mixture prior), noise-free training with the planned shape for the public
table's own row count, argmax checkpoint selection; with ``marginals.enabled`` the copula
codec is built from the public table's exact marginals (`exact_marginal_codec`). The
version is registered like a DP release (pyfunc sampler, the schema and codec stored beside
the weights, so `privflow generate` and `load_version` load it) with the version tags
``privflow.pretrained=public`` and ``privflow.data=public``, in the dataset's own
``privflow-<dataset>-public`` experiment, under ``privflow-<dataset>-public`` unless
``--model-name`` says otherwise.

What the table is, is decided by its rows' keyed digests (privacy/fingerprint.py) against the
store's ledger, before anything is trained (`check_pretraining_rows`, privacy rule 9): a table
half or more of whose rows a run was charged for (whatever its format, compression, encoding or
row order) is refused; a table half or more of whose rows `privflow generate` sampled from a
private version is NOT public: the version is registered and the ledger records it with the
generating versions' lineage (`record_pretrained`), so a warm start from it composes their runs.
Otherwise "public" is the operator's declaration, recorded in the store's ledger (the exact
version, its weights' digest, the table's keyed row fingerprint). Warm starts accept a public
parent on that record only; the version tags are information.

`pretrain_pipeline` is the Prefect flow (`privflow pretrain`), each step a task run
(flows/steps.py, `PREFECT`); `pretrain_in_process` runs the same steps as plain functions,
without Prefect's engine (`LOCAL`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import mlflow
import numpy as np
import polars as pl
import torch
from prefect import flow

import privflow
from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError, DataError
from privflow.data.io import read_table
from privflow.data.schema import Schema
from privflow.data.target_head import release_parts
from privflow.data.validation import validate
from privflow.flows.steps import LOCAL, PREFECT, Runner
from privflow.tasks import mlflow_store as store_ml
from privflow.tasks.fit import FitResult, Spend, fit, prepare
from privflow.tasks.select import row_loglik
from privflow.tasks.train import cpu_threads
from privflow.tasks.warm_start import DATA_TAG, PRETRAINED_TAG, check_pretraining_rows, record_pretrained

DEFAULT_ALIAS = "pretrained"  # the CLI's --alias for pretraining (each new version takes it)


@dataclass(frozen=True)
class PretrainSummary:
    """What a pretraining produced; every figure is about public rows."""

    model_name: str
    model_version: str
    alias: str
    mlflow_run_id: str
    rows: int  # public rows that passed validation (training + selection split)
    quarantined_rows: int
    steps: int
    chosen_step: int
    validation_nats_per_row: float  # mean log-likelihood of the public selection rows
    wall_seconds: float
    public: bool = True  # declared public; False: the rows were sampled from private versions
    note: str = "Declared public in the store's ledger; no privacy was spent."  # what the ledger recorded

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def public_schema(schema: Schema, rows: int) -> Schema:
    """The schema with the public table's own row count, which sets the training shape
    (sample rate and steps) of the pretraining; the registered schema is the user's."""
    return schema.model_copy(update={"dataset": schema.dataset.model_copy(update={"expected_rows": rows})})


def pretrain_fit(
    config: RunConfig, schema: Schema, df: pl.DataFrame, show_progress: bool = False, runner: Runner = LOCAL
) -> tuple[FitResult, np.ndarray]:
    """Non-private fit of the configured flow on public rows (the benchmark calls it too), its
    steps through `runner`; returns the fit and the encoded selection rows it chose its
    checkpoint on."""
    if config.init_from is not None:
        raise ConfigError(
            "Pretraining starts from the config's random initialisation; remove 'init_from' from --config."
        )
    public = public_schema(schema, df.height)
    codec, x_train, x_val = prepare(config, public, df, None, Spend(), runner)
    fitted = fit(config, public, codec, x_train, x_val, private=False, show_progress=show_progress, runner=runner)
    return fitted, x_val


def _validation_nats(fitted: FitResult, x_val: np.ndarray) -> float:
    ll = row_loglik(fitted.flows[0], x_val) if len(x_val) else np.array([])
    ll = ll[np.isfinite(ll)]
    return float(ll.mean()) if ll.size else float("nan")


@flow(name="privflow-pretrain")
def pretrain_pipeline(config: RunConfig, show_progress: bool = True) -> PretrainSummary:
    """Train on the public table, register the version; raises a PrivflowError on bad input."""
    return _pretrain(config, show_progress, PREFECT)


def pretrain_in_process(config: RunConfig, show_progress: bool = True) -> PretrainSummary:
    """`pretrain_pipeline` without Prefect's engine: the same steps as plain functions."""
    return _pretrain(config, show_progress, LOCAL)


def _pretrain(config: RunConfig, show_progress: bool, runner: Runner) -> PretrainSummary:
    started = time.monotonic()
    schema = Schema.from_yaml(config.schema_path)
    store = config.store.resolve()
    dataset = schema.dataset.name
    model_name = config.model_name or f"privflow-{dataset}-public"
    folder = store / "pretrain" / uuid.uuid4().hex[:12]
    folder.mkdir(parents=True, exist_ok=True)
    df, report = validate(read_table(config.data), schema, config.policy, folder / "quarantine.csv")
    if df.height < config.select.min_rows(None):  # public rows: exact counts may be shown
        raise DataError(
            f"Only {df.height} of the public file's {report.total_rows} rows pass the schema's checks "
            f"({report.quarantined_rows} set aside to {folder / 'quarantine.csv'}); pretraining needs at least "
            f"{config.select.min_rows(None)}. Fix the file or the schema."
        )
    # charged rows refused, generated rows linked: decided before anything is trained or registered
    rows = check_pretraining_rows(df, store, str(config.data))
    store_ml.tracking(store)
    store_ml.experiment_for(f"{dataset}-public", store)
    with cpu_threads(config.train.threads), mlflow.start_run(run_name=f"{dataset}-public-pretrain") as active:
        data = "public" if rows.public else "generated"
        tags = {PRETRAINED_TAG: data, DATA_TAG: data}
        mlflow.log_params(store_ml.flat_params(config))
        mlflow.set_tags({**tags, "privflow.dataset": dataset, "privflow.code_version": privflow.__version__})
        with torch.random.fork_rng(devices=[]):
            fitted, x_val = pretrain_fit(config, schema, df, show_progress=show_progress, runner=runner)
            nats = _validation_nats(fitted, x_val)
        facts = {
            "pretrain.rows": df.height,
            "pretrain.steps": fitted.train.steps,
            "pretrain.chosen_step": fitted.chosen_steps[0],
            "pretrain.validation_nats_per_row": nats,
        }
        mlflow.log_metrics({k: float(v) for k, v in facts.items() if np.isfinite(v)})
        registered = runner(
            store_ml.register_model,
            model_name,
            config.alias,
            schema,
            config.model.name,
            config.model.model_dump(exclude={"name"}),
            fitted.states,
            {**tags, "privflow.public_rows": str(df.height)},
            "always",
            *release_parts(fitted.codec),  # DP marginals and target head, as release_codec reads them
        )
        # the data owner's declaration (the one thing that makes this version a free parent), or
        # the generating versions' lineage for a table of generated rows
        record_pretrained(store, model_name, registered.version, rows, dataset)
    return PretrainSummary(
        model_name=model_name,
        model_version=registered.version,
        alias=config.alias,
        mlflow_run_id=active.info.run_id,
        rows=df.height,
        quarantined_rows=report.quarantined_rows,
        steps=fitted.train.steps,
        chosen_step=fitted.chosen_steps[0],
        validation_nats_per_row=nats,
        wall_seconds=time.monotonic() - started,
        public=rows.public,
        note=rows.describe(f"{model_name}/{registered.version}"),
    )


__all__ = [
    "DEFAULT_ALIAS",
    "PretrainSummary",
    "pretrain_fit",
    "pretrain_in_process",
    "pretrain_pipeline",
    "public_schema",
]
