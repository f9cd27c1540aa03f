"""Pipeline steps are Prefect tasks only when a flow runs them (tasks/lazy_task.py): the
in-process pipeline never imports Prefect, and the task a flow gets carries the step's options."""

from __future__ import annotations

import subprocess
import sys

from prefect import Task
from prefect.cache_policies import NO_CACHE

from privflow.tasks.lazy_task import LazyTask, task
from privflow.tasks.mlflow_store import register_model
from privflow.tasks.validate import validate_data


def test_the_in_process_pipeline_imports_no_prefect() -> None:
    code = (
        "import sys\n"
        "import privflow.flows.pipeline, privflow.tasks.promote, privflow.tasks.stream\n"
        "from privflow.tasks.lazy_task import task_run_count\n"
        "assert task_run_count() == 1\n"
        "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_private_step_builds_a_task_that_neither_persists_nor_caches() -> None:
    assert isinstance(validate_data, LazyTask) and validate_data.private
    built = validate_data.task
    assert isinstance(built, Task) and built.name == "validate" and built.fn is validate_data.fn
    assert built.persist_result is False and built.cache_policy is NO_CACHE


def test_a_step_keeps_its_retry_policy_and_prefects_options() -> None:
    assert (register_model.retries, register_model.retry_delay_seconds) == (2, 2)
    assert register_model.task.retries == 2 and register_model.task.persist_result is None
    quick = register_model.with_options(retry_delay_seconds=0)  # Prefect's API, on the real task
    assert isinstance(quick, Task) and quick.retries == 2 and quick.retry_delay_seconds == 0


def test_the_task_is_built_from_the_function_at_first_use() -> None:
    def double(x: int) -> int:
        return 2 * x

    step = task(name="double", private=True)(double)
    assert step.fn(4) == 8 and step.__name__ == "double" and "task" not in vars(step)
    step.fn = lambda x: 3 * x  # a wrapper installed before first use (benchmarks/bench_overhead.py)
    assert step.task.fn(4) == 12
