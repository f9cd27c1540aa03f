"""register: log the run to MLflow and register the released generator under an alias."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import torch
from mlflow import MlflowClient
from prefect import task

from privflow import models
import privflow
from privflow.sampler import FlowSampler
from privflow.schema import Schema
from privflow.tasks.promote import alias_holder

_REQUIREMENTS = ["torch>=2.13", "polars>=2.1", "pydantic>=2.6", "pyyaml>=6", "numpy", "pandas", "mlflow>=3.17,<3.18"]


def tracking(store: Path) -> str:
    """Point MLflow at the SQLite store under `store` (or at MLFLOW_TRACKING_URI when an
    operator set one, e.g. a real tracking server); returns the URI."""
    store.mkdir(parents=True, exist_ok=True)
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store.resolve() / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def experiment_for(dataset: str, store: Path) -> str:
    """The dataset's experiment, with artifacts under the store (not ./mlruns of the cwd)."""
    name = f"privflow-{dataset}"
    client = MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is None:
        # Against a tracking server, artifacts go through its --artifacts-destination.
        remote = mlflow.get_tracking_uri().startswith(("http://", "https://"))
        location = None if remote else (store.resolve() / "artifacts").as_uri()
        client.create_experiment(name, artifact_location=location)
    mlflow.set_experiment(name)
    return name


# The parts of privflow/ the sampler imports; bundled without the demo data or the CLI.
_SAMPLER_MODULES = ("__init__.py", "codec.py", "errors.py", "sampler.py", "sampler_model.py", "schema.py")


def _sampler_package(tmp: Path) -> str:
    """A `privflow` package with just what the sampler imports: the table layer and models/."""
    pkg = tmp / "code" / "privflow"
    pkg.mkdir(parents=True)
    for module in _SAMPLER_MODULES:
        shutil.copy(Path(privflow.__file__).parent / module, pkg / module)
    shutil.copytree(Path(models.__file__).parent, pkg / "models", ignore=shutil.ignore_patterns("__pycache__"))
    return str(pkg)


@dataclass(frozen=True)
class Registered:
    """The new version, the version holding the alias afterwards, and why."""

    version: str
    alias_version: str | None
    promotion: str


def signature_for(schema: Schema) -> Any:
    """The pyfunc signature from the PUBLIC schema (never inferred from rows)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec
    from mlflow.types import Schema as MLSchema

    kinds = {"numeric": "double", "integer": "long"}
    inputs = MLSchema([ColSpec("long", "n"), ColSpec("long", "seed", required=False)])
    outputs = MLSchema([ColSpec(kinds.get(c.type, "string"), c.name) for c in schema.columns])
    return ModelSignature(inputs=inputs, outputs=outputs)


@task(name="register", retries=2, retry_delay_seconds=2)
def register_model(
    name: str,
    alias: str,
    schema: Schema,
    model_name: str,
    model_config: dict[str, Any],
    states: list[dict],
    tags: dict[str, str],
    promotion: str = "if_better",
) -> Registered:
    """Log the selected checkpoint(s) as a pyfunc sampler, register a version, maybe set the alias.

    Safe to retry: it only writes DP outputs (weights chosen by Report-Noisy-Max) and the
    public schema, so a retry spends no privacy. `if_better` sets the alias here only when no
    version holds it (no comparison, no cost); otherwise the flow runs the DP comparison.
    """
    with tempfile.TemporaryDirectory() as tmp:
        artifacts: dict[str, str] = {}
        for i, state in enumerate(states):
            path = Path(tmp) / f"checkpoint_{i}.pt"
            torch.save({k: v.detach().cpu() for k, v in state.items()}, path)
            artifacts[f"checkpoint_{i}"] = str(path)
        meta = {
            "schema": schema.model_dump(mode="json"),
            "model": {"name": model_name, "config": model_config},
            "checkpoints": list(artifacts),
        }
        (Path(tmp) / "meta.json").write_text(json.dumps(meta))
        artifacts["meta"] = str(Path(tmp) / "meta.json")
        info = mlflow.pyfunc.log_model(
            name="generator",
            python_model=str(Path(privflow.__file__).parent / "sampler_model.py"),  # models from code
            artifacts=artifacts,
            code_paths=[_sampler_package(Path(tmp))],
            pip_requirements=_REQUIREMENTS,
            signature=signature_for(schema),
            registered_model_name=name,
        )
    version = str(info.registered_model_version)
    client = MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    # The registered model carries the dataset's running total too (latest known figure).
    if "dataset_epsilon_cumulative" in tags:
        client.set_registered_model_tag(name, "dataset_epsilon_cumulative", tags["dataset_epsilon_cumulative"])
    holder = alias_holder(client, name, alias)
    if promotion == "always" or (promotion == "if_better" and holder is None):
        client.set_registered_model_alias(name, alias, version)
        why = "every new version takes it (--promote always)" if promotion == "always" else (
            "no version held it yet: the first one takes it at no cost")
        client.set_model_version_tag(name, version, "promoted", f"alias '{alias}' set: {why}")
        return Registered(version, version, f"@{alias} moved to v{version}: {why}")
    if promotion == "never":
        return Registered(version, holder, f"@{alias} left on {_v(holder)} (--promote never)")
    return Registered(version, holder, f"@{alias} on {_v(holder)}: awaiting the DP comparison")


def _v(version: str | None) -> str:
    return f"v{version}" if version is not None else "no version"

