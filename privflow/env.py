"""Offline, quiet settings for Prefect, MLflow and Great Expectations.

Must run before prefect or mlflow is imported (the CLI and tests' conftest call it first):
these libraries read their settings at import time. Nothing here phones home.
"""

from __future__ import annotations

import logging
import os
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


def configure(home: Path | str | None = None) -> Path:
    """Point every library at a project-local home and switch telemetry off.

    Values already set in the environment win (an operator pointing at real servers keeps
    them); returns the privflow home folder, created if needed.
    """
    root = Path(home) if home is not None else Path(os.environ.get("PRIVFLOW_HOME", DEFAULT_HOME))
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PRIVFLOW_HOME", str(root))
    prefect_home = root / "prefect"
    prefect_home.mkdir(exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home))
    for key, value in _QUIET.items():
        os.environ.setdefault(key, value)
    # GX announces every ephemeral context at INFO; keep its warnings.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    return root
