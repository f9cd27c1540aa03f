"""plan: split the run's (epsilon, delta) over the stages that read private rows.

Uses only public inputs (the configuration and the schema's expected row count), so it
runs, and is recorded, before any private value is read. The plan itself is built by
``tasks.run_plan`` (also used by the pre-flight check, without Prefect).
"""

from __future__ import annotations

from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.privacy.accounting.plan import PrivacyPlan
from privflow.tasks.lazy_task import task
from privflow.tasks.run_plan import run_plan, sgd_shape


@task(name="plan")
def plan_privacy(config: RunConfig, schema: Schema) -> PrivacyPlan:
    """Calibrate every stage's noise so that their composition meets the target."""
    return run_plan(config, schema)


__all__ = ["plan_privacy", "sgd_shape"]
