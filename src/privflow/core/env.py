"""Offline, quiet settings for Prefect, MLflow and Great Expectations.

Must run before prefect or mlflow is imported (the CLI and tests' conftest call it first):
these libraries read their settings at import time. Nothing here phones home.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

DEFAULT_HOME = Path(os.environ.get("PRIVFLOW_HOME", Path.cwd() / ".privflow"))

_QUIET = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_UI_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_ENABLE_TELEMETRY": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "GE_USAGE_STATS": "FALSE",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TQDM_DISABLE": "1",
}


def set_verbosity(verbose: bool) -> None:
    """Quiet (the CLI's default) or verbose logging, set before prefect/mlflow/GX are imported.

    Quiet: Prefect logs only CRITICAL (so a PrivflowError raised inside the flow shows no Prefect
    traceback; the CLI prints its message once), MLflow only errors, Python warnings and every
    library's INFO/WARNING records off (Great Expectations sets some of its loggers to INFO
    at import, so a logger level alone does not hold). Verbose: library INFO logs and warnings.
    These override the environment: they are the CLI's explicit --verbose choice.
    """
    level = "INFO" if verbose else "CRITICAL"
    os.environ["PREFECT_LOGGING_LEVEL"] = level
    os.environ["PREFECT_LOGGING_SERVER_LEVEL"] = "WARNING" if verbose else "CRITICAL"
    os.environ["PREFECT_SERVER_LOGGING_LEVEL"] = "WARNING" if verbose else "CRITICAL"
    os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO" if verbose else "ERROR"
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "true" if verbose else "false"
    if verbose:
        logging.disable(logging.NOTSET)
        logging.getLogger("great_expectations").setLevel(logging.INFO)
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    else:
        logging.disable(logging.WARNING)
        warnings.simplefilter("ignore")
        for name in ("great_expectations", "mlflow", "alembic", "absl", "py.warnings"):
            logging.getLogger(name).setLevel(logging.ERROR)


def quiet_imported(verbose: bool) -> None:
    """After mlflow is imported: its event messages ("Successfully registered model ...",
    printed straight to stderr, not through logging) are off unless verbose."""
    import sys

    if not verbose and "mlflow" in sys.modules:
        from mlflow.utils.logging_utils import disable_logging

        disable_logging()


# MLFLOW_TRACKING_URI as the operator left it when privflow was first imported. mlflow's own
# `set_tracking_uri` writes the variable too, so reading it later cannot tell an operator's
# tracking server from the store a previous run in this process pointed MLflow at (which would
# send every later run, whatever its --store, into the first store).
_OPERATOR_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI") or None


def operator_tracking_uri() -> str | None:
    """The tracking server an operator configured (MLFLOW_TRACKING_URI at start-up), or None."""
    return _OPERATOR_TRACKING_URI


def configure(home: Path | str | None = None, verbose: bool | None = None) -> Path:
    """Point every library at a project-local home and switch telemetry off.

    Values already set in the environment win (an operator pointing at real servers keeps
    them); returns the privflow home folder, created if needed. `verbose` True/False also
    applies `set_verbosity` (None leaves logging as it is).
    """
    if verbose is not None:
        set_verbosity(verbose)
    root = Path(home) if home is not None else Path(os.environ.get("PRIVFLOW_HOME", DEFAULT_HOME))
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PRIVFLOW_HOME", str(root))
    prefect_home = root / "prefect"
    prefect_home.mkdir(exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home))
    for key, value in _QUIET.items():
        os.environ.setdefault(key, value)
    if not verbose:  # GX announces every ephemeral context at INFO; keep its warnings.
        logging.getLogger("great_expectations").setLevel(logging.WARNING if verbose is None else logging.ERROR)
    return root
