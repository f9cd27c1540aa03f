"""`privflow`: run the DP pipeline, sample a registered model, inspect the privacy ledger.

Heavy libraries (torch, prefect, mlflow) are imported inside the commands, so `--help`
stays instant. `run` and `demo` first run the pre-flight checks (`privflow.preflight`):
before Prefect, MLflow or Great Expectations is imported and before the ledger reserves.

Exit statuses: 0 success; 2 any PrivflowError (a user error, over budget, the validation
gate stopping a run), printed once as one paragraph with no traceback; 1 an unexpected
(internal) error, one paragraph, with the traceback under `--verbose`; 3 `privflow audit`'s verdict
is not the healthy one; 130 Ctrl-C; 143 SIGTERM
(a scheduler cancelling the job), unwound like Ctrl-C so that the ledger, the MLflow run and
the working files are closed as they are then.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import sys
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from privflow import interrupts
from privflow.startup import use_prefect

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Differentially private normalizing flows for tabular data, with an honest privacy ledger.",
)
ledger_app = typer.Typer(no_args_is_help=True, help="Inspect the per-dataset privacy ledger.")
app.add_typer(ledger_app, name="ledger")
console = Console(stderr=True)

EXIT_OK, EXIT_INTERNAL, EXIT_USER, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
EXIT_AUDIT = 3  # `privflow audit`: the shipped configuration failed, or a mutant was not caught


def _stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The message and exit status of an interrupted command."""
    if isinstance(exc, interrupts.Terminated):
        return "terminated (SIGTERM).", EXIT_TERMINATED
    return "interrupted (Ctrl-C).", EXIT_INTERRUPTED


StoreOpt = Annotated[
    Path, typer.Option("--store", help="Folder for the MLflow SQLite store, artifacts, ledger and synthetic tables.")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show library logs, warnings and tracebacks.")]
PromoteOpt = Annotated[
    str | None,
    typer.Option(
        "--promote",
        help="When the alias moves to the new version: if-better (default: only when no version holds it yet; "
        "later versions by the DP comparison), always, or never.",
    ),
]
NoServerOpt = Annotated[
    bool,
    typer.Option(
        "--no-server",
        envvar="PRIVFLOW_NO_SERVER",
        help="Run the pipeline's steps in this process without Prefect's engine even when a Prefect API is "
        "configured: no Prefect flow-run records; the ledger, MLflow, the registry and the synthetic table are "
        "recorded exactly as with Prefect. The default when no PREFECT_API_URL is set.",
    ),
]
PrefectOpt = Annotated[
    bool,
    typer.Option(
        "--prefect",
        envvar="PRIVFLOW_PREFECT",
        help="Run under Prefect's engine even when no Prefect API is configured: a temporary local Prefect "
        "server records the flow run in the store's Prefect database (10-20 s more start-up).",
    ),
]


def demo_paths() -> tuple[Path, Path, Path]:
    """The bundled Adult train file, its schema and the test file."""
    root = Path(str(resources.files("privflow") / "demo"))
    return root / "adult_train.csv", root / "adult.yaml", root / "adult_test.csv"


_LONG_WORD = 300  # characters: longer runs (a garbage header echoed from a file) are cut to 120


def _paragraph(text: str) -> str:
    """One line; any run of non-space characters longer than _LONG_WORD shortened, saying so."""

    def cut(m: re.Match[str]) -> str:
        word = m.group()
        return f"{word[:120]}... ({len(word):,} characters)"

    return re.sub(rf"\S{{{_LONG_WORD + 1},}}", cut, " ".join(str(text).split()))


def _fail(message: str, code: int = EXIT_USER) -> None:
    from rich.markup import escape

    # the message is text, not markup: "[low, high]" or a value in brackets must print as it is
    console.print(f"[bold red]error:[/] {escape(_paragraph(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _guarded(verbose: bool, body: Callable[[], Any], spends: bool = True) -> Any:
    """Run a command body with the CLI's exit-status contract (module docstring); `spends`: the
    command can charge the ledger (an interrupted one says where its charges are)."""
    from privflow.errors import PrivflowError, disk_full

    try:
        return body()
    except (typer.Exit, typer.Abort):
        raise
    except KeyboardInterrupt as exc:
        interrupts.quiet_after_interrupt()  # also where a library's own SIGINT handler raised it
        if verbose:
            traceback.print_exc()
        what, status = _stopped(exc)
        spent = " Any privacy already spent by the run stays recorded in the ledger; see `privflow ledger show`."
        console.print(f"{what}{spent if spends else ''}", highlight=False, soft_wrap=True)
        raise typer.Exit(status) from None
    except PrivflowError as exc:
        if verbose:
            traceback.print_exc()
        _fail(str(exc), EXIT_USER)
    except Exception as exc:  # noqa: BLE001 - the one place a bug becomes a message
        if verbose:
            traceback.print_exc()
        full = disk_full(exc)
        if full is not None:
            _fail(
                f"out of disk space ({_paragraph(str(full))[:300]}). Free some space, or point --store (and -o) at a "
                "disk with room, and rerun. No partial output table is left under its name; any privacy a run had "
                "already spent stays recorded in the ledger (`privflow ledger show`).",
                EXIT_USER,
            )
        detail = _paragraph(f"{type(exc).__name__}: {exc}")[:400]
        _fail(
            f"internal error: privflow hit an unexpected problem ({detail}). This is a bug, not a problem with "
            "your input; rerun with --verbose to see the traceback, and report it with that output.",
            EXIT_INTERNAL,
        )


def _promotion(value: str | None) -> str | None:
    """--promote if-better|always|never -> the config's value (one the config accepts)."""
    if value is None:
        return None
    from typing import get_args

    from privflow.config import RunConfig, promotion_key
    from privflow.errors import ConfigError

    key = promotion_key(value)
    if key not in get_args(RunConfig.model_fields["promotion"].annotation):
        raise ConfigError(f"--promote must be one of if-better, always, never; got '{value}'.")
    return key


@app.command()
def run(
    data: Annotated[Path, typer.Option("--data", help="Input table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML).")],
    epsilon: Annotated[float | None, typer.Option("--epsilon", help="Total epsilon of this run.")] = None,
    delta: Annotated[float | None, typer.Option("--delta", help="Total delta of this run.")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Run configuration (YAML); flags override it.")
    ] = None,
    test_data: Annotated[
        Path | None, typer.Option("--test-data", help="Real test table for utility diagnostics.")
    ] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="strict | quarantine (bad rows set aside).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="dphflow | maf.")] = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Passes over the data (public row count).")] = None,
    device: Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda.")] = None,
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
    no_server: NoServerOpt = False,
    prefect: PrefectOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check everything up front, then validate, train a DP flow, select a checkpoint, evaluate, register."""
    overrides = {
        "data": data,
        "schema_path": schema,
        "policy": policy,
        "store": store,
        "model_name": model_name,
        "alias": alias,
        "init_from": init_from,
        "privacy": {"epsilon": epsilon, "delta": delta},
        "model": {"name": model},
        "train": {"epochs": epochs, "device": device, "workers": workers},
        "evaluate": {"test_data": test_data},
        "stream": {"enabled": stream},
    }
    server = _guarded(verbose, lambda: use_prefect(prefect, no_server))
    _run(config, overrides, quiet, verbose, promote, server=server)


@app.command()
def demo(
    store: StoreOpt = Path(".privflow"),
    epsilon: Annotated[float, typer.Option("--epsilon")] = 1.0,
    delta: Annotated[float, typer.Option("--delta")] = 1e-5,
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML).")] = None,
    promote: PromoteOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
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
    server = _guarded(verbose, lambda: use_prefect(prefect, no_server))
    _run(config, overrides, quiet, verbose, promote, server=server)


def _merge(base: dict, overrides: dict, where: str = "") -> dict:
    """The config file's settings with the command line's on top (None: not given)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict):
            section = out.get(key)
            if section is not None and not isinstance(section, dict):
                from privflow.errors import ConfigError

                raise ConfigError(
                    f"Config section '{where}{key}' must be a mapping of settings (e.g. 'train: {{epochs: 2}}'), "
                    f"not a {type(section).__name__}."
                )
            merged = _merge(section or {}, value, f"{where}{key}.")
            if merged:
                out[key] = merged
        elif value is not None:
            out[key] = value
    return out


def _run(
    config_path: Path | None, overrides: dict, quiet: bool, verbose: bool, promote: str | None, server: bool = True
) -> None:
    _guarded(verbose, lambda: _run_body(config_path, overrides, quiet, verbose, promote, server))


def _load_config(config_path: Path | None, overrides: dict, promote: str | None) -> Any:
    from privflow.config import RunConfig
    from privflow.errors import ConfigError

    base: dict = {}
    if config_path is not None:
        from privflow.yaml_file import read_mapping

        if not config_path.is_file():
            raise ConfigError(f"Config file '{config_path}' does not exist or is not a file.")
        base = read_mapping(config_path, "Config file", ConfigError)
    promotion = _promotion(promote)
    if promotion is not None:
        overrides = {**overrides, "promotion": promotion}
    return RunConfig.build(**_merge(base, overrides))


def _run_body(
    config_path: Path | None, overrides: dict, quiet: bool, verbose: bool, promote: str | None, server: bool = True
) -> None:
    from privflow import env
    from privflow.startup import imports_without_gc, meanwhile

    env.set_verbosity(verbose)  # before anything logs (the accountant's absl warnings included)
    with imports_without_gc():  # pre-flight and the flow stack's imports (privflow/startup.py)
        pipeline, ready, cfg = _start_run(config_path, overrides, verbose, promote, server)
        if ready is not None:
            from privflow.flows.prefect_server import waits
            from privflow.validation import import_gx

            # while Prefect's temporary server starts, this process would wait idle: import GX meanwhile
            with meanwhile(import_gx) if waits(ready) else nullcontext():
                ready()
    summary = pipeline(cfg, show_progress=not quiet)
    _print_summary(summary)


def _start_run(
    config_path: Path | None, overrides: dict, verbose: bool, promote: str | None, server: bool
) -> tuple[Callable[..., Any], Callable[[], None] | None, Any]:
    """Configuration, pre-flight, then (Prefect's temporary server spawned when `server`) the
    pipeline's import: (the pipeline to call, the wait for that server or None, the config)."""
    from privflow import env
    from privflow.preflight import preflight

    cfg = _load_config(config_path, overrides, promote)
    # Everything checkable up front, before any library starts a server or the ledger reserves.
    checked = preflight(cfg)
    cfg = checked.config  # a warm start's parent pinned to the version pre-flight checked
    env.configure(cfg.store, verbose=verbose)
    console.print(
        f"[bold]privflow[/] pre-flight passed in {checked.seconds:.1f} s ({checked.data_format}"
        + ("; streamed: read in chunks, rows encoded on disk" if checked.streamed else "")
        + f"; device "
        f"{checked.device}). Training on [cyan]{cfg.data}[/] at epsilon={cfg.privacy.epsilon:g}, "
        f"delta={cfg.privacy.delta:g}; store {cfg.store.resolve()}"
        + (f"; warm start from {cfg.init_from} (no DP statistics stage)" if cfg.init_from else ""),
        highlight=False,
        soft_wrap=True,
    )
    from rich.markup import escape

    for note in checked.notes:
        console.print(f"[bold yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    ready = None
    if server:
        # Every cheap check passed: Prefect's temporary server starts now, in its own process,
        # while this one imports torch, MLflow and the pipeline (flows/prefect_server.py).
        from privflow.flows.prefect_server import start_early

        ready = start_early()
        from privflow.flows.train import train_pipeline as pipeline
    else:  # the same chain without Prefect's engine, and without importing Prefect
        from privflow.flows.pipeline import train_in_process as pipeline

    env.quiet_imported(verbose)
    return pipeline, ready, cfg


def _print_summary(summary: object) -> None:
    """The run's figures as a table, then the registry decision and every path in full."""
    from rich.table import Table

    s = summary  # RunSummary
    get = lambda name, default=None: getattr(s, name, default)  # noqa: E731 - fields other engineers add
    out = Console(soft_wrap=True)
    table = Table(title="privflow run", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    # the version's epsilon (privacy rule 9): a warm start from a private parent composes the whole chain
    lineage, runs = get("lineage"), get("lineage_runs") or ()
    headline = "epsilon (PLD, reported" + (f", lineage of {len(runs)} runs)" if len(runs) > 1 else ")")
    table.add_row(headline, f"{s.epsilon:.4f} at delta={s.delta:g}")
    if len(runs) > 1:
        table.add_row("  lineage", str(lineage))
    if get("epsilon_run") is not None and get("delta_run"):
        table.add_row("epsilon (this run alone, PLD)", f"{s.epsilon_run:.4f} at delta={s.delta_run:g}")
    table.add_row("epsilon (this run alone, RDP cross-check)", f"{s.epsilon_rdp:.4f}")
    for stage, eps in s.stages.items():
        table.add_row(f"  stage {stage}", f"{eps:.4f} alone")
    # the ledger composes every run of the dataset at its budget's delta, which may differ from this run's
    table.add_row("dataset cumulative epsilon", f"{s.dataset_epsilon:.4f} at delta={get('dataset_delta', 0.0):g}")
    metrics = get("metrics") or {}
    for key in (
        "utility/macro_f1_mean",
        "utility/auroc_mean",
        "utility/ap_mean",
        "likelihood/test_nats_per_row",
        "fidelity/tv_mean",
    ):
        if key in metrics:
            table.add_row(f"{key} (not DP)", f"{metrics[key]:.4f}")
    # The gate's released DP count; exact counts are in the curator-only validation report.
    table.add_row("rows failing validation (DP count)", f"about {get('failing_rows_dp', 0.0):.0f}")
    table.add_row("wall time", f"{get('wall_seconds', 0.0):.1f} s")
    out.print(table)
    alias = get("alias") or "champion"
    alias_version = get("alias_version", None)
    promotion = get("promotion", None)
    lines = [f"registered model {s.model_name} v{s.model_version}"]
    if get("init_from"):
        lines.append(
            f"warm-started from {get('init_from')} (lineage {get('lineage') or '?'}: in the version's "
            "privflow.lineage tag, the MLflow params and the ledger entry)"
        )
    if alias_version is None and promotion is None:
        alias_line = f"alias @{alias} -> v{s.model_version}"  # before RunSummary gained the fields
    elif alias_version is None:
        alias_line = f"alias @{alias} -> (no version)"
    else:
        alias_line = f"alias @{alias} -> v{alias_version}"
    if promotion:
        alias_line += f" ({_paragraph(promotion)})"
    lines.append(alias_line)
    lines.append(f"synthetic table: {s.synthetic_path}")
    if get("release_note"):
        lines.append(f"note: {get('release_note')}")
    if get("report_path"):
        lines.append(f"diagnostics report (not DP, curator only): {s.report_path}")
    if get("diagnostics_note"):
        lines.append(f"diagnostics note (not DP, curator only): {get('diagnostics_note')}")
    if get("curator_dir"):
        lines.append(f"curator-only diagnostics folder (not DP): {get('curator_dir')}")
    if get("mlflow_run_id"):
        lines.append(f"MLflow run: {s.mlflow_run_id}")
    if get("run_id"):
        lines.append(f"ledger run: {s.run_id}")
    for line in lines:
        out.print(line, highlight=False, soft_wrap=True, markup=False)


@app.command()
def pretrain(
    data: Annotated[Path, typer.Option("--data", help="A PUBLIC table (.csv or .parquet): trained on without DP.")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML) of the private runs to warm-start.")],
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML): model, train.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="dphflow | maf.")] = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Passes over the public table.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda.")] = None,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="Registered model name (default privflow-DATASET-public).")
    ] = None,
    alias: Annotated[str, typer.Option("--alias", help="Alias the new version takes.")] = "pretrained",
    store: StoreOpt = Path(".privflow"),
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train the configured flow NON-privately on a table you declare public and register it as a
    warm-start parent for `privflow run --init-from` (no ledger charge: nothing private is read)."""
    overrides = {
        "data": data,
        "schema_path": schema,
        "store": store,
        "model_name": model_name,
        "alias": alias,
        "model": {"name": model},
        "train": {"epochs": epochs, "device": device},
    }
    _guarded(verbose, lambda: _pretrain(config, overrides, quiet, verbose))


def _pretrain(config_path: Path | None, overrides: dict, quiet: bool, verbose: bool) -> None:
    from privflow import env

    env.set_verbosity(verbose)
    from privflow.preflight import preflight_pretrain

    checked = preflight_pretrain(_load_config(config_path, overrides, None))
    cfg = checked.config
    env.configure(cfg.store, verbose=verbose)
    console.print(
        f"[bold]privflow[/] pretraining (NOT differentially private: {cfg.data} is declared public) on "
        f"{checked.rows} rows ({checked.data_format}; device {checked.device}); store {cfg.store.resolve()}",
        highlight=False,
        soft_wrap=True,
    )
    from privflow.startup import imports_without_gc

    with imports_without_gc():  # the flow stack's imports (privflow/startup.py)
        from privflow.flows.pretrain import pretrain_pipeline

        env.quiet_imported(verbose)
    s = pretrain_pipeline(cfg, show_progress=not quiet)
    Console(soft_wrap=True).print(
        f"registered {s.model_name} v{s.model_version} (@{s.alias}) from {s.rows} public rows"
        + (f" ({s.quarantined_rows} set aside by validation)" if s.quarantined_rows else "")
        + f", {s.steps} steps, checkpoint of step {s.chosen_step}, "
        + (
            f"validation {s.validation_nats_per_row:.3f} nats/row"
            if math.isfinite(s.validation_nats_per_row)
            else "validation not measured (no row fell in the selection split)"
        )
        + f", {s.wall_seconds:.1f} s. Declared public in the store's ledger; no privacy was spent. Warm-start a "
        f"DP run with: privflow run ... --init-from {s.model_name}/{s.model_version}  (MLflow run {s.mlflow_run_id})",
        highlight=False,
        markup=False,
    )


@app.command()
def generate(
    model: Annotated[str, typer.Option("--model", help="NAME@ALIAS or NAME/VERSION of a registered model.")],
    n: Annotated[int, typer.Option("-n", help="Number of rows to sample.", min=1)],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet).")],
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for reproducible samples.")] = None,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            help="auto | cpu | cuda: where the flow's inverse runs (auto: CUDA when present). A seed gives the "
            "same rows on the same kind of device; CPU and GPU arithmetic can differ in the last bits.",
        ),
    ] = "auto",
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Sample synthetic rows from a registered model (never touches the training data)."""
    _guarded(verbose, lambda: _generate(model, n, out, seed, store, verbose, device), spends=False)


def _generate(
    model: str, n: int, out: Path, seed: int | None, store: Path, verbose: bool, device: str = "auto"
) -> None:
    from privflow.preflight import check_output, check_registry, check_room, check_seed, resolve_device

    check_output(out)
    replaced = " (replacing the file that was there)" if out.exists() else ""
    seed = check_seed(seed)
    device = resolve_device(device)  # before the store is opened: a missing GPU costs nothing
    check_registry(store, f"--model {model}", "Train and register one first (`privflow run`) with the same --store.")
    from privflow import env
    from privflow.startup import imports_without_gc

    env.configure(store, verbose=verbose)
    with imports_without_gc():  # MLflow's import and the model's load (privflow/startup.py)
        import mlflow  # noqa: F401 - imported here so its event messages can be switched off

        from privflow.registry import load_generator

        env.quiet_imported(verbose)
        generator = load_generator(model, store)
    sampler = _generator_sampler(generator)
    schema = sampler.codec.schema if sampler is not None else _generator_schema(generator)
    check_room(out, n, len(schema.columns) if schema is not None else 1)
    if sampler is not None:
        # Stream: the released flows sample batch by batch straight into the file (bounded
        # memory, one explicit generator from `--seed` or the OS CSPRNG, privflow.sampler).
        from privflow.sampler import write_samples

        flows = [flow.to(device) for flow in sampler.flows]
        write_samples(flows, sampler.codec, n, out, seed=seed, progress=not verbose and _is_tty())
        Console().print(f"wrote {n} rows to {out}{replaced}", highlight=False, soft_wrap=True)
        return
    import pandas as pd
    import polars as pl

    frame = generator.predict(pd.DataFrame({"n": [n], **({"seed": [seed]} if seed is not None else {})}))
    table = pl.from_pandas(frame)
    if schema is not None:
        from privflow.codec import restore_types

        table = restore_types(table, schema)
    from privflow.io import write_table

    write_table(table, out)
    Console().print(f"wrote {table.height} rows to {out}{replaced}", highlight=False, soft_wrap=True)


@app.command()
def score(
    model: Annotated[str, typer.Option("--model", help="NAME@ALIAS or NAME/VERSION of a registered model.")],
    data: Annotated[Path, typer.Option("--data", help="Table to score (.csv or .parquet) with the model's columns.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet): rows + loglik, anomaly.")],
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="Public log-likelihood threshold: loglik below it is flagged.")
    ] = None,
    fpr: Annotated[
        float | None,
        typer.Option("--fpr", help="Target false-positive rate q: the threshold is a DP q-quantile of --reference."),
    ] = None,
    reference: Annotated[
        Path | None, typer.Option("--reference", help="Reference table for --fpr (charged to the schema's dataset).")
    ] = None,
    epsilon: Annotated[
        float | None, typer.Option("--epsilon", help="Epsilon of the DP quantile (--fpr only), spent from the ledger.")
    ] = None,
    score_low: Annotated[
        float | None, typer.Option("--score-low", help="Lower end of the public threshold grid (nats; default -20).")
    ] = None,
    score_high: Annotated[
        float | None, typer.Option("--score-high", help="Upper end of the public threshold grid (nats; default 10).")
    ] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Score a table's rows by log-likelihood under a registered model and flag anomalies.

    Scoring is post-processing of the released model (free); a DP threshold from --fpr spends
    --epsilon of the reference dataset's budget."""
    _guarded(
        verbose,
        lambda: _score(model, data, out, threshold, fpr, reference, epsilon, score_low, score_high, store, verbose),
    )


def _score(
    model: str,
    data: Path,
    out: Path,
    threshold: float | None,
    fpr: float | None,
    reference: Path | None,
    epsilon: float | None,
    score_low: float | None,
    score_high: float | None,
    store: Path,
    verbose: bool,
) -> None:
    import math

    from privflow.config import SelectConfig
    from privflow.errors import ConfigError
    from privflow.preflight import check_output, check_registry

    check_output(out)
    if Path(out).resolve() == Path(data).resolve():
        raise ConfigError(f"-o '{out}' is the --data table itself; write the scores to another file.")
    check_registry(store, f"--model {model}", "Train and register one first (`privflow run`) with the same --store.")
    dp_args = {"--fpr": fpr, "--reference": reference, "--epsilon": epsilon}
    if threshold is not None:
        given = [k for k, v in dp_args.items() if v is not None]
        if given:
            raise ConfigError(f"Pass either --threshold or --fpr/--reference/--epsilon, not both (got {given}).")
        if not math.isfinite(threshold):
            raise ConfigError(f"--threshold must be a finite number, got {threshold}.")
        mechanism = None
    else:
        missing = [k for k, v in dp_args.items() if v is None]
        if missing:
            raise ConfigError(
                "score needs a threshold: a public number (--threshold T), or a DP quantile of a reference "
                f"table (--fpr q --reference REF.csv --epsilon E); missing {missing}."
            )
        from privflow.privacy.mechanisms.dp_quantile import DPQuantile
        from privflow.privacy.plan import MAX_EPSILON

        if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):  # type: ignore[arg-type]
            raise ConfigError(f"--epsilon must be a positive number of at most {MAX_EPSILON:g}, got {epsilon}.")

        defaults = SelectConfig()
        try:
            mechanism = DPQuantile(
                float(fpr),  # type: ignore[arg-type]
                float(epsilon),  # type: ignore[arg-type]
                defaults.score_low if score_low is None else score_low,
                defaults.score_high if score_high is None else score_high,
            )
        except ValueError as exc:
            raise ConfigError(f"Bad --fpr/--epsilon/--score-low/--score-high: {exc}.") from None
    from privflow import env
    from privflow.startup import imports_without_gc

    env.configure(store, verbose=verbose)
    with imports_without_gc():  # MLflow's import and the model's load (privflow/startup.py)
        import mlflow  # noqa: F401 - imported here so its event messages can be switched off

        from privflow.preflight import check_table
        from privflow.tasks.score import dp_threshold, flag, load_model, scored_rows

        env.quiet_imported(verbose)
        name, loaded = load_model(model, store)
    check_table(data, loaded.schema, "Data file")  # header against the model's public schema
    if reference is not None:
        check_table(reference, loaded.schema, "Reference file")  # header only, before the ledger reserves
    raw, loglik = scored_rows(loaded, data)  # the table read and checked before any budget is spent
    say = Console().print
    spent = 0.0
    if mechanism is not None:
        released = dp_threshold(loaded, reference, mechanism, store)  # type: ignore[arg-type]
        threshold, spent = released.threshold, released.epsilon
        say(
            f"DP threshold: {threshold:.4g} nats (the {mechanism.q:g}-quantile of the reference log-likelihoods, "
            f"grid step {mechanism.step:.3g} over [{mechanism.low:g}, {mechanism.high:g}]); epsilon spent "
            f"{spent:g} on dataset '{released.dataset}' (ledger run {released.ledger_run_id})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    else:
        say(f"public threshold: {threshold:g} nats; epsilon spent 0", highlight=False, soft_wrap=True)
    from privflow.io import write_table

    table = flag(raw, loglik, float(threshold))  # type: ignore[arg-type]
    replaced = " (replacing the file that was there)" if out.exists() else ""
    write_table(table, out)
    flagged = int(table["anomaly"].sum())
    say(
        f"scored {table.height} rows of {data} under {name} v{loaded.version}: {flagged} flagged as anomalies "
        f"(loglik < {threshold:.4g}); wrote {out}{replaced}. Scoring spends no privacy; these counts are of the "
        "rows you brought (for the operator only if they are private).",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


def _is_tty() -> bool:
    return sys.stderr.isatty()


def _generator_sampler(generator: Any) -> Any:
    """The privflow FlowSampler inside a loaded pyfunc (its flows and codec), or None for a
    foreign model, which is then asked for its rows through predict."""
    try:
        inner = generator.unwrap_python_model()
    except Exception:  # noqa: BLE001
        return None
    return inner if getattr(inner, "flows", None) and getattr(inner, "codec", None) is not None else None


def _generator_schema(generator: Any) -> Any:
    """The public schema inside a loaded pyfunc sampler, when it exposes one."""
    try:
        return getattr(generator.unwrap_python_model(), "schema", None)
    except Exception:  # noqa: BLE001 - an older or foreign model: write what it returned
        return None


@ledger_app.command("show")
def ledger_show(
    dataset: Annotated[str | None, typer.Argument(help="Dataset name; all datasets when omitted.")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Charged runs (settled, abandoned, open reservations), their privacy events and the
    cumulative (epsilon, delta), per dataset: the publishable summary (no data fingerprints)."""
    _guarded(verbose, lambda: _ledger_show(dataset, store, verbose), spends=False)


def _ledger_at(store: Path, dataset: str | None = None) -> Any:
    """The store's existing ledger (holding `dataset`, when one is named), or a StoreError
    naming what is there instead."""
    from privflow.errors import StoreError
    from privflow.privacy.ledger import Ledger

    path = store / "ledger.db"
    if store.exists() and not store.is_dir():
        raise StoreError(f"--store '{store}' is a file, not a folder; pass the store folder privflow runs used.")
    if path.is_dir():
        raise StoreError(f"'{path}' is a folder, not a privacy ledger; this store's ledger is missing or was moved.")
    if not path.is_file():
        raise StoreError(f"No ledger at '{path}': no run has used this store yet (pass --store to pick another).")
    ledger = Ledger(path)
    names = [d.name for d in ledger.datasets()]
    if dataset is not None and dataset not in names:  # a script asking for one dataset gets an error, not a blank
        held = f"it holds {', '.join(repr(n) for n in names)}" if names else "it holds no dataset yet"
        raise StoreError(f"Dataset '{dataset}' is not in the privacy ledger at '{path}': {held}.")
    return ledger


def _ledger_show(dataset: str | None, store: Path, verbose: bool = False) -> None:
    from privflow import env

    env.set_verbosity(verbose)
    ledger = _ledger_at(store, dataset)
    Console().print(ledger.describe(dataset), highlight=False, soft_wrap=True, markup=False)


@ledger_app.command("curator-notes")
def ledger_curator_notes(
    dataset: Annotated[str | None, typer.Argument(help="Dataset name; all datasets when omitted.")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """CURATOR ONLY: the ledger's notes that depend on the private files' bytes (a dataset's
    content fingerprint changed or came back). Not part of the publishable summary; do not publish."""
    _guarded(verbose, lambda: _ledger_curator_notes(dataset, store, verbose), spends=False)


def _ledger_curator_notes(dataset: str | None, store: Path, verbose: bool = False) -> None:
    from privflow import env
    from privflow.curator import LABEL

    env.set_verbosity(verbose)
    notes = _ledger_at(store, dataset).curator_notes(dataset)
    lines = [LABEL, *(f"{name} {at[:19]}: {message}" for name, at, message in notes)]
    if not notes:
        lines.append("no curator-only notes" + (f" for dataset '{dataset}'" if dataset else ""))
    Console().print("\n".join(lines), highlight=False, soft_wrap=True, markup=False)


@ledger_app.command("set-budget")
def ledger_set_budget(
    dataset: Annotated[str, typer.Argument(help="Dataset name, as its schema's dataset.name.")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="The dataset's new total epsilon.")],
    delta: Annotated[float | None, typer.Option("--delta", help="The new total delta (default: unchanged).")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Change a dataset's total privacy budget on purpose (the data owner's decision): recorded in
    the ledger's notes, every run recomposed at the new delta. A schema can lower the budget by
    itself; only this raises it."""
    _guarded(verbose, lambda: _ledger_set_budget(dataset, epsilon, delta, store, verbose))


def _ledger_set_budget(dataset: str, epsilon: float, delta: float | None, store: Path, verbose: bool) -> None:
    from privflow import env

    env.set_verbosity(verbose)
    from privflow.errors import ConfigError

    ledger = _ledger_at(store, dataset)
    if delta is None:
        delta = next(d.budget_delta for d in ledger.datasets() if d.name == dataset)
    # a total across runs, like the schema's `dataset.budget`: any finite positive figure (a single
    # run's --epsilon has its own limit, privacy.plan.MAX_EPSILON)
    if not (math.isfinite(epsilon) and 0 < epsilon):
        raise ConfigError(f"--epsilon must be a finite number above 0, got {epsilon}.")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise ConfigError(f"--delta must lie strictly between 0 and 1, got {delta}.")
    ledger.set_budget(dataset, epsilon, delta)
    console = Console()
    console.print(ledger.describe(dataset), highlight=False, soft_wrap=True, markup=False)
    spent = ledger.spent(dataset)[0]
    if spent >= epsilon:
        console.print(
            f"note: dataset '{dataset}' has already spent epsilon={spent:.4g}, at least the new budget of "
            f"{epsilon:g}: no further run on it can be charged until the budget is raised.",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )


@app.command()
def audit(
    data: Annotated[Path, typer.Option("--data", help="Input table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML).")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="Total epsilon of the audited configuration.")],
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML).")] = None,
    canaries: Annotated[
        int,
        typer.Option(
            "--canaries", help="Number of gradient canaries m (at least 100: fewer certify no epsilon).", min=100
        ),
    ] = 1000,
    mutate: Annotated[str, typer.Option("--mutate", help="none | noise/10 | no-clip (a check of the check).")] = "none",
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Empirical lower bound on epsilon from one canary training run, beside the claimed one.

    One-run auditing (Steinke, Nasr & Jagielski 2023). No ledger spend, nothing in MLflow;
    the report goes to <store>/audits/<id>.json.
    """
    _guarded(verbose, lambda: _audit(data, schema, epsilon, config, canaries, mutate, store, verbose))


def _audit(
    data: Path,
    schema: Path,
    epsilon: float,
    config: Path | None,
    canaries: int,
    mutate: str,
    store: Path,
    verbose: bool,
) -> None:
    from privflow import env
    from privflow.errors import ConfigError

    env.set_verbosity(verbose)
    if mutate not in ("none", "noise/10", "no-clip"):
        raise ConfigError(f"--mutate must be none, noise/10 or no-clip, not '{mutate}'.")
    overrides = {"data": data, "schema_path": schema, "store": store, "privacy": {"epsilon": epsilon}}
    cfg = _load_config(config, overrides, None)
    from privflow.preflight import preflight_audit

    preflight_audit(cfg, canaries)  # before Prefect or MLflow are imported
    env.configure(cfg.store, verbose=verbose)
    from privflow.flows.audit import audit_pipeline

    env.quiet_imported(verbose)
    r = audit_pipeline(cfg, canaries=canaries, mutation=mutate)
    verdict = "PASS (lower bound <= claimed)" if r.passed else "FAIL (lower bound > claimed epsilon)"
    # the verdict a healthy configuration gives: PASS for the shipped one, FAIL for a mutant
    expected = r.passed == (mutate == "none")
    Console().print(
        f"audit {r.audit_id} ({r.mutation}): {r.canaries} canaries ({r.included} included), {r.correct}/{r.guesses} "
        f"guesses correct -> epsilon >= {r.epsilon_lower_bound:.3f} at {r.confidence:.0%} confidence (delta "
        f"{r.delta:g}); claimed DP-SGD epsilon {r.claimed_epsilon:.3f} (run total {r.run_epsilon:g}). {verdict}. "
        f"Report: {r.report_path}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    if not expected:  # a scheduled or CI audit must see this in the exit status
        raise typer.Exit(EXIT_AUDIT)


# -- dpad: DP anomaly detection by sample-and-aggregate (issue 14; DP-NF section 5, Algorithm 2) --

dpad_app = typer.Typer(
    no_args_is_help=True,
    help="DP anomaly detection by sample-and-aggregate (DP-NF section 5); every query is charged.",
)
app.add_typer(dpad_app, name="dpad")


@dpad_app.command("fit")
def dpad_fit(
    data: Annotated[Path, typer.Option("--data", help="Private table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML); its dataset is charged per query.")],
    partitions: Annotated[int, typer.Option("--partitions", "-k", help="Number of disjoint parts k (one flow each).")],
    epsilon_per_query: Annotated[
        float, typer.Option("--epsilon-per-query", help="Epsilon of each answered query (pure DP).")
    ],
    fpr: Annotated[
        float | None,
        typer.Option("--fpr", help="Each part's threshold: this quantile of its held-out rows (default 0.05)."),
    ] = None,
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="One public log-likelihood threshold for every part instead.")
    ] = None,
    holdout: Annotated[
        float | None,
        typer.Option("--holdout", help="Share of each part's rows held out for its threshold (0.2 with --fpr)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML): model, train.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="dphflow | maf.")] = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Passes over each part.")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Train the DP-AD ensemble (curator-only, charges nothing); register it in the ledger.

    k non-private flows on disjoint parts of the rows (a salted hash per row), each with its own
    threshold; every later query is charged to the schema's dataset (DP-NF section 5, Algorithm 2)."""
    _guarded(
        verbose,
        lambda: _dpad_fit(
            data, schema, partitions, epsilon_per_query, fpr, threshold, holdout, config, model, epochs, store, verbose
        ),
    )


def _dpad_epsilon(value: float) -> None:
    import math

    from privflow.errors import ConfigError
    from privflow.privacy.plan import MAX_EPSILON

    if not (math.isfinite(value) and 0 < value <= MAX_EPSILON):
        raise ConfigError(
            f"--epsilon-per-query must be a positive number of at most {MAX_EPSILON:g}, got {value}. Each answered "
            "query spends it; typical values are 0.1 to 1."
        )


def _dpad_fit(
    data: Path,
    schema_path: Path,
    partitions: int,
    epsilon_per_query: float,
    fpr: float | None,
    threshold: float | None,
    holdout: float | None,
    config_path: Path | None,
    model: str | None,
    epochs: float | None,
    store: Path,
    verbose: bool,
) -> None:
    from privflow import env
    from privflow.errors import ConfigError

    env.set_verbosity(verbose)
    from privflow.preflight import check_store, check_table
    from privflow.privacy.mechanisms.dp_ad import MAX_PARTITIONS
    from privflow.schema import Schema

    _dpad_epsilon(epsilon_per_query)
    if not 2 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"--partitions must be an integer from 2 to {MAX_PARTITIONS}, got {partitions}.")
    if fpr is not None and threshold is not None:
        raise ConfigError("Pass either --fpr (a per-part threshold from held-out rows) or --threshold, not both.")
    overrides = {
        "data": data,
        "schema_path": schema_path,
        "store": store,
        "model": {"name": model},
        "train": {"epochs": epochs},
    }
    cfg = _load_config(config_path, overrides, None)  # its model and train sections; marginals do not apply
    sch = Schema.from_yaml(schema_path)
    check_store(store)
    # format and header only: no row is read or counted (a minimum on private rows would be a
    # refusal one row decides; a part with too few rows trains no flow and votes "normal")
    check_table(data, sch, "Data file")
    from privflow.config import DPAD_MIN_PART_ROWS

    if threshold is None:  # a per-part threshold from held-out rows, by default
        fpr, holdout = (0.05 if fpr is None else fpr), (0.2 if holdout is None else holdout)
    from privflow.privacy.mechanisms.dp_ad import EnsembleSettings  # no Prefect, no MLflow

    try:  # the settings' own ranges first: the row rule below uses the held-out share
        settings = EnsembleSettings(partitions, epsilon_per_query, fpr, threshold, 0.0 if holdout is None else holdout)
    except ValueError as exc:
        raise ConfigError(f"Bad dpad settings: {exc}.") from None
    share = 1.0 - settings.holdout_fraction
    n = sch.dataset.expected_rows  # public: only the schema's declared row count, never the file's
    if n is not None and n // partitions * share < DPAD_MIN_PART_ROWS:  # every part would vote "normal"
        most = int(n * share // DPAD_MIN_PART_ROWS)
        advice = f"Use at most {most} partitions, or a larger table." if most >= 2 else "Use a larger table."
        raise ConfigError(
            f"With --partitions {partitions} and the schema's expected_rows of {n}, each part of about "
            f"{n // partitions} rows gets about {n // partitions * share:.0f} training rows, fewer than the "
            f"{DPAD_MIN_PART_ROWS} a part needs to train a flow: no part could vote, yet every query would be "
            f"charged. {advice}"
        )
    env.configure(store, verbose=verbose)
    from privflow.tasks.dpad import fit_ensemble

    env.quiet_imported(verbose)
    say = Console().print
    ens = fit_ensemble(
        data,
        sch,
        cfg,
        settings,
        store,
        on_part=None if verbose else (lambda i, k: console.print(f"  part {i}/{k} trained", highlight=False)),
    )
    say(
        f"DP-AD ensemble {ens.ensemble_id}: {settings.partitions} non-private flows on disjoint parts of dataset "
        f"'{ens.dataset}', kept curator-only in {ens.folder} (never in MLflow or the registry). Nothing was released "
        f"and nothing was charged; the ensemble is registered in the ledger, and every answered query will cost "
        f"epsilon={settings.epsilon_per_query:g} of the dataset's budget. Score with: privflow dpad score "
        f"--ensemble {ens.ensemble_id} --data NEW.csv -o scored.csv --store {store}. Each part's rows and "
        f"whether it trained (a part with too few rows votes normal) are curator-only, in "
        f"{ens.folder / 'ensemble.json'}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


@dpad_app.command("score")
def dpad_score(
    ensemble: Annotated[str, typer.Option("--ensemble", help="Ensemble id printed by `privflow dpad fit`.")],
    data: Annotated[Path, typer.Option("--data", help="Rows to query (.csv or .parquet) with the schema's columns.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet): rows + anomaly.")],
    svt: Annotated[
        bool, typer.Option("--svt", help="Sparse vector technique: only flagged rows pay; halts after --max-flags.")
    ] = False,
    max_flags: Annotated[
        int | None, typer.Option("--max-flags", help="SVT cutoff c: at most c flags (and c x epsilon) per call.")
    ] = None,
    svt_threshold: Annotated[
        float | None, typer.Option("--svt-threshold", help="SVT threshold in anomalous votes (default k/2).")
    ] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """A DP anomalous/normal answer per row, charged per row (per flag with --svt).

    The ensemble's votes go through Report-Noisy-Max (or the sparse vector technique); the call is
    reserved in the ledger before any vote is counted and refused when the budget cannot hold it."""
    _guarded(verbose, lambda: _dpad_score(ensemble, data, out, svt, max_flags, svt_threshold, store, verbose))


def _dpad_score(
    ensemble: str,
    data: Path,
    out: Path,
    svt: bool,
    max_flags: int | None,
    svt_threshold: float | None,
    store: Path,
    verbose: bool,
) -> None:
    from privflow import env
    from privflow.errors import ConfigError

    env.set_verbosity(verbose)
    from privflow.preflight import check_output

    check_output(out)
    if not svt and (max_flags is not None or svt_threshold is not None):
        raise ConfigError("--max-flags and --svt-threshold belong to the sparse vector option: add --svt.")
    if svt and max_flags is None:
        raise ConfigError(
            "--svt needs --max-flags C: the call halts after C flagged rows, and the ledger reserves C x epsilon "
            "before it starts (only the flags that happen are charged)."
        )
    if max_flags is not None and max_flags < 1:
        raise ConfigError(f"--max-flags must be at least 1, got {max_flags}.")
    env.configure(store, verbose=verbose)
    from privflow.preflight import check_table
    from privflow.tasks.dpad import load_ensemble, score_queries

    env.quiet_imported(verbose)
    ens = load_ensemble(store, ensemble)
    check_table(data, ens.schema, "Data file")  # header against the ensemble's public schema
    mechanism = None
    if svt:
        try:
            mechanism = ens.sparse_vector(int(max_flags), svt_threshold)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"Bad --max-flags/--svt-threshold: {exc}.") from None
    result = score_queries(ens, data, store, mechanism)
    from privflow.io import write_table

    write_table(result.table, out)
    unanswered = result.queries - result.answered
    Console().print(
        f"DP-AD ensemble {ens.ensemble_id}: {result.answered} of {result.queries} rows answered by {result.mechanism}"
        f", {result.flagged} flagged as anomalous"
        + (f", {unanswered} not answered (the SVT cutoff was reached; 'anomaly' is empty)" if unanswered else "")
        + f"; epsilon spent {result.epsilon:.4g} (PLD, this call) on dataset '{result.dataset}' (ledger run "
        f"{result.ledger_run_id}; dataset total now {result.dataset_epsilon:.4g}); wrote {out}. The answers are "
        "differentially private; the flags may be published.",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


class _FastExit:
    """Skip the interpreter's teardown once every exit handler has run.

    After a run, Python frees torch, MLflow, Prefect and the rest module by module before the
    process ends: 1.5-3 s here (issue 15), with nothing left to do. Registered first, this exit
    handler runs last, after the handlers that matter (Prefect stopping its temporary server,
    MLflow ending its run, logging's flush); non-daemon threads were joined before any of them.
    It flushes Python's and C's output buffers and ends the process with the command's status.
    The ledger and MLflow's SQLite stores commit each write when it is made, so nothing is lost.
    Armed only when no other handler was registered before it (logging's own shutdown aside,
    which it calls itself), so a host process (a test runner) keeps its normal exit.
    """

    def __init__(self) -> None:
        self.code = EXIT_INTERNAL  # until main() learns the command's status

    def arm(self) -> bool:
        count = getattr(atexit, "_ncallbacks", None)
        earlier = 1 if "logging" in sys.modules else 0  # logging registers its shutdown at import
        if count is None or count() != earlier:
            return False
        atexit.register(self._exit)
        return True

    def _exit(self) -> None:
        if "logging" in sys.modules:
            import logging

            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            import ctypes

            ctypes.CDLL(None).fflush(None)  # output a C library buffered
        except (OSError, AttributeError):
            pass
        os._exit(self.code)


_FAST_EXIT = _FastExit()


def main() -> None:
    """Entry point: friendly errors, no tracebacks for user mistakes; 130 on Ctrl-C, 143 on SIGTERM."""
    _FAST_EXIT.arm()
    interrupts.install()
    try:
        app()
    except KeyboardInterrupt as exc:
        what, status = _stopped(exc)
        console.print(what, highlight=False)
        _FAST_EXIT.code = status
        sys.exit(status)
    except SystemExit as exc:
        code = exc.code
        _FAST_EXIT.code = code if isinstance(code, int) else (0 if code is None else EXIT_INTERNAL)
        raise
    _FAST_EXIT.code = EXIT_OK


if __name__ == "__main__":
    main()
