"""How a chain of pipeline steps calls each step, so that the steps stay plain functions.

The steps (tasks/) are plain functions; whether one runs as a Prefect task run or as a plain
call is decided in flows/ (flows/steps.py: each step's task options and the two runners). A
function in tasks/ that chains several steps (`tasks.fit.prepare`, `fit`, `stream_prepare`)
takes the runner as a parameter, a `StepRunner`, and calls each step through it; its default,
`plain_call`, calls the function itself. No Prefect here, and no context variable: the runner is
passed down explicitly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class StepRunner(Protocol):
    """Calls the step `fn` with these arguments and returns its result."""

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...


def plain_call(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """The default `StepRunner`: the function itself, called once."""
    return fn(*args, **kwargs)


def first_attempt() -> int:
    """The attempt number of a step that is not retried: 1 (a step that reserves in the ledger per
    attempt is given its runner's count instead, flows/steps.py)."""
    return 1


__all__ = ["StepRunner", "first_attempt", "plain_call"]
