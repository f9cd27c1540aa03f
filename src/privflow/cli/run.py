"""`privflow run` and `privflow demo`: configuration, pre-flight, then the DP pipeline, in
process or under Prefect's engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer

from privflow.cli._common import (
    Engine,
    FlowOpt,
    ModelFamilyOpt,
    Policy,
    Promote,
    StoreOpt,
    TrainDeviceOpt,
    VerboseOpt,
    choice_value,
    console,
    deprecation_note,
    flow_choice,
    from_environment,
    guarded,
    load_config,
    usage_error,
)
from privflow.cli.summary import print_stage_times, print_summary
from privflow.core.startup import use_prefect

PromoteOpt = Annotated[
    Promote | None,
    typer.Option(
        "--promote",
        help="When the alias moves to the new version: if-better (default: only when no version holds it yet; "
        "later versions by the DP comparison), always, or never.",
        case_sensitive=False,
    ),
]
EngineOpt = Annotated[
    Engine | None,
    typer.Option(
        "--engine",
        envvar="PRIVFLOW_ENGINE",
        case_sensitive=False,
        help="prefect: run the pipeline under Prefect's engine, its flow and task runs recorded by the Prefect "
        "server at PREFECT_API_URL or, with none set, by a temporary local server (a slower start-up). local: the "
        "same steps in this process, no Prefect records. The ledger, MLflow, the registry and the synthetic table "
        "are recorded alike. Default: prefect when PREFECT_API_URL is set, else local.",
    ),
]
# hidden, deprecated: the two booleans --engine replaced; each still works, with a note on stderr
NoServerOpt = Annotated[
    bool,
    typer.Option("--no-server", envvar="PRIVFLOW_NO_SERVER", hidden=True, help="Deprecated: use --engine local."),
]
PrefectOpt = Annotated[
    bool,
    typer.Option("--prefect", envvar="PRIVFLOW_PREFECT", hidden=True, help="Deprecated: use --engine prefect."),
]


def _engine(ctx: typer.Context, engine: Engine | None, prefect: bool, no_server: bool) -> bool:
    """Whether the run goes through Prefect's engine. --engine (or PRIVFLOW_ENGINE) decides, and the
    deprecated --prefect / --no-server (or PRIVFLOW_PREFECT / PRIVFLOW_NO_SERVER) map onto it, each
    with a one-line note; two that disagree are a usage error. None given: Prefect when
    PREFECT_API_URL is set, else in this process (`privflow.core.startup.use_prefect`)."""
    asked: list[tuple[str, str, bool]] = []  # (as the user gave it, engine, deprecated)
    for param, value, flag, variable, deprecated in (
        (
            "engine",
            choice_value(engine),
            f"--engine {choice_value(engine)}",
            f"PRIVFLOW_ENGINE={choice_value(engine)}",
            False,
        ),
        ("prefect", "prefect" if prefect else None, "--prefect", "PRIVFLOW_PREFECT", True),
        ("no_server", "local" if no_server else None, "--no-server", "PRIVFLOW_NO_SERVER", True),
    ):
        if value is not None:
            asked.append((variable if from_environment(ctx, param) else flag, value, deprecated))
    if len({value for _, value, _ in asked}) > 1:
        raise usage_error(
            ctx,
            f"{' and '.join(given for given, _, _ in asked)} contradict each other: give one --engine (prefect or "
            "local).",
        )
    for given, value, deprecated in asked:
        if deprecated:
            deprecation_note(f"{given} is deprecated: use --engine {value} (or PRIVFLOW_ENGINE={value}).")
    choice = asked[0][1] if asked else None
    return use_prefect(choice == "prefect", choice == "local")


def demo_paths() -> tuple[Path, Path, Path]:
    """The bundled Adult train file, its schema and the test file."""
    root = Path(str(resources.files("privflow") / "demo"))
    return root / "adult_train.csv", root / "adult.yaml", root / "adult_test.csv"


def run(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="Input table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML).")],
    epsilon: Annotated[
        float | None,
        typer.Option("--epsilon", help="Total epsilon of this run (default 1, or --config's privacy.epsilon)."),
    ] = None,
    delta: Annotated[
        float | None,
        typer.Option("--delta", help="Total delta of this run (default 1e-5, or --config's privacy.delta)."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Run configuration (YAML); flags override it.")
    ] = None,
    test_data: Annotated[
        Path | None, typer.Option("--test-data", help="Real test table for utility diagnostics.")
    ] = None,
    policy: Annotated[
        Policy | None,
        typer.Option(
            "--policy",
            help="Failing rows: strict (the gate stops the run past 1% of rows failing, fewer are dropped) or "
            "quarantine (set aside in the curator-only quarantine file; the gate stops past 50%). Limits: --config's "
            "gate section. Default strict, or --config's policy.",
            case_sensitive=False,
        ),
    ] = None,
    flow: FlowOpt = None,
    model: ModelFamilyOpt = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Passes over the data (public row count).")] = None,
    device: TrainDeviceOpt = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Data-parallel DP-SGD processes (torchrun: gloo on CPU, one GPU each with NCCL); same noise and "
            "epsilon as one process. Default 1.",
        ),
    ] = None,
    stream: Annotated[
        bool | None,
        typer.Option(
            "--stream/--no-stream",
            help="Read the (Parquet) table in chunks and train from disk, for tables larger than memory; default: "
            "streamed when the input is Parquet and the schema expects more than stream.auto_rows rows.",
        ),
    ] = None,
    model_name: Annotated[str | None, typer.Option("--model-name", help="Registered model name.")] = None,
    alias: Annotated[str | None, typer.Option("--alias", help="Registry alias for the new version.")] = None,
    promote: PromoteOpt = None,
    init_from: Annotated[
        str | None,
        typer.Option(
            "--init-from",
            help="Warm start: NAME@ALIAS or NAME/VERSION of a registered model (public pretraining, or a DP "
            "release of this dataset) whose weights DP training starts from.",
        ),
    ] = None,
    store: StoreOpt = Path(".privflow"),
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    engine: EngineOpt = None,
    no_server: NoServerOpt = False,
    prefect: PrefectOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check everything up front, then validate, train a DP flow, select a checkpoint, evaluate, register."""
    overrides = {
        "data": data,
        "schema_path": schema,
        "policy": choice_value(policy),
        "store": store,
        "model_name": model_name,
        "alias": alias,
        "init_from": init_from,
        "privacy": {"epsilon": epsilon, "delta": delta},
        "model": {"name": flow_choice(ctx, flow, model)},
        "train": {"epochs": epochs, "device": choice_value(device), "workers": workers},
        "evaluate": {"test_data": test_data},
        "stream": {"enabled": stream},
    }
    server = _engine(ctx, engine, prefect, no_server)
    _run(config, overrides, quiet, verbose, choice_value(promote), server=server)


def demo(
    ctx: typer.Context,
    store: StoreOpt = Path(".privflow"),
    epsilon: Annotated[float, typer.Option("--epsilon", help="Total epsilon of this run.", show_default=True)] = 1.0,
    delta: Annotated[float, typer.Option("--delta", help="Total delta of this run.", show_default=True)] = 1e-5,
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML).")] = None,
    promote: PromoteOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    engine: EngineOpt = None,
    no_server: NoServerOpt = False,
    prefect: PrefectOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run the pipeline on the bundled UCI Adult demo at (epsilon=1, delta=1e-5)."""
    train, schema, test = demo_paths()
    overrides = {
        "data": train,
        "schema_path": schema,
        "store": store,
        "privacy": {"epsilon": epsilon, "delta": delta},
        "evaluate": {"test_data": test},
    }
    server = _engine(ctx, engine, prefect, no_server)
    _run(config, overrides, quiet, verbose, choice_value(promote), server=server)


def _run(
    config_path: Path | None, overrides: dict, quiet: bool, verbose: bool, promote: str | None, server: bool = True
) -> None:
    guarded(verbose, lambda: _run_body(config_path, overrides, quiet, verbose, promote, server))


def _run_body(
    config_path: Path | None, overrides: dict, quiet: bool, verbose: bool, promote: str | None, server: bool = True
) -> None:
    from privflow.core import env, timing
    from privflow.core.startup import imports_without_gc, meanwhile

    times = timing.StageTimes()  # each stage's wall time, printed under --verbose (never released)
    age = timing.process_age()
    if age is not None:
        times.add("process start (interpreter, CLI imports)", age)
    env.set_verbosity(verbose)  # before anything logs (the accountant's absl warnings included)
    with timing.collecting(times), imports_without_gc():  # pre-flight and the flow stack's imports
        pipeline, ready, cfg = _start_run(config_path, overrides, verbose, promote, server)
        if ready is not None:
            from privflow.core.startup import waits
            from privflow.data.validation.expectations import import_gx

            # while Prefect's temporary server starts, this process would wait idle: import GX meanwhile
            with times.stage("Prefect server start"), meanwhile(import_gx) if waits(ready) else nullcontext():
                ready()
    summary = pipeline(cfg, show_progress=not quiet)
    for stage, seconds in (getattr(summary, "stage_seconds", None) or {}).items():
        times.add(stage, seconds)
    with times.stage("summary print"):
        print_summary(summary, prefect=server)
    if verbose:
        print_stage_times(times.as_dict(), timing.process_age())


def _plan_total(plan: Any, cfg: Any) -> str:
    """The run's total as pre-flight knows it: the plan's epsilon at its delta and, when the
    promotion setting may run the DP comparison (if-better, once a version holds the alias), that
    comparison's own epsilon, charged as its own ledger entry. Whether a version holds the alias is
    the registry's to say (MLflow), so the comparison is stated as "up to"."""
    from privflow.privacy.mechanisms.promotion import PromotionMechanism

    text = f"plan epsilon={plan.epsilon:.4g} at delta={plan.delta:g}"
    if cfg.promotion != "if_better":
        return text + f" (promotion: {cfg.promotion.replace('_', '-')}, no DP comparison)"
    # the pipeline's PromotionSettings(alias=...) keeps the mechanism's defaults (flows/pipeline.py)
    comparison = PromotionMechanism()
    cost = f"{comparison.epsilon:g}" + ("" if comparison.mechanism == "laplace" else f" at delta={comparison.delta:g}")
    return (
        f"{text}, plus up to epsilon={cost} for the promotion comparison if a version already holds "
        f"@{cfg.alias} (--promote never or always skips it)"
    )


def _start_run(
    config_path: Path | None, overrides: dict, verbose: bool, promote: str | None, server: bool
) -> tuple[Callable[..., Any], Callable[[], None] | None, Any]:
    """Configuration, pre-flight, then (Prefect's temporary server spawned when `server`) the
    pipeline's import: (the pipeline to call, the wait for that server or None, the config)."""
    from privflow.core import env, timing

    started = time.perf_counter()
    from privflow.preflight import preflight

    cfg = load_config(config_path, overrides, promote)
    # Everything checkable up front, before any library starts a server or the ledger reserves.
    checked = preflight(cfg)
    timing.record("pre-flight (config, checks, privacy plan)", time.perf_counter() - started)
    started = time.perf_counter()
    cfg = checked.config  # a warm start's parent pinned to the version pre-flight checked
    env.configure(cfg.store, verbose=verbose)
    console.print(
        f"[bold]privflow[/] pre-flight passed in {checked.seconds:.1f} s ({checked.data_format}"
        + ("; streamed: read in chunks, rows encoded on disk" if checked.streamed else "")
        + f"; device "
        f"{checked.device}). Training on [cyan]{cfg.data}[/] at "
        + _plan_total(checked.plan, cfg)
        + f"; store {cfg.store.resolve()}"
        + (f"; warm start from {cfg.init_from} (no DP statistics stage)" if cfg.init_from else ""),
        highlight=False,
        soft_wrap=True,
    )
    from rich.markup import escape

    for note in checked.notes:
        console.print(f"[bold yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    ready = None
    pipeline: Callable[..., Any]
    if server:
        # Every cheap check passed: Prefect's temporary server starts now, in its own process,
        # while this one imports torch, MLflow and the pipeline (privflow/core/startup.py).
        from privflow.core.startup import start_early

        ready = start_early()
        from privflow.flows.train import train_pipeline  # its own plan step, a task run

        pipeline = train_pipeline
    else:  # the same chain without Prefect's engine, and without importing Prefect
        from functools import partial

        from privflow.flows.pipeline import train_in_process

        pipeline = partial(train_in_process, plan=checked.plan)  # pre-flight's plan, computed once

    env.quiet_imported(verbose)
    timing.record("imports, start-up (torch, MLflow, pipeline)", time.perf_counter() - started)
    return pipeline, ready, cfg
