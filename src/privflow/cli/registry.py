"""Registry look-ups for the CLI's `generate` command; the code lives in the MLflow module
(`privflow.tasks.mlflow_store`)."""

from privflow.tasks.mlflow_store import load_generator, model_uri

__all__ = ["load_generator", "model_uri"]
