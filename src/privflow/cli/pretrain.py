"""`privflow pretrain`: a non-private flow trained on a public table, registered as a
warm-start parent."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from privflow.cli._common import (
    FlowOpt,
    ModelFamilyOpt,
    StoreOpt,
    TrainDeviceOpt,
    VerboseOpt,
    choice_value,
    console,
    flow_choice,
    guarded,
    load_config,
)


def pretrain(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="A PUBLIC table (.csv or .parquet): trained on without DP.")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML) of the private runs to warm-start.")],
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML): model, train.")] = None,
    flow: FlowOpt = None,
    model: ModelFamilyOpt = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Passes over the public table.")] = None,
    device: TrainDeviceOpt = None,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="Registered model name (default privflow-DATASET-public).")
    ] = None,
    alias: Annotated[str, typer.Option("--alias", help="Alias the new version takes.")] = "pretrained",
    store: StoreOpt = Path(".privflow"),
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train the configured flow NON-privately on a table you declare public and register it as a
    warm-start parent for `privflow run --init-from` (no ledger charge: nothing private is read).
    A table of rows a run was charged for is refused; one of rows `privflow generate` sampled from a
    private version is recorded with that version's lineage, not as public."""
    overrides = {
        "data": data,
        "schema_path": schema,
        "store": store,
        "model_name": model_name,
        "alias": alias,
        "model": {"name": flow_choice(ctx, flow, model)},
        "train": {"epochs": epochs, "device": choice_value(device)},
    }
    guarded(verbose, lambda: _pretrain(config, overrides, quiet, verbose))


def _pretrain(config_path: Path | None, overrides: dict, quiet: bool, verbose: bool) -> None:
    import time

    started = time.monotonic()  # the command's time, Prefect's server start included (not the flow's alone)
    from privflow.core import env

    env.set_verbosity(verbose)
    from privflow.preflight import preflight_pretrain

    checked = preflight_pretrain(load_config(config_path, overrides, None))
    cfg = checked.config
    from privflow.tasks.warm_start import check_public_file

    # rows a run was charged for are refused before Prefect starts (the flow checks again, on the rows it trains on)
    check_public_file(cfg.data, cfg.store.resolve(), checked.schema)
    env.configure(cfg.store, verbose=verbose)
    console.print(
        f"[bold]privflow[/] pretraining (NOT differentially private: {cfg.data} is declared public) on "
        f"{checked.rows} rows ({checked.data_format}; device {checked.device}); store {cfg.store.resolve()}",
        highlight=False,
        soft_wrap=True,
    )
    from privflow.core.startup import imports_without_gc

    with imports_without_gc():  # the flow stack's imports (privflow/core/startup.py)
        from privflow.flows.pretrain import pretrain_pipeline

        env.quiet_imported(verbose)
    s = pretrain_pipeline(cfg, show_progress=not quiet)
    wall = time.monotonic() - started
    Console(soft_wrap=True).print(
        f"registered {s.model_name} v{s.model_version} (@{s.alias}) from {s.rows} public rows"
        + (f" ({s.quarantined_rows} set aside by validation)" if s.quarantined_rows else "")
        + f", {s.steps} steps, checkpoint of step {s.chosen_step}, "
        + (
            f"validation {s.validation_nats_per_row:.3f} nats/row"
            if math.isfinite(s.validation_nats_per_row)
            else "validation not measured (no row fell in the selection split)"
        )
        + f", {wall:.1f} s in all (checks, Prefect's start-up, training and registration). {s.note} Warm-start a "
        f"DP run with: privflow run ... --init-from {s.model_name}/{s.model_version}  (MLflow run {s.mlflow_run_id})",
        highlight=False,
        markup=False,
    )
