"""The draft's number columns (privflow/tasks/draft.py): the sign their bounds are searched on."""

from __future__ import annotations

import math

import polars as pl
import pytest

from privflow.data import draft as dd
from privflow.privacy.mechanisms import dp_bounds
from privflow.tasks import draft


def _sign(monkeypatch: pytest.MonkeyPatch, present: float, negatives: float) -> str:
    """The sign `_fill_number` hands the quantile mechanism for noisy kind counts (values 1..5)."""
    seen: list[str] = []
    real = dp_bounds.QuantileBounds

    def spy(epsilon: float, scale: float, sign: str, *rest: float) -> dp_bounds.QuantileBounds:
        seen.append(sign)
        return real(epsilon, scale, sign, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(dp_bounds, "QuantileBounds", spy)
    sug = dd.Suggestion("category", "numeric", dd.BY_DP, decimals=0)
    kind = dd.KindDecision(sug, present=present, missing=12_000.0, zeros=0.0, negatives=negatives, sd=495.0, decade=0)
    s = pl.Series("category", [str(v % 5 + 1) for v in range(3_000)])
    draft._fill_number(kind, s, 0.05, 1e-8, 0.01)
    return seen[0]


def test_too_few_present_values_to_tell_the_sign_search_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A column mostly missing (3,000 present values at a kind noise sd of 495) whose noisy count
    of negatives came out high: the noise cannot tell its sign, so the bounds are searched on both
    sides, not on the negative side alone (which clamped every value of a 1..5 column to 0)."""
    margin = 2.0 * math.sqrt(2.0 * dd.NUMBER_DECIMALS + 2.0) * 495.0
    assert _sign(monkeypatch, present=3_000.0, negatives=margin + 1.0) == "both"
    assert _sign(monkeypatch, present=3_000.0, negatives=0.0) == "nonnegative"


def test_a_column_confidently_negative_is_searched_below_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _sign(monkeypatch, present=40_000.0, negatives=40_000.0) == "nonpositive"
