"""User-facing errors: each carries a one-paragraph message the CLI prints without a traceback.

Every subclass of `PrivflowError` is a problem the user can fix (input, settings, budget,
environment); the CLI exits with status 2 for all of them. Anything else is a bug: the CLI
calls it an internal error and exits with status 1.
"""

from __future__ import annotations


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
