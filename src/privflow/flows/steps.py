"""The one seam between the pipeline's steps and Prefect: each step's task options, and the
runner that calls a step either way.

The steps are plain functions in tasks/ (no decorator, no Prefect import). `STEPS` gives each one
its Prefect task options, keyed by the function. A `Runner` calls a step (core/steps.py,
`StepRunner`; the tasks that chain steps take it as a parameter):

- `LOCAL` (`privflow run --engine local`, `train_in_process`): the function itself, in this
  process. Prefect is never imported: it adds to the fixed cost of every start
  (benchmarks/results/overhead.md).
- `PREFECT` (inside a flow run, flows/train.py): the step as a Prefect task, built once from the
  function and its options with `prefect.task(fn, ...)`, so a call is a task run and Prefect's
  own retries apply.

Steps that touch private rows never persist or cache their results (`private=True`: no raw rows
in a result store, and a cached mechanism output would hide a second data access).

Retries: Prefect retries a step as its options say. In process one step is retried too, by
`LOCAL` from the same options: registration (`retried_in_process`), which spends no privacy and
comes after the run's budget is settled, so that a passing failure of the MLflow store does not
lose a spent run. The promotion comparison is not retried in process: its retry reserves under
the attempt's number, which is Prefect's task run count (tasks/promote.py).
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from privflow.core.steps import first_attempt
from privflow.tasks.encode import encode_rows
from privflow.tasks.evaluation.stage import evaluate_run
from privflow.tasks.head_stage import dp_target_head, fit_head_planned
from privflow.tasks.marginals_stage import codec_from_counts, dp_marginal_codec
from privflow.tasks.mlflow_store import register_model
from privflow.tasks.prior_stage import dp_prior
from privflow.tasks.promote import promote_if_better
from privflow.tasks.run_plan import plan_privacy
from privflow.tasks.select import select_checkpoints
from privflow.tasks.stats_stage import dp_statistics
from privflow.tasks.stream import encode_chunks, first_pass
from privflow.tasks.train import train_flow_model
from privflow.tasks.validate import validate_data

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOptions:
    """A step's Prefect task options (`name`, `retries`, `retry_delay_seconds`; `private`: no
    result persisted, no cache) and whether the in-process runner retries it too."""

    name: str
    private: bool = False
    retries: int = 0
    retry_delay_seconds: float = 0
    retried_in_process: bool = False  # `LOCAL` retries it as Prefect would (module docstring)

    def task_options(self) -> dict[str, Any]:
        """The keyword arguments of `prefect.task` (imports Prefect when private)."""
        options: dict[str, Any] = {
            "name": self.name,
            "retries": self.retries,
            "retry_delay_seconds": self.retry_delay_seconds,
        }
        return {**options, **private_options()} if self.private else options


def private_options() -> dict[str, Any]:
    """Prefect task options for work on private rows: no result persisted, no cache."""
    from prefect.cache_policies import NO_CACHE

    return {"persist_result": False, "cache_policy": NO_CACHE}


# Every step the pipelines run through a runner (flows/pipeline.py, flows/pretrain.py,
# flows/retrain.py, and through them tasks/fit.py and tasks/stream.py).
STEPS: dict[Callable[..., Any], StepOptions] = {
    plan_privacy: StepOptions("plan"),
    validate_data: StepOptions("validate", private=True),
    first_pass: StepOptions("validate", private=True),  # a streamed run's validation
    dp_marginal_codec: StepOptions("dp_marginals", private=True),
    codec_from_counts: StepOptions("dp_marginals", private=True),  # streamed: from the first pass's counts
    dp_target_head: StepOptions("dp_head", private=True),
    fit_head_planned: StepOptions("dp_head", private=True),  # streamed: from the head's rows on disk
    encode_rows: StepOptions("encode", private=True),
    encode_chunks: StepOptions("encode", private=True),  # streamed
    dp_statistics: StepOptions("dp_stats", private=True),
    dp_prior: StepOptions("dp_prior", private=True),
    train_flow_model: StepOptions("train", private=True),
    select_checkpoints: StepOptions("select", private=True),
    evaluate_run: StepOptions("evaluate", private=True),
    register_model: StepOptions("register", retries=2, retry_delay_seconds=2, retried_in_process=True),
    promote_if_better: StepOptions("promote", private=True, retries=1, retry_delay_seconds=2),
}


def options_for(fn: Callable[..., Any]) -> StepOptions:
    """The options of the step `fn` (a wrapper made with functools.wraps counts as its function)."""
    options = STEPS.get(inspect.unwrap(fn))
    if options is None:
        raise KeyError(f"{getattr(fn, '__qualname__', fn)!r} is not a pipeline step: give it its options in STEPS")
    return options


_TASKS: dict[Callable[..., Any], Any] = {}  # the Prefect task of each step function, built once


def prefect_task(fn: Callable[P, R]) -> Any:
    """The Prefect task of the step `fn`, with its options (imports Prefect)."""
    built = _TASKS.get(fn)
    if built is None:
        from prefect import task

        built = _TASKS[fn] = task(fn, **options_for(fn).task_options())
    return built


def task_run_count() -> int:
    """The current Prefect task run's attempt number, 1 outside a task run. Without Prefect
    imported there is no task run in this process, so Prefect is not imported to ask."""
    if "prefect" not in sys.modules:
        return 1
    from prefect.runtime import task_run

    return int(task_run.run_count or 1)


class Runner(ABC):
    """Calls pipeline steps (a `StepRunner`, core/steps.py) and answers what a run asks of the
    engine it runs under: the flow run and the current attempt."""

    @abstractmethod
    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    @abstractmethod
    def attempt(self) -> int:
        """The attempt number of the step running now (a retried step reserves per attempt)."""

    @abstractmethod
    def flow_run(self) -> tuple[str | None, int | None]:
        """The flow run's (id, attempt); (None, 1) where there is none."""


class LocalRunner(Runner):
    """Each step's function, called in this process; Prefect is not imported."""

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        options = options_for(fn)
        retries = options.retries if options.retried_in_process else 0
        for attempt in range(1, retries + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - retried as Prefect would; the last attempt raises
                log.warning(
                    "step %s failed (%s: %s), retry %d of %d", options.name, type(exc).__name__, exc, attempt, retries
                )
                time.sleep(options.retry_delay_seconds)
        return fn(*args, **kwargs)

    def attempt(self) -> int:
        return first_attempt()  # no step whose attempt counts is retried in process

    def flow_run(self) -> tuple[str | None, int | None]:
        return None, 1


class PrefectRunner(Runner):
    """Each step as its Prefect task (`prefect_task`): inside a flow run, a task run."""

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = prefect_task(fn)(*args, **kwargs)
        return result

    def attempt(self) -> int:
        return task_run_count()

    def flow_run(self) -> tuple[str | None, int | None]:
        from prefect.runtime import flow_run

        return flow_run.id, flow_run.run_count


LOCAL = LocalRunner()
PREFECT = PrefectRunner()


def runner_for(engine: bool) -> Runner:
    """`PREFECT` inside a Prefect flow run (`engine`), otherwise `LOCAL`."""
    return PREFECT if engine else LOCAL


__all__ = [
    "LOCAL",
    "PREFECT",
    "STEPS",
    "LocalRunner",
    "PrefectRunner",
    "Runner",
    "StepOptions",
    "options_for",
    "prefect_task",
    "private_options",
    "runner_for",
    "task_run_count",
]
