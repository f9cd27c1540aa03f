"""Conditional sampling: synthetic rows that meet conditions (`privflow generate --where 'col=value'`,
`--where 'age>=40'`, `--where 'age=30..50'`; `Synthesizer.sample(n, where={'col': 'value'})`;
conditions combine with AND).

The conditions (`parse_where` for their form, `conditions_for` against the public schema):

- COLUMN=LABEL on a categorical or boolean column: one of its declared labels, taken verbatim
  (so `income=>50K` is the label '>50K').
- On an integer, numeric, date or datetime column: a comparison COLUMN>=V, >, <=, <, ==
  (or =) and != , or a range COLUMN=LOW..HIGH, inclusive at both ends. Values are read as the
  column is written: whole numbers for an integer column, dates and datetimes in the column's
  own format. A value is compared as it is written to the table (a numeric column rounded to its
  `decimals`, a datetime to its granularity); a missing value meets no condition. Equality on a
  numeric column needs its `decimals` (the values are on that grid) or one of its atoms.

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
- Any other condition (another categorical or boolean column, the target of a model without a
  head, and every comparison or range): rejection sampling. Batches are drawn and the matching
  rows kept.

Rows are drawn in rounds of equal shares from the released checkpoints (the equal-weight mixture
the unconditional sampler draws from); all of a round's kept rows are used, and in the round
that completes the table a random subset of its kept rows (from a seed drawn up front from the
one sampling generator) so that no checkpoint's share is favoured by its place in the round.
The rounds have a fixed size, so the rows depend only on the model, the seed, the batch size and
the conditions, never on the number of worker threads.

A condition the model almost never meets is refused rather than sampled for hours: when no
rows are kept within `draw_cap(n)` draws, or the draws still needed at an optimistic estimate of
the acceptance rate would take the total past it, sampling stops with a ConfigError.

The schema's rules between columns (privflow/data/rules.py) are conditions every released row
meets, with or without `--where` (`with_rules`; they combine with the conditions by AND): a row
that breaks one is rejected like a row that misses a condition (through the head, the rules are
read with the target set to its condition's value). The `Tally` counts the draws that broke a
rule, and each rule's (curator-facing: not published, not recorded), and the draw cap's
ConfigError names the rule the model most often breaks.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any, cast

import numpy as np
import polars as pl

from privflow.core.errors import ConfigError
from privflow.data.lowering import lower
from privflow.data.rules import broken
from privflow.data.schema import BOUNDED_TYPES, TEMPORAL_TYPES, Column, Schema, time_number

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
    list, a boolean column's two labels (privflow/data/lowering.py lowers it to a categorical of
    them); None for any other column."""
    if col.type == "categorical":
        return tuple(col.categories or ())
    if col.type == "boolean":
        labels = getattr(col, "true_false", None) or col.categories
        return tuple(labels) if labels is not None else None
    return None


# The operators of a condition, the two-character ones first: `age>=40` is `>=` and 40, never
# `>` and '=40'. A condition splits at its first operator character; `!` only opens `!=`.
OPERATORS = ("==", "!=", ">=", "<=", ">", "<", "=")
_FORMS = (
    "COLUMN=VALUE (a category's label, or a number or date), COLUMN>=VALUE (or >, <=, <, ==, !=) or "
    "COLUMN=LOW..HIGH (a range, both ends included)"
)


@dataclass(frozen=True)
class Clause:
    """One condition as given, before the schema is read: COLUMN OP VALUE. `value` is text from
    the command line; from the API's mapping it may also be a number, a date or a (low, high)
    pair. `text` is the condition as given (for messages; and split at its first '=' again when
    the column's own name holds an operator character)."""

    column: str
    op: str
    value: Any
    text: str


def _split(item: str) -> tuple[str, str, str] | None:
    """(column, operator, value) of `item` split at its first operator (OPERATORS), the spaces
    around column and value dropped; None when it has none."""
    for i, ch in enumerate(item):
        two = item[i : i + 2]
        if two in ("==", "!=", ">=", "<="):
            op = two
        elif ch in "=<>":
            op = ch
        else:
            continue
        return item[:i].strip(), op, item[i + len(op) :].strip()
    return None


def parse_where(items: Sequence[str] | None, option: str = "--where") -> tuple[Clause, ...]:
    """Condition texts -> their `Clause`s, in the order given (the form only: the schema is read
    by `conditions_for`). A text splits at its first operator (OPERATORS), so `income=>50K` is
    income '=' '>50K' and `age>=40` is age '>=' 40; spaces around the column and the value are
    dropped. A condition given twice counts once; one column given two different plain values
    (COLUMN=A, COLUMN=B) can never match and is refused here."""
    out: list[Clause] = []
    for item in items or ():
        parts = _split(str(item))
        if parts is None or not parts[0] or not parts[2]:
            raise ConfigError(
                f"{option} {item!r} is not a condition: write {_FORMS}, e.g. {option} 'sex=Female', {option} "
                f"'age>=40' or {option} 'age=30..50' (repeat {option} for several conditions; they combine with AND; "
                "quote each condition in a shell)."
            )
        clause = Clause(parts[0], parts[1], parts[2], str(item).strip())
        if any((c.column, c.op, c.value) == (clause.column, clause.op, clause.value) for c in out):
            continue
        for other in out:
            if other.column == clause.column and _plain(other) and _plain(clause) and not _same(other, clause):
                raise ConfigError(
                    f"{option} gives column '{clause.column}' two values ('{other.value}' and '{clause.value}'); "
                    "conditions combine with AND, so no row can meet both. Give each column one value (or, for a "
                    "number or date, one range: COLUMN=LOW..HIGH)."
                )
        out.append(clause)
    return tuple(out)


def _plain(clause: Clause) -> bool:
    """COLUMN=VALUE with a value that is neither a range nor an operator form (one value)."""
    v = clause.value
    return clause.op == "=" and isinstance(v, str) and ".." not in v and not v.startswith(OPERATORS)


def _same(a: Clause, b: Clause) -> bool:
    """The same value, as text or as a number ('40' and '40.0')."""
    x, y = _number(a.value), _number(b.value)
    return a.value == b.value or (x is not None and x == y)


def _number(raw: Any) -> int | float | None:
    """A finite number from a number or its text (whole text as an int), else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        return raw if math.isfinite(raw) else None
    if not isinstance(raw, str):
        return None
    try:
        return int(raw.strip())
    except ValueError:
        pass
    try:
        x = float(raw.strip())
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _api_value(col: Any, value: Any, option: str) -> Any:
    """A value of the API's mapping: a label or condition text, a number, a date, or a (low, high)
    pair for a range."""
    if isinstance(value, tuple | list) and len(value) == 2 and all(_api_one(v) for v in value):
        return tuple(value)
    if _api_one(value):
        return value
    raise ConfigError(
        f"{option}: the value for column {col!r} must be a category label (text), a number or date (or its "
        f"condition text, e.g. '>=40' or '30..50'), or a (low, high) pair for a range, got {value!r}; e.g. "
        f"{option}={{'sex': 'Female', 'age': (30, 50)}}."
    )


def _api_one(value: Any) -> bool:
    """A text, a date or datetime, or a finite number (not a boolean)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, str | date) or (isinstance(value, int | float) and _number(value) is not None)


def _shown(value: Any) -> str:
    """A value of the API's mapping as a condition writes it."""
    if isinstance(value, tuple):
        return "..".join(_shown(v) for v in value)
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, date):
        return value.isoformat()
    return str(value).strip()


def _clauses(where: Mapping[str, Any] | Sequence[str] | Sequence[Clause], option: str) -> tuple[Clause, ...]:
    """A mapping (the API's), condition texts or their `parse_where` clauses -> `Clause`s."""
    if isinstance(where, Mapping):
        out: list[Clause] = []
        for col, value in where.items():
            value = _api_value(col, value, option)
            if not isinstance(col, str) or not col:
                raise ConfigError(f"{option}: column names are text, got {col!r}; e.g. {option}={{'sex': 'Female'}}.")
            out.append(Clause(col, "=", value, f"{col}={_shown(value)}"))
        return tuple(out)
    if isinstance(where, str | bytes) or not isinstance(where, Sequence):
        raise ConfigError(
            f"{option} must be a mapping of column to value (e.g. {{'sex': 'Female', 'age': (30, 50)}}) or a list "
            f"of condition texts (e.g. ['sex=Female', 'age>=40']), got {type(where).__name__}."
        )
    if all(isinstance(c, Clause) for c in where):  # `parse_where`'s, already read
        return tuple(cast(Sequence[Clause], where))  # all() does not narrow
    return parse_where(cast(Sequence[str], where), option)


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
    schema: Schema,
    where: Mapping[str, Any] | Sequence[str] | Sequence[Clause] | Conditions | None,
    option: str = "--where",
) -> Conditions | None:
    """Validated `Conditions` for `where` against the PUBLIC schema (None when `where` is empty;
    `Conditions` already checked as they are): every column exists; a categorical or boolean one
    takes one of its declared labels; an integer, numeric, date or datetime one a comparison or a
    range whose values parse for its type, that some value within its public bounds meets, and
    that the column's other conditions leave room for. ConfigError (one paragraph) otherwise."""
    if where is None:
        return None
    if isinstance(where, Conditions):
        return where
    clauses = _clauses(where, option)
    if not clauses:
        return None
    values: dict[str, str] = {}
    numeric: list[NumericCondition] = []
    parts: list[str] = []
    for given in clauses:
        clause = _resolve(schema, given, option)
        col, shown = clause.column, f"{option} '{clause.text}'"
        column = schema.column(col)
        labels = modelled_categories(column)
        if labels is not None:
            label = _label(column, labels, clause, option)
            if col in values and values[col] != label:
                raise ConfigError(
                    f"{option} gives column '{col}' two values ('{values[col]}' and '{label}'); conditions combine "
                    "with AND, so no row can meet both. Give each column one value."
                )
            if col not in values:
                values[col] = label
                parts.append(f"{col}={label}")
        elif column.type in BOUNDED_TYPES:
            numeric.append(_numeric(column, clause, option))
            parts.append(numeric[-1].shown)
        else:
            raise ConfigError(
                f"{shown}: column '{col}' is {column.type}: it is not modelled and not in the synthetic table, so no "
                "condition applies to it."
            )
    _check_together(numeric, option)
    return Conditions(values, option, tuple(numeric), tuple(parts))


def _resolve(schema: Schema, clause: Clause, option: str) -> Clause:
    """`clause` on a column of the schema: as split, or split at its first '=' (a column whose
    name holds '<', '>' or '!'). ConfigError naming the columns otherwise."""
    names = schema.names
    if clause.column in names:
        return clause
    col, eq, value = clause.text.partition("=")
    if eq and col.strip() in names and value.strip() and isinstance(clause.value, str):
        return Clause(col.strip(), "=", value.strip(), clause.text)
    near = _closest(clause.column, names)
    hint = f" Did you mean '{near}'?" if near else ""
    usable = [c.name for c in schema.columns if modelled_categories(c) is not None]
    bounded = [c.name for c in schema.columns if c.type in BOUNDED_TYPES]
    raise ConfigError(
        f"{option} '{clause.text}': the model's schema has no column '{clause.column}'.{hint} Its categorical "
        f"columns are {_listed(usable) or 'none'}; its integer, numeric, date and datetime columns are "
        f"{_listed(bounded) or 'none'} (column names are case-sensitive)."
    )


def _label(column: Column, labels: Sequence[str], clause: Clause, option: str) -> str:
    """The declared label a categorical or boolean column's condition names."""
    col, value, shown = column.name, clause.value, f"{option} '{clause.text}'"
    if clause.op not in ("=", "=="):
        whole = f"{clause.op}{value}"
        hint = f" Did you mean {option} '{col}={whole}' (the label '{whole}')?" if whole in labels else ""
        raise ConfigError(
            f"{shown}: column '{col}' is {column.type}; it takes COLUMN=LABEL only, one of its declared labels "
            f"(comparisons and ranges are for integer, numeric, date and datetime columns).{hint}"
        )
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(
            f"{option}: the value for column '{col}' must be a category label (text), got {value!r}; e.g. "
            f"{option}={{'{col}': '{labels[0]}'}}."
        )
    value = str(value)
    if value not in labels:
        near = _closest(value, labels)
        hint = f" Did you mean '{near}'?" if near else ""
        raise ConfigError(
            f"{shown}: '{value}' is not a category of column '{col}'; its declared categories are "
            f"{_listed(labels)}.{hint} Labels are matched exactly (case and spaces included)."
        )
    return value


# -- numbers, dates and datetimes -----------------------------------------------------------------


@dataclass(frozen=True)
class NumericCondition:
    """One comparison or range on an integer, numeric, date or datetime column, checked against
    the public schema (`conditions_for`): `low` and `high` (None: no end; `*_open`: the end
    itself excluded), or `not_equal`. Values are as the column is written: whole numbers,
    numbers, or a date's days / a datetime's seconds since 1970-01-01 (`time_number`)."""

    column: Column
    shown: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    not_equal: float | None = None

    @property
    def name(self) -> str:
        return self.column.name

    def mask(self, s: pl.Series) -> np.ndarray:
        """[rows] whether each decoded value, as the column writes it, meets the condition (a
        missing value never does)."""
        x = _written(s, self.column)
        keep = x.is_not_null()
        if self.low is not None:
            keep &= x > self.low if self.low_open else x >= self.low
        if self.high is not None:
            keep &= x < self.high if self.high_open else x <= self.high
        if self.not_equal is not None:
            keep &= x != self.not_equal
        return keep.fill_null(False).to_numpy().astype(bool)


def _written(s: pl.Series, column: Column) -> pl.Series:
    """Decoded (modelled) values as the table is written (privflow/data/lowering.py): a temporal
    column's units as days / seconds since 1970-01-01, a numeric column rounded to its decimals."""
    if column.type in TEMPORAL_TYPES:
        return s.cast(pl.Int64) * column.step
    if column.type == "numeric" and column.decimals is not None:
        from privflow.data.lowering import rounded

        return rounded(s, column)
    return s


def _numeric(column: Column, clause: Clause, option: str) -> NumericCondition:
    """The `NumericCondition` of `clause` on a bounded column (integer, numeric, date, datetime)."""
    col, shown = column.name, f"{option} '{clause.text}'"
    op, value = clause.op, clause.value
    if isinstance(value, str) and op == "=":
        again = _split(value) if value.startswith(OPERATORS) else None
        if again is not None and not again[0] and again[2]:  # the API's {'age': '>=40'}; age=>40
            op, value = again[1], again[2]
            shown = f"{option} '{col}{op}{value}'"
    if isinstance(value, str) and ".." in value:
        low, _, high = value.partition("..")
        value = (low.strip(), high.strip())
    if isinstance(value, tuple):
        if op != "=" or any(isinstance(v, str) and not v for v in value):
            raise ConfigError(
                f"{shown}: a range is written COLUMN=LOW..HIGH with both ends (both included), e.g. {option} "
                f"'{col}={_example(column, 0)}..{_example(column, 1)}'; for one end alone use a comparison "
                f"(COLUMN>=LOW, COLUMN<=HIGH)."
            )
        lo, hi = (_value(column, v, shown) for v in value)
        if lo > hi:
            raise ConfigError(
                f"{shown}: the range is empty: its low end {_text(column, value[0])} is above its high end "
                f"{_text(column, value[1])}. Write COLUMN=LOW..HIGH with LOW <= HIGH (both ends included)."
            )
        cond = NumericCondition(column, f"{col}={_text(column, value[0])}..{_text(column, value[1])}", lo, hi)
    else:
        v = _value(column, value, shown)
        text = f"{col}{op}{_text(column, value)}"
        if op in ("=", "=="):
            _check_exact(column, v, shown, option)
            cond = NumericCondition(column, text, v, v)
        elif op == "!=":
            cond = NumericCondition(column, text, not_equal=v)
        elif op in (">", ">="):
            cond = NumericCondition(column, text, low=v, low_open=op == ">")
        else:
            cond = NumericCondition(column, text, high=v, high_open=op == "<")
    if not _feasible(column, [cond]):
        grid = _grid(column)
        if grid is not None and _feasible(column, [cond], on_grid=False):
            raise ConfigError(
                f"{shown}: column '{col}' holds only {_grid_word(column)}, and none meets it; give a condition "
                f"that holds one (e.g. {option} '{col}={_example(column, 0)}..{_example(column, 1)}')."
            )
        raise ConfigError(
            f"{shown} lies wholly outside the public bounds of column '{col}', {_bounds_text(column)} (the model "
            "writes no value beyond them), so no synthetic row can meet it. Give a condition that overlaps the bounds."
        )
    return cond


def _value(column: Column, raw: Any, shown: str) -> float:
    """One value of a condition on a bounded column, as the column's values are held (a whole
    number, a number, days or seconds since 1970-01-01). ConfigError when it does not parse."""
    kind, col = column.type, column.name
    if kind in TEMPORAL_TYPES:
        fmt = column.time_format
        moment: date | None = None
        if isinstance(raw, date):
            moment = raw
        elif isinstance(raw, str):
            try:
                moment = datetime.strptime(raw.strip(), fmt)
            except (ValueError, TypeError, OverflowError):
                moment = None
        if isinstance(moment, datetime) and moment.tzinfo is not None:
            moment = None
        if kind == "date" and isinstance(moment, datetime) and moment != datetime(*moment.timetuple()[:3]):
            moment = None  # a time of day on a date column
        if moment is None:
            raise ConfigError(
                f"{shown}: {_quoted(raw)} is not a {kind} written in the format of column '{col}', '{fmt}' (e.g. "
                f"'{_example(column, 0)}'); give {kind}s as the column is written."
            )
        return float(time_number(moment, kind))
    number = _number(raw) if not isinstance(raw, date) else None
    if number is None:
        raise ConfigError(
            f"{shown}: {_quoted(raw)} is not a number; column '{col}' is {kind} (e.g. {_range_example(column)})."
        )
    if kind == "integer" and number != math.floor(number):
        raise ConfigError(
            f"{shown}: {_quoted(raw)} is not a whole number, and column '{col}' is integer; give whole numbers "
            f"(e.g. '{col}>={math.floor(number) + 1}' rather than '{col}>{number}')."
        )
    return float(number)


def _range_example(column: Column) -> str:
    """A range of the column's own values, as a condition writes it."""
    return f"'{column.name}={_example(column, 0)}..{_example(column, 1)}'"


def _quoted(raw: Any) -> str:
    return f"'{raw.strip()}'" if isinstance(raw, str) else repr(raw)


def _text(column: Column, raw: Any) -> str:
    """A condition's value as its description writes it: text as given, a date in the column's
    format, a number as Python writes it."""
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, date) and column.type in TEMPORAL_TYPES:
        return raw.strftime(column.time_format)
    return str(raw)


def _check_exact(column: Column, v: float, shown: str, option: str) -> None:
    """Equality needs values on a grid: an integer, a date, a datetime's granularity, a numeric
    column's decimals (or one of its atoms)."""
    col = column.name
    if column.type == "datetime" and v % column.step:
        raise ConfigError(
            f"{shown}: column '{col}' holds whole {column.granularity}s (its granularity), so no value equals this "
            f"one; give a whole {column.granularity} or a range ({_range_example(column)})."
        )
    if column.type != "numeric" or v in column.atoms:
        return
    if column.decimals is None:
        raise ConfigError(
            f"{shown}: column '{col}' is numeric without `decimals`: its values are continuous, so a row almost "
            f"never equals one exactly; give a range ({_range_example(column)}) or a comparison ({option} "
            f"'{col}>=...')."
        )
    if round(v, column.decimals) != v:
        raise ConfigError(
            f"{shown}: column '{col}' is written with {column.decimals} decimal(s), so no value equals this one; give "
            f"a value with at most {column.decimals} decimal(s) or a range ({_range_example(column)})."
        )


def _span(column: Column) -> tuple[float, float]:
    """The least and greatest value the column is written with (its public bounds on its grid)."""
    lo, hi = column.bounds or (0.0, 0.0)
    if column.type == "integer":
        return float(math.ceil(lo)), float(math.floor(hi))
    if column.type in TEMPORAL_TYPES:
        s = column.step
        return float(int(lo) // s * s), float(int(hi) // s * s)
    if column.decimals is not None:
        q = 10.0**column.decimals
        return math.ceil(lo * q) / q, math.floor(hi * q) / q
    return float(lo), float(hi)


def _grid(column: Column) -> float | None:
    """The spacing of the values the column is written with (None: continuous)."""
    if column.type == "integer":
        return 1.0
    if column.type in TEMPORAL_TYPES:
        return float(column.step)
    return None if column.decimals is None else 10.0**-column.decimals


def _grid_word(column: Column) -> str:
    """What the column's values are, on its grid (plural)."""
    if column.type == "integer":
        return "whole numbers"
    if column.type == "date":
        return "whole days"
    if column.type == "datetime":
        return f"whole {column.granularity or 'second'}s"
    return f"values with {column.decimals} decimal(s)"


def _example(column: Column, end: int) -> str:
    """A value near one end of the column's public bounds, as a condition writes it."""
    lo, hi = _span(column)
    if column.type in TEMPORAL_TYPES:
        return column.time_text(int((lo, hi)[end]) // column.step)
    quarter = lo + (hi - lo) * (0.25 if end == 0 else 0.75)
    if column.type == "integer" or (column.decimals == 0):
        return str(int(round(quarter)))
    return f"{round(quarter, column.decimals if column.decimals is not None else 2):g}"


def _bounds_text(column: Column) -> str:
    lo, hi = _span(column)
    if column.type in TEMPORAL_TYPES:
        return f"[{_example(column, 0)}, {_example(column, 1)}]"
    if column.type == "integer":
        return f"[{int(lo)}, {int(hi)}]"
    return f"[{lo:g}, {hi:g}]"


def _index(x: float, grid: float, up: bool, open_end: bool) -> int:
    """The first grid index at or above `x` (`up`; above when `open_end` and `x` is on the grid),
    or the last at or below it."""
    t = x / grid
    k = round(t)
    if abs(t - k) <= 1e-9 * max(1.0, abs(t)):
        return k + (1 if up else -1) * open_end
    return math.ceil(t) if up else math.floor(t)


def _feasible(column: Column, conds: Sequence[NumericCondition], on_grid: bool = True) -> bool:
    """Whether some value the column can be written with meets all of `conds`."""
    lo, hi = _span(column)
    lo_open = hi_open = False
    ne: set[float] = set()
    for c in conds:
        if c.low is not None and (c.low > lo or (c.low == lo and c.low_open)):
            lo, lo_open = c.low, c.low_open
        if c.high is not None and (c.high < hi or (c.high == hi and c.high_open)):
            hi, hi_open = c.high, c.high_open
        if c.not_equal is not None:
            ne.add(c.not_equal)
    grid = _grid(column) if on_grid else None
    if grid is None:
        return lo < hi or (lo == hi and not lo_open and not hi_open and lo not in ne)
    a, b = _index(lo, grid, True, lo_open), _index(hi, grid, False, hi_open)
    if a > b:
        return False
    if b - a >= len(ne):
        return True
    excluded = {round(x / grid) for x in ne if abs(x / grid - round(x / grid)) <= 1e-9 * max(1.0, abs(x / grid))}
    return not set(range(a, b + 1)) <= excluded


def _check_together(numeric: Sequence[NumericCondition], option: str) -> None:
    """Several conditions on one column leave some value that meets them all."""
    by: dict[str, list[NumericCondition]] = {}
    for c in numeric:
        by.setdefault(c.name, []).append(c)
    for conds in by.values():
        if len(conds) > 1 and not _feasible(conds[0].column, conds):
            column = conds[0].column
            raise ConfigError(
                f"{option} {' AND '.join(c.shown for c in conds)}: no value of column '{column.name}' meets all of "
                f"these together (its public bounds are {_bounds_text(column)}); conditions combine with AND. Drop "
                "one or widen it."
            )


# -- sampling -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a conditional table has cost so far (`Conditions.collect`): the rows drawn from the
    model and the rows among them that met the conditions; with the schema's rules, the draws that
    broke at least one (`broke_rules`) and each rule's count (`by_rule`, by label, in the schema's
    order). Curator-facing: exact counts of the sampler's own draws, never published."""

    drawn: int = 0
    kept: int = 0
    broke_rules: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        return self.kept / self.drawn if self.drawn else 0.0

    @property
    def rule_share(self) -> float:
        """The share of the draws rejected for breaking a rule (they may miss a condition too)."""
        return self.broke_rules / self.drawn if self.drawn else 0.0

    def rules_note(self) -> str:
        """The rules' part of a report of the draws, e.g. "3.1% of the draws broke a rule of the
        schema (most often 'a <= b', 2.9%)"; '' when no draw broke one. Curator-facing."""
        if not self.broke_rules or not self.drawn:
            return ""
        name, k = max(self.by_rule.items(), key=lambda kv: kv[1])
        if len(self.by_rule) == 1:
            return f"{percent(self.rule_share)} of the draws broke the schema's rule '{name}'"
        return (
            f"{percent(self.rule_share)} of the draws broke a rule of the schema (most often '{name}', "
            f"{percent(k / self.drawn)})"
        )

    def _add_rules(self, labels: Sequence[str], counted: np.ndarray) -> None:
        """One job's rule counts: [draws that broke any rule, then each rule's]."""
        self.broke_rules += int(counted[0])
        for name, k in zip(labels, counted[1:], strict=True):
            self.by_rule[name] = self.by_rule.get(name, 0) + int(k)


def percent(share: float) -> str:
    """A share as a percentage with three significant digits ('7.31%', '0.0123%')."""
    return f"{100.0 * share:.3g}%"


@dataclass(frozen=True)
class Conditions:
    """Validated conditions combined with AND (`conditions_for`): {column: label} of the
    categorical and boolean columns, the comparisons and ranges of the others, and `parts`, the
    conditions as described, in the order given. `rules`: the modelled schema whose rules every row
    meets too (`with_rules`; None: none). `tally` counts the draws of the last table."""

    values: dict[str, str]
    option: str = "--where"
    numeric: tuple[NumericCondition, ...] = ()
    parts: tuple[str, ...] = ()
    rules: Schema | None = None
    tally: Tally = field(default_factory=Tally, compare=False, repr=False)

    def describe(self) -> str:
        if self.parts:
            return " AND ".join(self.parts)
        return " AND ".join(f"{c}={v}" for c, v in self.values.items())

    def _through_head(self, codec: Any) -> bool:
        from privflow.data.target_head import TargetCodec

        return isinstance(codec, TargetCodec) and codec.target in self.values

    def _matches(self, frame: pl.DataFrame, skip: str | None = None) -> np.ndarray:
        """[rows] whether each row meets every condition (but `skip`'s label); null never matches."""
        keep = np.ones(frame.height, dtype=bool)
        for col, value in self.values.items():
            if col != skip:
                hit = frame.get_column(col).cast(pl.String).eq(value).fill_null(False)
                keep &= hit.to_numpy().astype(bool)
        for cond in self.numeric:
            keep &= cond.mask(frame.get_column(cond.name))
        return keep

    def _rule_breaks(self, frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray | None]:
        """([rows] whether each row breaks a rule, [draws that broke any, then each rule's count]);
        (no row, None) without rules (`privflow.data.rules.broken`)."""
        if self.rules is None or not self.rules.rules:
            return np.zeros(frame.height, dtype=bool), None
        table = broken(self.rules, frame).to_numpy().astype(bool)
        any_rule: np.ndarray = np.asarray(table.any(axis=1), dtype=bool)
        return any_rule, np.concatenate([[any_rule.sum()], table.sum(axis=0)]).astype(np.int64)

    def kept(
        self,
        rows: Callable[..., pl.DataFrame],
        flow: Any,
        codec: Any,
        t: Any,
        mapped: bool,
        jitter: Any,
        target_u: Any,
        mend: bool = False,
    ) -> tuple[pl.DataFrame, float, int, np.ndarray | None]:
        """One batch of draws -> (the rows that meet the conditions and the rules, the expected
        number kept, the rows drawn, the rules' counts of `_rule_breaks`). `rows` is the sampler's
        map-and-decode step (privflow.serving.sampler._rows; `mend`: its broken inequalities
        swapped back first); runs on a worker thread."""
        if not self._through_head(codec):
            frame = rows(flow, codec, t, mapped, jitter, target_u, mend)
            breaks, counted = self._rule_breaks(frame)
            keep = self._matches(frame) & ~breaks
            return frame.filter(pl.Series(keep)), float(keep.sum()), frame.height, counted
        from privflow.data.target_head import class_labels

        rest = rows(flow, codec.inner, t, mapped, jitter, None, mend)  # the flow's columns: the target is not drawn
        drawn = rest.height
        labels = list(codec.column.categories or ())
        k = labels.index(self.values[codec.target])
        if self.rules is not None:  # the rules read each row with its target set to the condition's value
            rest = rest.with_columns(class_labels(codec.column, np.full(drawn, k, dtype=np.int64)))
        breaks, counted = self._rule_breaks(rest)
        others = self._matches(rest, skip=codec.target) & ~breaks
        rest = rest.filter(pl.Series(others))
        u = np.asarray(target_u, dtype=np.float64)[others]
        p = np.exp(codec.sampling_log_probs(rest)[:, k]) if rest.height else np.empty(0)
        accept = u < p  # probability of v in the law the sampler draws the target from: its exact conditional
        kept = rest.filter(pl.Series(accept))
        target = class_labels(codec.column, np.full(kept.height, k, dtype=np.int64))
        return kept.with_columns(target).select(codec.schema.names), float(p.sum()), drawn, counted

    def collect(
        self, results: Iterator[tuple[Any, ...]], n: int, per_round: int, rng: np.random.Generator
    ) -> Iterator[pl.DataFrame]:
        """The kept rows of `results` (`kept` of each job, in job order; `per_round` jobs make a
        round) until `n` are kept: exactly `n` rows. `tally` follows the draws as they come (a
        progress display may read it), the rules' counts included. Raises ConfigError when the
        conditions (and rules) are too rare to reach `n` within `draw_cap(n)` draws."""
        cap = draw_cap(n)
        have, drawn, expected = 0, 0, 0.0
        self.tally.drawn = self.tally.kept = self.tally.broke_rules = 0
        self.tally.by_rule = {}
        names = [r.label for r in self.rules.rules] if self.rules is not None else []
        part: list[pl.DataFrame] = []
        for frame, e, d, *counted in results:
            part.append(frame)
            drawn, expected = drawn + d, expected + e
            self.tally.drawn, self.tally.kept = drawn, self.tally.kept + frame.height
            if counted and counted[0] is not None:
                self.tally._add_rules(names, counted[0])
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
            f"{'none' if have == 0 else f'{have:,}'} of the {drawn:,} rows drawn from the model matched ("
            f"{percent(have / drawn)} accepted; an estimated rate of {rate:.3g})"
        )
        more = (
            ""
            if drawn >= cap
            else f", and the {n - have:,} still needed would bring the draws to about {projected:,.0f} even at an "
            "optimistic rate"
        )
        cap_text = f"the cap of {cap:,} draws ({DRAWS_PER_ROW} per row asked for, at least {MIN_DRAW_CAP:,})"
        rules = self.tally.rules_note()
        rules = (
            f" {rules[0].upper()}{rules[1:]}: every released row meets the rules of the model's public schema, so "
            "a model that almost never meets one cannot release rows (is the rule true of the data? `privflow "
            "check` counts the real rows that break each rule; a model trained longer or with more budget may "
            "meet it more often)."
            if rules
            else ""
        )
        if not self.values and not self.numeric:  # the schema's rules alone
            raise ConfigError(
                f"The rules of the schema are too rare in this model to sample {n:,} rows: {seen}{more}, beyond "
                f"{cap_text}.{rules} Ask for fewer rows (-n) or use a better-trained model."
            )
        raise ConfigError(
            f"{self.option} {self.describe()} is too rare in this model to sample {n:,} rows: {seen}{more}, beyond "
            f"{cap_text}. The released model gives these values (together) almost no mass: widen a condition (a "
            "wider range, a looser comparison), drop one, ask for fewer rows (-n), or sample without the conditions "
            f"and look at how often they occur (are the values the ones meant?).{rules}"
        )


def with_rules(conditions: Conditions | None, schema: Schema) -> Conditions | None:
    """`conditions` that also hold every rule of `schema` (its `lower`: the rules of the rows as
    decoded), sharing their `tally`; conditions of the rules alone when `conditions` is None
    (`option` 'rules'); `conditions` as they are when the schema has no rule."""
    model = lower(schema)
    if not model.rules:
        return conditions
    if conditions is None:
        return Conditions({}, "rules", rules=model)
    return replace(conditions, rules=model)


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
    "OPERATORS",
    "Clause",
    "Conditions",
    "NumericCondition",
    "Tally",
    "conditions_for",
    "draw_cap",
    "modelled_categories",
    "parse_where",
    "percent",
    "rounds",
    "subset_rng",
    "with_rules",
]
