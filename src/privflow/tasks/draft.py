"""`privflow schema draft`: a schema drafted from a table, its values filled by DP when asked.

Without an epsilon nothing read from the rows goes into the draft but the curator-suggested
types and formats (privflow/data/draft.py): bounds and category lists are placeholders the data
owner fills, and the schema refuses to load until they are. With an epsilon the draft is a
charged run on its dataset like any other: planned from the header alone, checked against the
ledger and refused before a row is read when it does not fit (`plan_draft`), reserved, then
filled by DP and settled (`write_draft`).

The split of (epsilon, delta), from the number d of columns in the header only (never from the
suggested types, which are read off the values; so the ledger's events say nothing about them):

- epsilon is split equally over d + 1 parts: the row count and each column;
- delta (default a tenth of the dataset budget's delta) is split equally over the d columns;
- the row count is one Laplace count (`laplace_mechanism`, sensitivity 1); `expected_rows` is it
  rounded to ROWS_DIGITS significant digits;
- a column's part buys, by its type: numeric and integer, half for its DP bounds
  (privacy/mechanisms/dp_bounds.py, whose missing cell gives `nullable`) and half for a
  thresholded histogram of its values at the column's delta (privacy/mechanisms/dp_histogram.py)
  whose values holding at least ATOM_SHARE of the rows become `atoms`; date and datetime, all for
  their DP bounds on the year grid; categorical, all for a thresholded histogram of its values
  with the missing count as a public key (`categories`, `nullable`); boolean and ignore, a
  Laplace count of missing values (`nullable`).

Each column's releases compose (basic composition) to at most (epsilon / (d + 1), delta / d), so
the ledger records `LaplaceEvent` for the row count and one `ApproxDPEvent(epsilon / (d + 1),
delta / d)` per column, whatever its type: (epsilon, delta) in all by basic composition, and less
by the ledger's PLD composition at the dataset's delta.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
from pydantic import ValidationError

from privflow.core.errors import ConfigError, DataError
from privflow.data import draft as dd
from privflow.data.io import read_header, read_table
from privflow.data.schema import DRAFT_PLACEHOLDER, MAX_ATOMS, Budget, DatasetInfo
from privflow.privacy.accounting.events import ApproxDPEvent, Event, RepeatedEvent
from privflow.privacy.accounting.plan import MAX_EPSILON
from privflow.privacy.ledger import Ledger, check_budget_at, compose_epsilon
from privflow.privacy.mechanisms import dp_bounds, dp_histogram
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism

ROWS_DIGITS = 2  # expected_rows: the DP row count rounded to this many significant digits
NULLABLE_SHARE = 0.001  # nullable when the DP missing count passes this share of the DP row count
ATOM_SHARE = 0.05  # a value holding at least this share of the DP row count is an atom
EXACT_INTEGER_SUPPORT = 1024  # integer columns this narrow keep every value exactly: no atoms needed
DELTA_SHARE = 0.1  # the default delta: this share of the dataset budget's delta
YAML_SUFFIXES = (".yaml", ".yml")


def default_name(data: Path) -> str:
    """A dataset name from the file's name: its stem without table suffixes, other characters as '_'."""
    stem = data.name
    for suffix in (".gz", ".parquet", ".pq", ".csv", ".tsv", ".txt"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "dataset"


@dataclass(frozen=True)
class DraftPlan:
    """What pre-flight established from public inputs: the file's columns, the dataset, the split."""

    data: Path
    out: Path
    name: str
    budget: Budget
    columns: tuple[str, ...]
    parquet: bool
    epsilon: float | None
    delta: float

    @property
    def part(self) -> float:
        """epsilon / (d + 1): the row count's and each column's share."""
        return float(self.epsilon or 0.0) / (len(self.columns) + 1)

    @property
    def column_delta(self) -> float:
        return self.delta / len(self.columns)

    @property
    def events(self) -> list[Event]:
        if self.epsilon is None:
            return []
        return [
            laplace_event(1.0 / self.part),
            RepeatedEvent(ApproxDPEvent(self.part, self.column_delta), len(self.columns)),
        ]

    def stages(self) -> dict[str, str]:
        d = len(self.columns)
        return {
            "schema_draft": f"row count eps={self.part:.4g}; {d} column(s) at eps={self.part:.4g}, "
            f"delta={self.column_delta:.3g} each"
        }


def _finite(value: float | None, what: str) -> None:
    if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
        raise ConfigError(f"{what} must be a finite number, got {value!r}.")


def plan_draft(
    data: Path,
    out: Path,
    name: str | None,
    epsilon: float | None,
    delta: float | None,
    budget_epsilon: float | None,
    budget_delta: float | None,
    store: Path,
    force: bool = False,
) -> DraftPlan:
    """Every check a user's mistake can fail, from the arguments, the header and the ledger: no row is
    read and nothing is recorded. Raises a PrivflowError (ConfigError, DataError, BudgetExceeded)."""
    for value, what in ((epsilon, "--epsilon"), (delta, "--delta"), (budget_epsilon, "--budget-epsilon")):
        _finite(value, what)
    _finite(budget_delta, "--budget-delta")
    if epsilon is None and delta is not None:
        raise ConfigError("--delta applies to a draft filled by DP; give --epsilon too, or drop --delta.")
    if epsilon is not None and not 0 < epsilon <= MAX_EPSILON:
        raise ConfigError(
            f"--epsilon must lie in (0, {MAX_EPSILON:g}], got {epsilon:g}: it is the privacy the draft's DP "
            "statistics spend on the dataset (e.g. 0.5)."
        )
    b_eps = float(budget_epsilon) if budget_epsilon is not None else DatasetInfo.model_fields["budget"].default.epsilon
    b_delta = float(budget_delta) if budget_delta is not None else DatasetInfo.model_fields["budget"].default.delta
    if not b_eps > 0 or not 0 < b_delta < 1:
        raise ConfigError(
            f"The dataset's budget needs --budget-epsilon > 0 and --budget-delta in (0, 1); got epsilon={b_eps:g}, "
            f"delta={b_delta:g}."
        )
    budget = Budget(epsilon=b_eps, delta=b_delta)
    dataset = name if name is not None else default_name(Path(data))
    try:
        DatasetInfo(name=dataset, budget=budget)
    except ValidationError:
        raise ConfigError(
            f"Dataset name '{dataset}' may hold only letters, digits, '_', '.' and '-' (it is the ledger's key); "
            "pass --name."
        ) from None
    d = DELTA_SHARE * b_delta if delta is None else float(delta)
    if epsilon is not None and not 0 < d <= b_delta:
        raise ConfigError(
            f"--delta must lie in (0, {b_delta:g}], the dataset budget's delta; got {d:g}. The default is "
            f"{DELTA_SHARE:g} of the budget's delta."
        )
    _check_out(Path(out), Path(data), force)
    _, header, dtypes = read_header(Path(data))
    plan = DraftPlan(Path(data), Path(out), dataset, budget, tuple(header), dtypes is not None, epsilon, d)
    if epsilon is not None:
        if plan.column_delta > dp_histogram.MAX_DELTA:
            raise ConfigError(f"--delta {d:g} over {len(header)} column(s) is too large; use at most 1e-3.")
        check_budget_at(
            Path(store) / "ledger.db", dataset, plan.events, (budget.epsilon, budget.delta), who="This schema draft"
        )
    return plan


def _check_out(out: Path, data: Path, force: bool) -> None:
    if out.suffix.lower() not in YAML_SUFFIXES:
        raise ConfigError(f"Output '{out}' must end in .yaml or .yml (a schema file).")
    if out.is_dir():
        raise ConfigError(f"Output '{out}' is a folder; pass -o a file name ending in .yaml.")
    if out.exists() and out.resolve() == data.resolve():
        raise ConfigError(f"Output '{out}' is the data file itself; pass -o another name.")
    if out.exists() and not force:
        raise ConfigError(f"Output '{out}' already exists; pass --force to replace it, or -o another name.")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"Output '{out}' cannot be written: '{folder}' is not a folder this user can write to.")


@dataclass
class DraftResult:
    """What the command reports: the file, the dataset, and for a DP draft the ledger run."""

    out: Path
    name: str
    text: str
    run_id: str | None = None
    epsilon: float = 0.0
    notes: list[str] = field(default_factory=list)


def write_draft(plan: DraftPlan, store: Path) -> DraftResult:
    """Read the table, suggest types, fill by DP when the plan has an epsilon (reserved first,
    abandoned if anything fails after, settled at the end), and write the draft."""
    if plan.epsilon is None:
        frame, tokens, suggestions = _read(plan)
        text = _text(plan, tokens, suggestions, None, None)
        _write(plan.out, text)
        return DraftResult(plan.out, plan.name, text)
    ledger = Ledger(Path(store) / "ledger.db")
    notes = ledger.ensure_dataset(plan.name, plan.budget.epsilon, plan.budget.delta)
    run_id = f"schema-draft-{uuid.uuid4()}"
    ledger.reserve(plan.name, run_id, plan.events, plan.stages())
    try:
        frame, tokens, suggestions = _read(plan)
        filled = _fill(plan, frame, suggestions)
        text = _text(plan, tokens, suggestions, filled, run_id)
        _write(plan.out, text)
    except BaseException:
        ledger.abandon(run_id)  # rows were read: the reservation stays counted
        raise
    ledger.settle(run_id, plan.events)
    spent = compose_epsilon(plan.events, plan.budget.delta)
    return DraftResult(plan.out, plan.name, text, run_id, spent, list(notes))


def _read(plan: DraftPlan) -> tuple[pl.DataFrame, tuple[str, ...], list[dd.Suggestion]]:
    frame = read_table(plan.data)
    frame = frame.select([c for c in plan.columns if c in frame.columns])  # a row the reader could not read: missing
    if tuple(frame.columns) != plan.columns:
        raise DataError(f"Data file '{plan.data}' changed while it was drafted from; run the command again.")
    tokens = dd.missing_tokens(frame)
    frame = dd.normalised(frame, tokens)
    return frame, tokens, dd.suggest(frame, plan.parquet)


@dataclass
class _Filled:
    rows: int
    rows_comment: str
    columns: dict[str, list[dd.Entry]]


def _nullable(noisy_missing: float, rows: int, eps: float) -> dd.Entry:
    about = max(0, int(round(noisy_missing)))
    return dd.Entry(
        "nullable",
        bool(noisy_missing > NULLABLE_SHARE * max(rows, 1)),
        f"DP count of missing values about {about} (Laplace, eps {eps:.3g}); true above {NULLABLE_SHARE:.1%} of "
        "the rows",
    )


def _fill(plan: DraftPlan, frame: pl.DataFrame, suggestions: list[dd.Suggestion]) -> _Filled:
    part, cdelta = plan.part, plan.column_delta
    noisy_rows = float(laplace_mechanism(np.array([float(frame.height)]), 1.0, 1.0 / part)[0])
    rows = _round_rows(noisy_rows)
    rows_comment = f"DP row count (Laplace, eps {part:.3g}) rounded to {ROWS_DIGITS} significant digits"
    columns: dict[str, list[dd.Entry]] = {}
    for sug in suggestions:
        s = frame.get_column(sug.name)
        if sug.type in ("numeric", "integer"):
            columns[sug.name] = _fill_number(sug, s, part, cdelta, rows)
        elif sug.type in ("date", "datetime"):
            columns[sug.name] = _fill_time(sug, s, part, rows)
        elif sug.type == "categorical":
            columns[sug.name] = _fill_categories(s, part, cdelta, rows)
        else:
            missing = float(laplace_mechanism(np.array([float(s.null_count())]), 1.0, 1.0 / part)[0])
            columns[sug.name] = [_nullable(missing, rows, part)]
    return _Filled(rows, rows_comment, columns)


def _round_rows(noisy: float) -> int:
    if noisy < 1:
        return 1
    digits = ROWS_DIGITS - 1 - int(math.floor(math.log10(noisy)))
    return max(1, int(round(noisy, digits)))


def _unfound(what: str) -> str:
    return (
        f"draft placeholder: no {what} passed the DP threshold (too few rows for this epsilon); fill with public values"
    )


def _fill_number(sug: dd.Suggestion, s: pl.Series, part: float, cdelta: float, rows: int) -> list[dd.Entry]:
    values = dd.numbers(s)
    present = values[np.isfinite(values)]
    missing = int(values.size - present.size)
    mech = dp_bounds.DPBounds(part / 2, "number")
    rel = mech.release(present, missing)
    integer = sug.type == "integer"
    keys = [int(v) if integer and float(v).is_integer() else float(v) for v in present.tolist()]
    hist = dp_histogram.ThresholdedHistogram(part / 2, cdelta)
    kept = hist.release(Counter(keys))
    out: list[dd.Entry] = []
    if not rel.found:
        out.append(dd.Entry("bounds", [DRAFT_PLACEHOLDER, DRAFT_PLACEHOLDER], _unfound("cell of values")))
        out.append(_nullable(rel.noisy_missing, rows, part / 2))
        return out
    low, high = dp_bounds.nice_bounds(float(rel.low), float(rel.high), integer)  # type: ignore[arg-type]
    atoms = sorted((k for k, c in kept.items() if c >= ATOM_SHARE * max(rows, 1)), key=lambda k: -kept[k])[:MAX_ATOMS]
    if integer and high - low <= EXACT_INTEGER_SUPPORT:
        atoms = []  # every value of a narrow integer column is kept exactly already
    atoms = sorted(float(a) for a in atoms)  # type: ignore[arg-type]
    if atoms:
        low, high = min(low, atoms[0]), max(high, atoms[-1])
    bound = [int(low), int(high)] if integer or (low.is_integer() and high.is_integer()) else [low, high]
    out.append(
        dd.Entry(
            "bounds",
            bound,
            f"DP bounds: outermost cells of a public log-scale grid (+-{dp_bounds.NUMBER_LIMIT:.0e}) whose DP count "
            f"passed {rel.threshold:.3g}, widened {dp_bounds.MARGIN:.0%} and rounded outward, eps {part / 2:.3g}",
        )
    )
    out.append(_nullable(rel.noisy_missing, rows, part / 2))
    if atoms:
        out.append(
            dd.Entry(
                "atoms",
                [int(a) if integer else a for a in atoms],
                f"DP thresholded histogram: values holding at least {ATOM_SHARE:.0%} of the DP row count, "
                f"eps {part / 2:.3g}, delta {cdelta:.2g}",
            )
        )
    return out


def _fill_time(sug: dd.Suggestion, s: pl.Series, part: float, rows: int) -> list[dd.Entry]:
    values = dd.days(s, sug)
    present = values[np.isfinite(values)]
    rel = dp_bounds.DPBounds(part, "year").release(present, int(values.size - present.size))
    out: list[dd.Entry] = []
    if rel.found:
        first, last = dp_bounds.year_span(float(rel.low), float(rel.high))  # type: ignore[arg-type]
        bound = [dd.iso_day(first, sug.type), dd.iso_day(last, sug.type, end=True)]
        out.append(
            dd.Entry(
                "bounds",
                bound,
                f"DP bounds: first and last calendar year ({dp_bounds.FIRST_YEAR}-{dp_bounds.LAST_YEAR}) whose DP "
                f"count passed {rel.threshold:.3g}, eps {part:.3g}",
            )
        )
    else:
        out.append(dd.Entry("bounds", [DRAFT_PLACEHOLDER, DRAFT_PLACEHOLDER], _unfound("year")))
    out.append(_nullable(rel.noisy_missing, rows, part))
    return out


def _fill_categories(s: pl.Series, part: float, cdelta: float, rows: int) -> list[dd.Entry]:
    values = dd.texts(s)
    hist = dp_histogram.ThresholdedHistogram(part, cdelta)
    kept = hist.release(Counter(values), public=[None])
    categories = sorted(str(k) for k in kept if k is not None)
    out: list[dd.Entry] = []
    if categories:
        out.append(
            dd.Entry(
                "categories",
                categories,
                f"DP thresholded histogram: the values whose DP count passed {hist.threshold:.3g}, eps {part:.3g}, "
                f"delta {cdelta:.2g}",
            )
        )
    else:
        out.append(dd.Entry("categories", [DRAFT_PLACEHOLDER], _unfound("value")))
    out.append(_nullable(kept.get(None, 0.0), rows, part))
    return out


def _text(
    plan: DraftPlan,
    tokens: tuple[str, ...],
    suggestions: list[dd.Suggestion],
    filled: _Filled | None,
    run_id: str | None,
) -> str:
    header = [
        f"Schema drafted by `privflow schema draft` from '{plan.data.name}' on {date.today().isoformat()}.",
        "Review every line before using it: types marked 'suggested from the values' were read off the rows for",
        "the data owner (the curator) to check, and become public by that review.",
    ]
    if filled is None:
        header += [
            f"Every '{DRAFT_PLACEHOLDER}' is a draft placeholder: fill it with public knowledge (the data's",
            "documentation, definitions), rounded outward, never with the file's min/max; the schema refuses to",
            "load until then. Or draft with --epsilon E to fill them by DP, charged to the dataset's budget.",
        ]
    else:
        header += [
            f"Values marked 'DP' are differentially private statistics, charged to dataset '{plan.name}' in the",
            f"privacy ledger (run {run_id}: epsilon {plan.epsilon:g}, delta {plan.delta:.3g}, split equally over the",
            f"row count and the {len(plan.columns)} column(s); delta over the columns).",
        ]
    dataset = [
        dd.Entry("name", plan.name),
        dd.Entry("budget", {"epsilon": plan.budget.epsilon, "delta": plan.budget.delta}),
    ]
    if filled is not None:
        dataset.append(dd.Entry("expected_rows", filled.rows, filled.rows_comment))
        dataset.append(
            dd.Entry(
                "draft_run",
                run_id,
                "this draft's ledger run: models trained on this schema report epsilon composed with it",
            )
        )
    else:
        dataset.append(
            dd.Entry("#", "expected_rows: fill with a public, approximate row count (`privflow run` needs it)")
        )
    if tokens:
        dataset.append(
            dd.Entry("missing_values", list(tokens), "suggested from the values (curator's review makes it public)")
        )
    draft = dd.Draft(header, dataset)
    for sug in suggestions:
        values = dd.placeholder_entries(sug) if filled is None else filled.columns.get(sug.name, [])
        draft.columns.append(dd.column_entries(sug, values))
    return draft.text()


def _write(out: Path, text: str) -> None:
    """Written beside the target and renamed when complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


__all__ = [
    "ATOM_SHARE",
    "DELTA_SHARE",
    "NULLABLE_SHARE",
    "ROWS_DIGITS",
    "DraftPlan",
    "DraftResult",
    "default_name",
    "plan_draft",
    "write_draft",
]
