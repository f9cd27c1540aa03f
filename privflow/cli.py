"""`privflow`: run the DP pipeline, sample a registered model, inspect the privacy ledger.

Heavy libraries (torch, prefect, mlflow) are imported inside the commands, so `--help`
stays instant. User errors print one paragraph and exit with status 2, never a traceback.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Differentially private normalizing flows for tabular data, with an honest privacy ledger.",
)
ledger_app = typer.Typer(no_args_is_help=True, help="Inspect the per-dataset privacy ledger.")
app.add_typer(ledger_app, name="ledger")
console = Console(stderr=True)

StoreOpt = Annotated[
    Path, typer.Option("--store", help="Folder for the MLflow SQLite store, artifacts, ledger and synthetic tables.")
]


def demo_paths() -> tuple[Path, Path, Path]:
    """The bundled Adult train file, its schema and the test file."""
    root = Path(str(resources.files("privflow") / "demo"))
    return root / "adult_train.csv", root / "adult.yaml", root / "adult_test.csv"


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def run(
    data: Annotated[Path, typer.Option("--data", help="Input table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML).")],
    epsilon: Annotated[Optional[float], typer.Option("--epsilon", help="Total epsilon of this run.")] = None,
    delta: Annotated[Optional[float], typer.Option("--delta", help="Total delta of this run.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="Run configuration (YAML); flags override it.")] = None,
    test_data: Annotated[Optional[Path], typer.Option("--test-data", help="Real test table for utility diagnostics.")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="strict | quarantine (bad rows set aside).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="dphflow | maf.")] = None,
    epochs: Annotated[Optional[float], typer.Option("--epochs", help="Passes over the data (public row count).")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto | cpu | cuda.")] = None,
    model_name: Annotated[Optional[str], typer.Option("--model-name", help="Registered model name.")] = None,
    alias: Annotated[Optional[str], typer.Option("--alias", help="Registry alias for the new version.")] = None,
    store: StoreOpt = Path(".privflow"),
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Validate, train a DP flow, select a checkpoint, evaluate, and register it in MLflow."""
    overrides = {
        "data": data,
        "schema_path": schema,
        "policy": policy,
        "store": store,
        "model_name": model_name,
        "alias": alias,
        "privacy": {"epsilon": epsilon, "delta": delta},
        "model": {"name": model},
        "train": {"epochs": epochs, "device": device},
        "evaluate": {"test_data": test_data},
    }
    _run(config, overrides, quiet)


@app.command()
def demo(
    store: StoreOpt = Path(".privflow"),
    epsilon: Annotated[float, typer.Option("--epsilon")] = 1.0,
    delta: Annotated[float, typer.Option("--delta")] = 1e-5,
    config: Annotated[Optional[Path], typer.Option("--config", help="Run configuration (YAML).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
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
    _run(config, overrides, quiet)


def _merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict):
            merged = _merge(out.get(key) or {}, value)
            if merged:
                out[key] = merged
        elif value is not None:
            out[key] = value
    return out


def _run(config_path: Path | None, overrides: dict, quiet: bool) -> None:
    from privflow import env
    from privflow.config import RunConfig
    from privflow.errors import ConfigError, PrivflowError

    base: dict = {}
    if config_path is not None:
        import yaml

        try:
            base = yaml.safe_load(config_path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            _fail(f"Config file '{config_path}' cannot be read: {exc}")
    try:
        cfg = RunConfig.build(**_merge(base, overrides))
    except ConfigError as exc:
        _fail(str(exc))
    # Cheap checks first, so a typo costs no Prefect start-up.
    from privflow.schema import Schema

    try:
        Schema.from_yaml(cfg.schema_path)
        if not cfg.data.is_file():
            raise ConfigError(f"Data file '{cfg.data}' does not exist.")
    except PrivflowError as exc:
        _fail(str(exc))
    env.configure(cfg.store)
    console.print(f"[bold]privflow[/] training on [cyan]{cfg.data}[/] at epsilon={cfg.privacy.epsilon:g}, "
                  f"delta={cfg.privacy.delta:g}; store {cfg.store.resolve()}", highlight=False)
    try:
        from flows.train import train_pipeline

        summary = train_pipeline(cfg, show_progress=not quiet)
    except PrivflowError as exc:
        _fail(str(exc))
    _print_summary(summary)


def _print_summary(summary: object) -> None:
    from rich.table import Table

    s = summary  # RunSummary
    out = Console()
    table = Table(title="privflow run", show_header=False)
    table.add_row("epsilon (PLD, reported)", f"{s.epsilon:.4f} at delta={s.delta:g}")
    table.add_row("epsilon (RDP cross-check)", f"{s.epsilon_rdp:.4f}")
    for stage, eps in s.stages.items():
        table.add_row(f"  stage {stage}", f"{eps:.4f} alone")
    table.add_row("dataset cumulative epsilon", f"{s.dataset_epsilon:.4f}")
    table.add_row("registered model", f"{s.model_name} v{s.model_version} @{s.alias}")
    table.add_row("synthetic table", s.synthetic_path)
    if s.report_path:
        table.add_row("diagnostics (not DP)", s.report_path)
    for key in ("utility/macro_f1_mean", "utility/auroc_mean", "utility/ap_mean", "likelihood/test_nats_per_row",
                "fidelity/tv_mean"):
        if key in s.metrics:
            table.add_row(key, f"{s.metrics[key]:.4f}")
    table.add_row("rows quarantined", str(s.rows_quarantined))
    table.add_row("wall time", f"{s.wall_seconds:.1f} s")
    out.print(table)


@app.command()
def generate(
    model: Annotated[str, typer.Option("--model", help="NAME@ALIAS or NAME/VERSION of a registered model.")],
    n: Annotated[int, typer.Option("-n", help="Number of rows to sample.", min=1)],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet).")],
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed for reproducible samples.")] = None,
    store: StoreOpt = Path(".privflow"),
) -> None:
    """Sample synthetic rows from a registered model (never touches the training data)."""
    from privflow import env

    env.configure(store)
    from privflow.errors import PrivflowError
    from privflow.registry import load_generator

    if out.suffix.lower() not in (".csv", ".parquet", ".pq"):
        _fail(f"Output '{out}' must end in .csv or .parquet.")
    try:
        generator = load_generator(model, store)
    except PrivflowError as exc:
        _fail(str(exc))
    import pandas as pd

    frame = generator.predict(pd.DataFrame({"n": [n], **({"seed": [seed]} if seed is not None else {})}))
    import polars as pl

    from privflow.io import write_table

    write_table(pl.from_pandas(frame), out)
    Console().print(f"wrote {len(frame)} rows to {out}")


@ledger_app.command("show")
def ledger_show(
    dataset: Annotated[Optional[str], typer.Argument(help="Dataset name; all datasets when omitted.")] = None,
    store: StoreOpt = Path(".privflow"),
) -> None:
    """Runs, their privacy events and the cumulative (epsilon, delta), per dataset."""
    from privacy.ledger import Ledger

    path = store / "ledger.db"
    if not path.exists():
        _fail(f"No ledger at '{path}': no run has used this store yet.")
    Console().print(Ledger(path).describe(dataset), highlight=False, soft_wrap=True)


def main() -> None:
    """Entry point: friendly errors, no tracebacks for user mistakes."""
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
