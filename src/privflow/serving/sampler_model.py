"""MLflow "models from code" entry point: the released sampler, defined by code, not a pickle."""

import mlflow

from privflow.serving.pyfunc import FlowSampler

mlflow.models.set_model(FlowSampler())
