"""The training pipeline as a Prefect flow: the chain of flows/pipeline.py with each step a
task run, for a Prefect server, a deployment (infra/deployments.py) and `privflow run
--engine prefect`. Without a Prefect API, `privflow run` calls `pipeline.train_in_process` instead
and never imports this module (nor Prefect).
"""

from __future__ import annotations

from prefect import flow

from privflow.core.config import RunConfig
from privflow.flows.pipeline import RunSummary, run_pipeline


@flow(name="privflow-train")
def train_pipeline(config: RunConfig, show_progress: bool = True) -> RunSummary:
    """Run the whole chain once as a Prefect flow, each step a task run; raises a PrivflowError
    subclass on bad input or budget."""
    return run_pipeline(config, show_progress, engine=True)


__all__ = ["train_pipeline"]
