"""The one seam between the pipeline's steps and Prefect (flows/steps.py): every step the flows run
has its task options in `STEPS` (private on every step that reads private rows), the local runner
calls the plain function and never imports Prefect, and the Prefect runner calls the step as a
task built once from those options."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from privflow.flows import steps
from privflow.flows.steps import LOCAL, PREFECT, STEPS, StepOptions, options_for, prefect_task, runner_for
from privflow.tasks.mlflow_store import register_model
from privflow.tasks.promote import promote_if_better
from privflow.tasks.run_plan import plan_privacy
from privflow.tasks.validate import validate_data

# the modules that call steps through a runner (`runner(step, ...)`, `PREFECT(step, ...)`)
CALLERS = ("flows.pipeline", "flows.pretrain", "flows.retrain", "tasks.fit", "tasks.stream")
RUNNER_NAMES = {"runner", "PREFECT", "LOCAL"}


def _steps_called(module_name: str) -> set[Callable[..., Any]]:
    """The functions `module_name` hands a runner as its first argument, resolved in the module."""
    module = importlib.import_module(f"privflow.{module_name}")
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RUNNER_NAMES:
            target: Any = module
            for part in ast.unparse(node.args[0]).split("."):
                target = getattr(target, part)
            found.add(target)
    return found


def test_every_step_the_flows_run_has_its_options_and_no_other() -> None:
    called = set().union(*(_steps_called(m) for m in CALLERS))
    assert called == set(STEPS), {getattr(f, "__qualname__", f) for f in called ^ set(STEPS)}


def test_only_the_plan_and_the_registration_are_not_private() -> None:
    """Every other step reads private rows (or a mechanism's input): no persisted result, no cache.
    The plan reads public inputs only; the registration logs released weights."""
    public = {fn for fn, options in STEPS.items() if not options.private}
    assert public == {plan_privacy, register_model}
    names = "plan validate dp_marginals dp_head encode dp_stats dp_prior train select evaluate register promote"
    assert {o.name for o in STEPS.values()} == set(names.split())


def test_the_retry_policies() -> None:
    """Prefect retries registration (2) and the promotion (1, a fresh ledger reservation per
    attempt); in process only registration is retried (module docstring of flows/steps.py)."""
    assert options_for(register_model) == StepOptions("register", False, 2, 2, retried_in_process=True)
    assert options_for(promote_if_better) == StepOptions("promote", True, 1, 2, retried_in_process=False)
    assert [fn for fn, o in STEPS.items() if o.retried_in_process] == [register_model]


def test_the_local_runner_calls_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    def double(x: int, *, times: int = 2) -> int:
        return times * x

    monkeypatch.setitem(STEPS, double, StepOptions("double", private=True))
    assert LOCAL(double, 4) == 8 and LOCAL(double, 4, times=3) == 12
    assert runner_for(False) is LOCAL and runner_for(True) is PREFECT
    assert LOCAL.attempt() == 1 and LOCAL.flow_run() == (None, 1)

    @functools.wraps(double)
    def timed(*args: Any, **kwargs: Any) -> int:  # a wrapper (benchmarks/bench_overhead.py) is its step
        return double(*args, **kwargs)

    assert options_for(timed).name == "double" and LOCAL(timed, 5) == 10
    with pytest.raises(KeyError, match="not a pipeline step"):
        LOCAL(lambda: 1)


def test_the_local_runner_retries_only_what_the_table_says(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("store briefly unavailable")
        return "done"

    monkeypatch.setitem(STEPS, flaky, StepOptions("flaky", retries=2, retry_delay_seconds=0, retried_in_process=True))
    assert LOCAL(flaky) == "done" and len(calls) == 3
    calls.clear()
    monkeypatch.setitem(STEPS, flaky, StepOptions("flaky", retries=2, retry_delay_seconds=0))  # Prefect's only
    with pytest.raises(ConnectionError):
        LOCAL(flaky)
    assert len(calls) == 1


def test_the_prefect_task_carries_the_steps_options() -> None:
    from prefect import Task
    from prefect.cache_policies import NO_CACHE

    built = prefect_task(validate_data)
    assert isinstance(built, Task) and built.name == "validate" and built.fn is validate_data
    assert built.persist_result is False and built.cache_policy is NO_CACHE
    assert prefect_task(validate_data) is built  # built once
    register = prefect_task(register_model)
    assert register.retries == 2 and register.retry_delay_seconds == 2 and register.persist_result is None
    quick = register.with_options(retry_delay_seconds=0)  # Prefect's own API on the task
    assert isinstance(quick, Task) and quick.retries == 2 and quick.retry_delay_seconds == 0
    assert steps.task_run_count() == 1  # outside a task run


def test_the_in_process_pipeline_imports_no_prefect() -> None:
    code = (
        "import sys\n"
        "import privflow.flows.pipeline, privflow.flows.steps, privflow.tasks.promote, privflow.tasks.stream\n"
        "from privflow.flows.steps import LOCAL, StepOptions, task_run_count\n"
        "assert task_run_count() == 1 and LOCAL.attempt() == 1 and LOCAL.flow_run() == (None, 1)\n"
        "assert StepOptions('plan').task_options()['name'] == 'plan'\n"
        "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout
