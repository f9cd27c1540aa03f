"""Registry look-ups for the CLI: resolve NAME@ALIAS or NAME/VERSION to a loaded sampler."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from privflow.errors import ModelNotFound


def model_uri(spec: str) -> str:
    """NAME@ALIAS -> models:/NAME@ALIAS; NAME/VERSION -> models:/NAME/VERSION."""
    if "@" in spec:
        name, alias = spec.split("@", 1)
        if name and alias:
            return f"models:/{name}@{alias}"
    elif "/" in spec:
        name, version = spec.rsplit("/", 1)
        if name and version.isdigit():
            return f"models:/{name}/{version}"
    raise ModelNotFound(f"'{spec}' is not a model reference: use NAME@ALIAS (e.g. privflow-adult@champion) or NAME/VERSION.")


def load_generator(spec: str, store: Path) -> Any:
    """Load the registered pyfunc sampler from the store's MLflow registry."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = model_uri(spec)
    db = store.resolve() / "mlflow.db"
    if "MLFLOW_TRACKING_URI" not in os.environ:
        if not db.exists():
            raise ModelNotFound(f"No MLflow store at '{db}': run `privflow run` (or `privflow demo`) first.")
        mlflow.set_tracking_uri(f"sqlite:///{db}")
        mlflow.set_registry_uri(f"sqlite:///{db}")
    try:
        return mlflow.pyfunc.load_model(uri)
    except MlflowException as exc:
        raise ModelNotFound(f"Model '{spec}' was not found in the registry ({exc.message.splitlines()[0]}).") from None
