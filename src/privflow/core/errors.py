"""User-facing errors: each carries a one-paragraph message the CLI prints without a traceback,
and the exit status it ends the `privflow` command with.

`ExitStatus` is the one place the command's exit statuses are defined (the CLI lists them in its
top-level `--help`); each subclass of `PrivflowError` names its status in `exit_status`. Every
`PrivflowError` is a problem the user can fix (input, settings, budget, environment): a usage
error (2) unless it is the ledger refusing a spend (`BudgetExceeded`, 4) or the DP validation
gate stopping a run (`GateStopped`, 5). Anything else is a bug: the CLI calls it an internal error
and exits with status 1 (`status_of`).
"""

from __future__ import annotations

import errno
from enum import IntEnum
from typing import ClassVar


class ExitStatus(IntEnum):
    """The exit statuses of the `privflow` command (`EXIT_STATUS_MEANINGS` says what each means)."""

    OK = 0
    INTERNAL = 1  # an unexpected exception: a bug (also the status of Python's own uncaught exception)
    USAGE = 2  # a user error: bad flag, argument, file, schema, config, store or device (click's status for them)
    CHECK_FAILED = 3  # the command ran and its verdict is not the healthy one (`privflow check`, `privflow audit`)
    BUDGET = 4  # the privacy ledger refused the spend: the dataset's budget cannot hold it
    GATE_STOPPED = 5  # the DP validation gate stopped the run (only the gate's count was charged)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    TERMINATED = 143  # SIGTERM (128 + SIGTERM): a scheduler cancelling the job


EXIT_STATUS_MEANINGS: dict[ExitStatus, str] = {
    ExitStatus.OK: "success",
    ExitStatus.INTERNAL: "internal error: an unexpected problem, a bug (one paragraph; --verbose shows the traceback)",
    ExitStatus.USAGE: "usage error: a bad flag, argument, data file, schema, config, store or device (one paragraph)",
    ExitStatus.CHECK_FAILED: "the check ran and found a problem: `privflow check` found failing rows (or none at "
    "all), or `privflow audit`'s verdict is not the healthy one",
    ExitStatus.BUDGET: "budget refusal: the privacy ledger refused the spend, the dataset's budget cannot hold it",
    ExitStatus.GATE_STOPPED: "gate stop: the DP validation gate stopped the run (only its count's epsilon was "
    "charged; `privflow check` shows the failing rows)",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C)",
    ExitStatus.TERMINATED: "terminated (SIGTERM), unwound like Ctrl-C",
}


class PrivflowError(Exception):
    """Base class for errors caused by the user's input, settings, budget or machine, not by a bug."""

    exit_status: ClassVar[ExitStatus] = ExitStatus.USAGE


class SchemaError(PrivflowError):
    """The schema file does not parse or declares something invalid."""


class DataError(PrivflowError):
    """The data file is unreadable, empty, or does not match the schema."""


class ValidationFailed(DataError):
    """Rows fail the schema's expectations under the strict policy."""


class GateStopped(ValidationFailed):
    """The DP validation gate stopped a run: its noisy count of failing (or passing) rows said stop."""

    exit_status = ExitStatus.GATE_STOPPED


class ConfigError(PrivflowError):
    """A run setting (epsilon, delta, shares, paths) is out of range."""


class StoreError(ConfigError):
    """The store folder (ledger, MLflow database, artifacts) cannot be created or written."""


class DeviceUnavailable(ConfigError):
    """The requested compute device (e.g. CUDA) is not available on this machine."""


class PrivacyPlanError(PrivflowError):
    """The privacy plan cannot meet the requested (epsilon, delta)."""


class BudgetExceeded(PrivflowError):
    """A run would take a dataset past its total privacy budget."""

    exit_status = ExitStatus.BUDGET


class ModelNotFound(PrivflowError):
    """A registered model name, version or alias does not exist."""


def status_of(exc: BaseException) -> ExitStatus:
    """The status the `privflow` command exits with for `exc`: a PrivflowError's own, a full disk
    (`disk_full`) a usage error (the machine's state, which the user can fix), anything else an
    internal error."""
    if isinstance(exc, PrivflowError):
        return exc.exit_status
    if disk_full(exc) is not None:
        return ExitStatus.USAGE
    return ExitStatus.INTERNAL


_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> BaseException | None:
    """The error in `exc`'s chain that says a disk or quota is full (an OSError ENOSPC / EDQUOT,
    or SQLite's "database or disk is full" as MLflow and the ledger wrap it), or None. A full
    disk is the machine's state, not a bug: the CLI words it as a problem the user can fix."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return cur
        if "database or disk is full" in str(cur):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def byte_size(n: float) -> str:
    """A byte count as people read it: '812 kB', '1.8 MB', '37.5 GB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (a library's message can run to pages), or its type's name."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
