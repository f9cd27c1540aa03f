"""User-facing errors: each carries a one-paragraph message the CLI prints without a traceback.

Every subclass of `PrivflowError` is a problem the user can fix (input, settings, budget,
environment); the CLI exits with status 2 for all of them. Anything else is a bug: the CLI
calls it an internal error and exits with status 1.
"""

from __future__ import annotations

import errno


class PrivflowError(Exception):
    """Base class for errors caused by the user's input, settings, budget or machine, not by a bug."""


class SchemaError(PrivflowError):
    """The schema file does not parse or declares something invalid."""


class DataError(PrivflowError):
    """The data file is unreadable, empty, or does not match the schema."""


class ValidationFailed(DataError):
    """Rows fail the schema's expectations under the strict policy."""


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


class ModelNotFound(PrivflowError):
    """A registered model name, version or alias does not exist."""


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
