"""What every `privflow` command shares: the error console, the exit statuses (defined once, in
`privflow.core.errors.ExitStatus`) and the mapping of errors to them (`guarded`), the typed
choices of the options that take one of a fixed set of values, the `--store` and `--verbose`
options, the deprecation notes of renamed options, and the run configuration read from `--config`
with the command line's flags on top."""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from privflow.core import interrupts
from privflow.core.errors import EXIT_STATUS_MEANINGS, ExitStatus

console = Console(stderr=True)

# the names the commands use; the statuses themselves are ExitStatus's (core/errors.py)
EXIT_OK = ExitStatus.OK
EXIT_INTERNAL = ExitStatus.INTERNAL
EXIT_USER = ExitStatus.USAGE
EXIT_INTERRUPTED = ExitStatus.INTERRUPTED
EXIT_TERMINATED = ExitStatus.TERMINATED
# `privflow audit`: the shipped configuration failed, or a mutant was not caught; `privflow check`
# (its EXIT_ROWS_FAIL): rows fail. The command ran; its verdict is not the healthy one.
EXIT_AUDIT = ExitStatus.CHECK_FAILED


def exit_status_epilog() -> str:
    """The top-level `--help`'s list of exit statuses, from ExitStatus (paragraphs: one line each)."""
    lines = ["Exit statuses:"]
    lines += [f"{int(status)}: {meaning}." for status, meaning in EXIT_STATUS_MEANINGS.items()]
    return "\n\n".join(lines)


# -- typed choices: `--help` lists them, a bad value is click's usage error (exit 2) ---------------


class Flow(StrEnum):
    """The flow family (the config's model.name)."""

    dphflow = "dphflow"
    maf = "maf"


class Policy(StrEnum):
    """What the validation gate does with failing rows (the config's policy)."""

    strict = "strict"
    quarantine = "quarantine"


class Device(StrEnum):
    """Where torch runs (the config's train.device)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Promote(StrEnum):
    """When the registry alias moves to the new version (the config's promotion)."""

    if_better = "if-better"
    always = "always"
    never = "never"


class Mutation(StrEnum):
    """`privflow audit --mutate`: none, or a deliberately broken DP-SGD the audit must catch."""

    none = "none"
    noise_10 = "noise/10"
    no_clip = "no-clip"


class Engine(StrEnum):
    """How `privflow run` and `demo` run the pipeline: under Prefect's engine or in this process."""

    prefect = "prefect"
    local = "local"


def choice_value(choice: Enum | str | None) -> str | None:
    """A typed choice's value as the config spells it (None: not given)."""
    return choice.value if isinstance(choice, Enum) else choice


def deprecation_note(text: str) -> None:
    """One line on stderr (a deprecation note, never wrapped)."""
    from rich.markup import escape

    console.print(f"[bold yellow]note:[/] {escape(text)}", highlight=False, soft_wrap=True)


def from_environment(ctx: typer.Context, name: str) -> bool:
    """Whether the command's parameter `name` took its value from its environment variable."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "ENVIRONMENT"


# click's usage error, as typer runs it (its own copy of click in recent typer): its usage line and
# message, exit 2; `privflow` raises it for flags that contradict each other
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def usage_error(ctx: typer.Context | None, message: str) -> Exception:
    """click's usage error for the command of `ctx`: its usage line, the message, exit 2."""
    return UsageError(message, ctx)


def flow_choice(ctx: typer.Context | None, flow: Flow | None, model: Flow | None) -> str | None:
    """--flow, or its deprecated spelling --model (with a one-line note on stderr); both, naming
    different families: a usage error."""
    if model is not None:
        if flow is not None and flow is not model:
            raise usage_error(
                ctx,
                f"--flow {flow.value} and --model {model.value} (its deprecated spelling) name different flow "
                "families; give --flow alone.",
            )
        deprecation_note(
            f"--model {model.value} is deprecated here: use --flow {model.value} (the flow family). --model names a "
            "registered model in `privflow generate` and `privflow score`."
        )
    return choice_value(flow if flow is not None else model)


FlowOpt = Annotated[
    Flow | None,
    typer.Option("--flow", help="The flow family (default dphflow, or --config's model.name).", case_sensitive=False),
]
# hidden, deprecated: the family's old spelling, still accepted (scheduled deployments call it)
ModelFamilyOpt = Annotated[
    Flow | None,
    typer.Option("--model", hidden=True, help="Deprecated: use --flow.", case_sensitive=False),
]


def stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The message and exit status of an interrupted command."""
    if isinstance(exc, interrupts.Terminated):
        return "terminated (SIGTERM).", EXIT_TERMINATED
    return "interrupted (Ctrl-C).", EXIT_INTERRUPTED


TrainDeviceOpt = Annotated[
    Device | None,
    typer.Option(
        "--device",
        help="Where training runs (auto: CUDA when present). Default auto, or --config's train.device.",
        case_sensitive=False,
    ),
]
StoreOpt = Annotated[
    Path, typer.Option("--store", help="Folder for the MLflow SQLite store, artifacts, ledger and synthetic tables.")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show library logs, warnings and tracebacks.")]


_LONG_WORD = 300  # characters: longer runs (a garbage header echoed from a file) are cut to 120


def paragraph(text: str) -> str:
    """One line; any run of non-space characters longer than _LONG_WORD shortened, saying so."""

    def cut(m: re.Match[str]) -> str:
        word = m.group()
        return f"{word[:120]}... ({len(word):,} characters)"

    return re.sub(rf"\S{{{_LONG_WORD + 1},}}", cut, " ".join(str(text).split()))


def _fail(message: str, code: int = EXIT_USER) -> None:
    from rich.markup import escape

    # the message is text, not markup: "[low, high]" or a value in brackets must print as it is
    console.print(f"[bold red]error:[/] {escape(paragraph(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(verbose: bool, body: Callable[[], Any], spends: bool = True) -> Any:
    """Run a command body with the CLI's exit-status contract (`privflow.cli`'s docstring); `spends`: the
    command can charge the ledger (an interrupted one says where its charges are)."""
    from privflow.core.errors import PrivflowError, disk_full, status_of

    try:
        return body()
    except (typer.Exit, typer.Abort, _CLICK_ERROR):  # click's own errors: its message and status (2)
        raise
    except KeyboardInterrupt as exc:
        interrupts.quiet_after_interrupt()  # also where a library's own SIGINT handler raised it
        if verbose:
            traceback.print_exc()
        what, status = stopped(exc)
        spent = " Any privacy already spent by the run stays recorded in the ledger; see `privflow ledger show`."
        console.print(f"{what}{spent if spends else ''}", highlight=False, soft_wrap=True)
        raise typer.Exit(status) from None
    except PrivflowError as exc:
        if verbose:
            traceback.print_exc()
        _fail(str(exc), status_of(exc))
    except Exception as exc:  # noqa: BLE001 - the one place a bug becomes a message
        if verbose:
            traceback.print_exc()
        full = disk_full(exc)
        if full is not None:
            _fail(
                f"out of disk space ({paragraph(str(full))[:300]}). Free some space, or point --store (and -o) at a "
                "disk with room, and rerun. No partial output table is left under its name; any privacy a run had "
                "already spent stays recorded in the ledger (`privflow ledger show`).",
                status_of(exc),
            )
        detail = paragraph(f"{type(exc).__name__}: {exc}")[:400]
        _fail(
            f"internal error: privflow hit an unexpected problem ({detail}). This is a bug, not a problem with "
            "your input; rerun with --verbose to see the traceback, and report it with that output.",
            status_of(exc),
        )


def promotion_rule(value: str | None) -> str | None:
    """--promote if-better|always|never -> the config's value (one the config accepts)."""
    if value is None:
        return None
    from typing import get_args

    from privflow.core.config import RunConfig, promotion_key
    from privflow.core.errors import ConfigError

    key = promotion_key(value)
    if key not in get_args(RunConfig.model_fields["promotion"].annotation):
        raise ConfigError(f"--promote must be one of if-better, always, never; got '{value}'.")
    return key


def _merge(base: dict, overrides: dict, where: str = "") -> dict:
    """The config file's settings with the command line's on top (None: not given)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict):
            section = out.get(key)
            if section is not None and not isinstance(section, dict):
                from privflow.core.errors import ConfigError

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


def load_config(config_path: Path | None, overrides: dict, promote: str | None) -> Any:
    from privflow.core.config import RunConfig
    from privflow.core.errors import ConfigError

    base: dict = {}
    if config_path is not None:
        from privflow.core.yaml_file import read_mapping

        if not config_path.is_file():
            raise ConfigError(f"Config file '{config_path}' does not exist or is not a file.")
        base = read_mapping(config_path, "Config file", ConfigError)
    promotion = promotion_rule(promote)
    if promotion is not None:
        overrides = {**overrides, "promotion": promotion}
    return RunConfig.build(**_merge(base, overrides))
