"""Conditional sampling: synthetic rows given categorical values (`privflow generate --where
'col=value'`, `Synthesizer.sample(n, where={'col': 'value'})`; conditions combine with AND).

Free post-processing of the released model: it reads the public schema and the released weights,
never a row, and records nothing in the ledger. Every row it returns is a draw from the model's
own conditional law p(x | conditions), so a condition changes the other columns as the model
says they move together:

- The schema's target, when the model has a target head (privflow/data/target_head.py). The flow
  models the other columns x_-t and the head p(t | x_-t) sits beside it: the flow is not
  conditional on the target, so fixing the target alone would pair it with the *unconditional*
  other columns. The conditional is p(x_-t | t = v) ∝ p_flow(x_-t) p_head(v | x_-t): each row the
  flow draws is kept with probability p_head(v | x_-t) (its one target uniform of the sampler
  below it), and its target is set to v. The expected number kept is read off the head (the sum
  of p_head(v | x_-t)), which estimates a rare class's rate far better than a count.
- Any other column whose modelled form is categorical (a categorical column, a boolean one:
  two labels), and the target of a model without a head: rejection sampling. Batches are drawn
  and the matching rows kept.

Rows are drawn in rounds of equal shares from the released checkpoints (the equal-weight mixture
the unconditional sampler draws from); all of a round's kept rows are used, and in the round
that completes the table a random subset of its kept rows (from a seed drawn up front from the
one sampling generator) so that no checkpoint's share is favoured by its place in the round.
The rounds have a fixed size, so the rows depend only on the model, the seed, the batch size and
the conditions, never on the number of worker threads.

A condition the model almost never meets is refused rather than sampled for hours: when no
rows are kept within `draw_cap(n)` draws, or the draws still needed at an optimistic estimate of
the acceptance rate would take the total past it, sampling stops with a ConfigError.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from privflow.core.errors import ConfigError
from privflow.data.schema import Column, Schema

# A conditional table may cost up to this many draws per row asked for, and at least MIN_DRAW_CAP
# draws in all (a rare condition for a small table): beyond, the condition is refused as too rare.
DRAWS_PER_ROW = 200
MIN_DRAW_CAP = 1_000_000
ROUND_FLOOR = 1024  # the least rows a round draws from each checkpoint


def draw_cap(n: int) -> int:
    """The most rows drawn from the model for a conditional table of `n` rows."""
    return max(MIN_DRAW_CAP, DRAWS_PER_ROW * n)


def modelled_categories(col: Column) -> tuple[str, ...] | None:
    """The labels of a column whose modelled form is categorical: a categorical column's declared
    list, a boolean column's two labels (privflow/data/surface.py lowers it to a categorical of
    them); None for any other column."""
    if col.type == "categorical":
        return tuple(col.categories or ())
    if col.type == "boolean":
        labels = getattr(col, "true_false", None) or col.categories
        return tuple(labels) if labels is not None else None
    return None


def parse_where(items: Sequence[str] | None, option: str = "--where") -> dict[str, str]:
    """`COLUMN=VALUE` texts -> {column: value}, in the order given (syntax only: the schema is
    checked by `conditions_for`). The first '=' splits, so a value may hold one; spaces around
    the column and the value are dropped. A column given twice with two values can never match."""
    out: dict[str, str] = {}
    for item in items or ():
        col, eq, value = str(item).partition("=")
        col, value = col.strip(), value.strip()
        if not eq or not col or not value:
            raise ConfigError(
                f"{option} {item!r} is not a condition: write COLUMN=VALUE, e.g. {option} 'sex=Female' (repeat "
                f"{option} for several conditions; they combine with AND; quote the whole condition in a shell)."
            )
        _add(out, col, value, option)
    return out


def _add(out: dict[str, str], col: str, value: str, option: str) -> None:
    if col in out and out[col] != value:
        raise ConfigError(
            f"{option} gives column '{col}' two values ('{out[col]}' and '{value}'); conditions combine with AND, "
            "so no row can meet both. Give each column one value."
        )
    out[col] = value


def _as_pairs(where: Mapping[str, Any] | Sequence[str], option: str) -> dict[str, str]:
    """A mapping (the API's) or COLUMN=VALUE texts (the CLI's) -> {column: value}."""
    if isinstance(where, Conditions):
        return dict(where.values)
    if isinstance(where, Mapping):
        out: dict[str, str] = {}
        for col, value in where.items():
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ConfigError(
                    f"{option}: the value for column {col!r} must be a category label (text), got {value!r}; "
                    f"e.g. {option}={{'sex': 'Female'}}."
                )
            if not isinstance(col, str) or not col:
                raise ConfigError(f"{option}: column names are text, got {col!r}; e.g. {option}={{'sex': 'Female'}}.")
            _add(out, col, str(value), option)
        return out
    if isinstance(where, str | bytes) or not isinstance(where, Sequence):
        raise ConfigError(
            f"{option} must be a mapping of column to category (e.g. {{'sex': 'Female'}}), got {type(where).__name__}."
        )
    return parse_where(where, option)


def _closest(word: str, options: Sequence[str]) -> str | None:
    w = word.casefold()
    for same in (lambda o: o == w, lambda o: o.startswith(w) or w.startswith(o), lambda o: w in o):
        found = [o for o in options if same(o.casefold())]
        if found:
            return found[0]
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return near[0] if near else None


def _listed(values: Sequence[str], most: int = 100) -> str:
    shown = ", ".join(f"'{v}'" for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


def conditions_for(
    schema: Schema, where: Mapping[str, Any] | Sequence[str] | None, option: str = "--where"
) -> Conditions | None:
    """Validated `Conditions` for `where` against the PUBLIC schema (None when `where` is empty):
    every column exists and is modelled as a categorical, every value is one of its declared
    labels. ConfigError (one paragraph) otherwise."""
    if where is None:
        return None
    pairs = _as_pairs(where, option)
    if not pairs:
        return None
    names = schema.names
    for col, value in pairs.items():
        shown = f"{option} '{col}={value}'"
        if col not in names:
            near = _closest(col, names)
            hint = f" Did you mean '{near}'?" if near else ""
            usable = [c.name for c in schema.columns if modelled_categories(c) is not None]
            raise ConfigError(
                f"{shown}: the model's schema has no column '{col}'.{hint} Its categorical columns are "
                f"{_listed(usable) or 'none'} (column names are case-sensitive)."
            )
        column = schema.column(col)
        labels = modelled_categories(column)
        if labels is None:
            raise ConfigError(
                f"{shown}: column '{col}' is {column.type}; only categorical conditions are supported (a value of "
                f"a categorical column, e.g. {option} 'COLUMN=LABEL'). Sample without it and filter the table to "
                "condition on a number."
            )
        if value not in labels:
            near = _closest(value, labels)
            hint = f" Did you mean '{near}'?" if near else ""
            raise ConfigError(
                f"{shown}: '{value}' is not a category of column '{col}'; its declared categories are "
                f"{_listed(labels)}.{hint} Labels are matched exactly (case and spaces included)."
            )
    return Conditions(pairs, option)


@dataclass(frozen=True)
class Conditions:
    """Validated conditions {column: label}, combined with AND (`conditions_for`)."""

    values: dict[str, str]
    option: str = "--where"

    def describe(self) -> str:
        return " AND ".join(f"{c}={v}" for c, v in self.values.items())

    def _through_head(self, codec: Any) -> bool:
        from privflow.data.target_head import TargetCodec

        return isinstance(codec, TargetCodec) and codec.target in self.values

    def _matches(self, frame: pl.DataFrame, skip: str | None = None) -> np.ndarray:
        """[rows] whether each row has every conditioned value (but `skip`'s); null never matches."""
        keep = np.ones(frame.height, dtype=bool)
        for col, value in self.values.items():
            if col != skip:
                hit = frame.get_column(col).cast(pl.String).eq(value).fill_null(False)
                keep &= hit.to_numpy().astype(bool)
        return keep

    def kept(
        self, rows: Callable[..., pl.DataFrame], flow: Any, codec: Any, t: Any, mapped: bool, jitter: Any, target_u: Any
    ) -> tuple[pl.DataFrame, float, int]:
        """One batch of draws -> (the rows that meet the conditions, the expected number kept, the
        rows drawn). `rows` is the sampler's map-and-decode step (privflow.serving.sampler._rows);
        runs on a worker thread."""
        if not self._through_head(codec):
            frame = rows(flow, codec, t, mapped, jitter, target_u)
            keep = self._matches(frame)
            return frame.filter(pl.Series(keep)), float(keep.sum()), frame.height
        from privflow.data.target_head import class_labels

        rest = rows(flow, codec.inner, t, mapped, jitter)  # the flow's columns: the target is not drawn
        drawn = rest.height
        others = self._matches(rest, skip=codec.target)
        rest = rest.filter(pl.Series(others))
        u = np.asarray(target_u, dtype=np.float64)[others]
        labels = list(codec.column.categories or ())
        k = labels.index(self.values[codec.target])
        p = np.exp(codec.head_log_probs(rest)[:, k]) if rest.height else np.empty(0)
        accept = u < p  # probability p_head(v | x_-t): the exact conditional of the target's value
        kept = rest.filter(pl.Series(accept))
        target = class_labels(codec.column, np.full(kept.height, k, dtype=np.int64))
        return kept.with_columns(target).select(codec.schema.names), float(p.sum()), drawn

    def collect(
        self, results: Iterator[tuple[pl.DataFrame, float, int]], n: int, per_round: int, rng: np.random.Generator
    ) -> Iterator[pl.DataFrame]:
        """The kept rows of `results` (`kept` of each job, in job order; `per_round` jobs make a
        round) until `n` are kept: exactly `n` rows. Raises ConfigError when the conditions are too
        rare to reach `n` within `draw_cap(n)` draws."""
        cap = draw_cap(n)
        have, drawn, expected = 0, 0, 0.0
        part: list[pl.DataFrame] = []
        for frame, e, d in results:
            part.append(frame)
            drawn, expected = drawn + d, expected + e
            if len(part) < per_round:
                continue
            got = sum(f.height for f in part)
            if have + got >= n:
                need = n - have
                last = pl.concat(part, rechunk=False)
                if got > need:  # a random `need` of the round's kept rows, in their order
                    pick = np.zeros(got, dtype=bool)
                    pick[rng.choice(got, size=need, replace=False)] = True
                    last = last.filter(pl.Series(pick))
                yield last
                return
            yield from (f for f in part if f.height)
            have, part = have + got, []
            self._check_rate(n, have, drawn, expected, cap)

    def _check_rate(self, n: int, have: int, drawn: int, expected: float, cap: int) -> None:
        """Refuse conditions that cannot reach `n` rows within `cap` draws: none left, or too many
        still needed at an optimistic (upper) estimate of the acceptance rate."""
        optimistic = (expected + 3.0 * math.sqrt(expected) + 3.0) / drawn
        projected = drawn + (n - have) / optimistic
        if drawn < cap and projected <= cap:
            return
        rate = expected / drawn
        seen = (
            f"{'none' if have == 0 else f'{have:,}'} of the {drawn:,} rows drawn from the model matched (an "
            f"estimated rate of {rate:.3g})"
        )
        more = (
            ""
            if drawn >= cap
            else f", and the {n - have:,} still needed would bring the draws to about {projected:,.0f} even at an "
            "optimistic rate"
        )
        raise ConfigError(
            f"{self.option} {self.describe()} is too rare in this model to sample {n:,} rows: {seen}{more}, beyond "
            f"the cap of {cap:,} draws ({DRAWS_PER_ROW} per row asked for, at least {MIN_DRAW_CAP:,}). The released "
            "model gives these values (together) almost no mass: ask for fewer rows (-n), drop or change a "
            "condition (are the values the ones meant?), or sample without it and look at how often they occur."
        )


def rounds(flows: list[Any], n: int, batch: int) -> Iterator[tuple[Any, int]]:
    """Endless rounds of (flow, rows) jobs, one job per flow: equal shares, each of a fixed size
    (at least ROUND_FLOOR, about four times the flow's share of `n`, at most `batch`)."""
    m = max(1, min(batch, max(ROUND_FLOOR, 4 * math.ceil(n / len(flows)))))
    while True:
        for flow in flows:
            yield flow, m


def subset_rng(generator: Any) -> np.random.Generator:
    """The generator that picks the last round's rows, seeded by one draw from the sampling
    generator made before any batch (so it does not depend on how far the workers ran ahead)."""
    import torch

    return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator).item()))


__all__ = [
    "DRAWS_PER_ROW",
    "MIN_DRAW_CAP",
    "Conditions",
    "conditions_for",
    "draw_cap",
    "modelled_categories",
    "parse_where",
    "rounds",
    "subset_rng",
]
