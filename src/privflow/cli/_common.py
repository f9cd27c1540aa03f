"""What every `privflow` command shares: the error console, the exit statuses and the mapping of
errors to them (`_guarded`), the `--store` and `--verbose` options, and the run configuration
read from `--config` with the command line's flags on top."""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from privflow.core import interrupts

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
    """Run a command body with the CLI's exit-status contract (`privflow.cli`'s docstring); `spends`: the
    command can charge the ledger (an interrupted one says where its charges are)."""
    from privflow.core.errors import PrivflowError, disk_full

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


def _load_config(config_path: Path | None, overrides: dict, promote: str | None) -> Any:
    from privflow.core.config import RunConfig
    from privflow.core.errors import ConfigError

    base: dict = {}
    if config_path is not None:
        from privflow.core.yaml_file import read_mapping

        if not config_path.is_file():
            raise ConfigError(f"Config file '{config_path}' does not exist or is not a file.")
        base = read_mapping(config_path, "Config file", ConfigError)
    promotion = _promotion(promote)
    if promotion is not None:
        overrides = {**overrides, "promotion": promotion}
    return RunConfig.build(**_merge(base, overrides))
