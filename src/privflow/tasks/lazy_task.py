"""Pipeline steps that become Prefect tasks only when a Prefect flow runs them.

`privflow run` without a Prefect API (the default) calls each step's function (`.fn`) and
never needs Prefect, whose import alone adds to the fixed cost of every start
(benchmarks/results/overhead.md compares runs with and without it). So a step is a
`LazyTask`: it holds the function and its options, and builds the real `prefect.Task` on
first use (a call inside a flow, `.with_options`, `.submit`, ...), importing Prefect then.

Steps that touch private rows never persist or cache their results (`private=True`: no raw
rows in a result store, and a cached mechanism output would hide a second data access).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def private_options() -> dict[str, Any]:
    """Prefect task options for a step that touches private rows: no result persisted, no cache."""
    from prefect.cache_policies import NO_CACHE

    return {"persist_result": False, "cache_policy": NO_CACHE}


class LazyTask(Generic[P, R]):
    """A function and its Prefect task options; the `prefect.Task` is built on first use."""

    def __init__(
        self,
        fn: Callable[P, R],
        name: str,
        *,
        private: bool = False,
        retries: int = 0,
        retry_delay_seconds: float = 0,
    ) -> None:
        self.fn = fn
        self.name = name
        self.private = private
        self.retries = retries
        self.retry_delay_seconds = retry_delay_seconds
        functools.update_wrapper(self, fn)

    @functools.cached_property
    def task(self) -> Any:
        """The Prefect task (imports Prefect), built from `fn` as it is at first use."""
        from prefect import task

        options = private_options() if self.private else {}
        decorator = task(name=self.name, retries=self.retries, retry_delay_seconds=self.retry_delay_seconds, **options)
        return decorator(self.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.task(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Prefect's task API (with_options, submit, map, ...) on the real task; never for
        # dunders (copy and pickle probe them before __init__ has run).
        if name.startswith("__") or name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def __repr__(self) -> str:
        return f"LazyTask({self.name!r}, fn={self.fn.__module__}.{self.fn.__qualname__})"


def task(
    *, name: str, private: bool = False, retries: int = 0, retry_delay_seconds: float = 0
) -> Callable[[Callable[P, R]], LazyTask[P, R]]:
    """Decorator: `fn` as a pipeline step (`LazyTask`) with these Prefect task options."""

    def wrap(fn: Callable[P, R]) -> LazyTask[P, R]:
        return LazyTask(fn, name, private=private, retries=retries, retry_delay_seconds=retry_delay_seconds)

    return wrap


def task_run_count() -> int:
    """The current Prefect task run's attempt number, 1 outside a task run. Without Prefect
    imported there is no task run in this process, so Prefect is not imported to ask."""
    if "prefect" not in sys.modules:
        return 1
    from prefect.runtime import task_run

    return int(task_run.run_count or 1)


__all__ = ["LazyTask", "private_options", "task", "task_run_count"]
