"""`privflow`: run the DP pipeline, sample a registered model, inspect the privacy ledger.

Heavy libraries (torch, prefect, mlflow) are imported inside the commands, so `--help`
stays instant. `run` and `demo` first run the pre-flight checks (`privflow.preflight`):
before Prefect, MLflow or Great Expectations is imported and before the ledger reserves.

Exit statuses are defined once, in `privflow.core.errors.ExitStatus` (each error class names its
own), and listed in the top-level `--help`: 0 success; 1 an unexpected (internal) error, one
paragraph, with the traceback under `--verbose`; 2 a usage error (a bad flag, argument, file,
schema, config, store or device: click's own usage errors and every other `PrivflowError`); 3
`privflow check` found failing rows (or none at all), or `privflow audit`'s verdict is not the
healthy one; 4 the ledger refused a spend (`BudgetExceeded`); 5 the DP validation gate stopped a
run (`GateStopped`); 130 Ctrl-C; 143 SIGTERM (a scheduler cancelling the job), unwound like
Ctrl-C so that the ledger, the MLflow run and the working files are closed as they are then.
Every error but click's usage errors is printed once as one paragraph with no traceback.

One module per command group: `run` (run, demo; `summary` prints a run's result), `pretrain`,
`generate`, `score`, `ledger`, `audit`, `dpad`, `check`; `_common` holds what they share (options, the
error-to-exit-status mapping, config loading). The console script's fast exit lives with the
rest of start-up engineering, in `privflow.core.startup`.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

# the command modules: `privflow.cli.run` is the module, `privflow.cli.run.run` its command (a test
# that replaces a command's body patches it there, where the command looks it up)
from privflow.cli import audit, check, generate, pretrain, run, score
from privflow.cli._common import EXIT_INTERNAL, EXIT_OK, console, exit_status_epilog, promotion_rule, stopped
from privflow.cli.dpad import dpad_app
from privflow.cli.ledger import ledger_app
from privflow.cli.schema import schema_app
from privflow.cli.summary import print_summary
from privflow.core import interrupts
from privflow.core.startup import FAST_EXIT

__all__ = ["print_summary", "promotion_rule", "app", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Differentially private normalizing flows for tabular data, with an honest privacy ledger.",
    epilog=exit_status_epilog(),
)


def _version() -> str:
    """The installed package's version (importlib.metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("privflow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from privflow import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"privflow {_version()}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Differentially private normalizing flows for tabular data, with an honest privacy ledger."""


app.add_typer(ledger_app, name="ledger")
app.command()(run.run)
app.command()(run.demo)
app.command()(pretrain.pretrain)
app.command()(generate.generate)
app.command()(score.score)
app.command()(audit.audit)
app.command()(check.check)
app.add_typer(dpad_app, name="dpad")
app.add_typer(schema_app, name="schema")


def main() -> None:
    """Entry point: friendly errors, no tracebacks for user mistakes; 130 on Ctrl-C, 143 on SIGTERM."""
    FAST_EXIT.arm()
    interrupts.install()
    try:
        app()
    except KeyboardInterrupt as exc:
        what, status = stopped(exc)
        console.print(what, highlight=False)
        FAST_EXIT.code = status
        sys.exit(status)
    except SystemExit as exc:
        code = exc.code
        FAST_EXIT.code = code if isinstance(code, int) else (0 if code is None else EXIT_INTERNAL)
        raise
    FAST_EXIT.code = EXIT_OK
