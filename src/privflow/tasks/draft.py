"""`privflow schema draft`: a schema drafted from a table, its values filled by DP when asked.

Without an epsilon nothing read from the rows goes into the draft but the curator-suggested
types and formats (privflow/data/draft.py): bounds and category lists are placeholders the data
owner fills, and the schema refuses to load until they are. With an epsilon the draft is a
charged run on its dataset like any other: planned from the header alone, checked against the
ledger and refused before a row is read when it does not fit (`plan_draft`), reserved, then
filled by DP and settled (`write_draft`).

The split of (epsilon, delta), planned from the header alone (d columns), in three parts:

- ROWS_SHARE of epsilon: the row count, one Laplace count (`laplace_mechanism`, sensitivity 1),
  `LaplaceEvent`; `expected_rows` is it rounded to ROWS_DIGITS significant digits;
- KINDS_SHARE of epsilon, equally over the d columns: each column's kind histogram, a Laplace
  histogram over the PUBLIC cells `data.draft.KIND_CELLS` at three levels: a detail cell (missing;
  each boolean label; zero, integers and numbers by decimals and sign; dates by format and
  day/month order; datetimes by format, order and the coarsest unit that holds the value; text),
  a group cell (missing, each boolean pair, number, date, each datetime format, text)
  and, for a non-zero number, a magnitude cell (its decade). A value is in one cell per level
  (its first match), L1 sensitivity 3 (`dp_histogram.PublicHistogram`, noise scale 3/epsilon):
  `RepeatedEvent(LaplaceEvent, d)`. The type, `decimals`, a date's format and day/month order, a
  datetime's format and `granularity`, a boolean's labels, `nullable` (true unless |DP missing
  count| + 3 sd < 0.5), the zero atom, the sign and the scale of a number column (the upper of
  its two fullest adjacent decades) are post-processing of these noisy counts
  (`data.draft.decide_kind`);
- VALUES_SHARE of epsilon and all of delta: the values' statistics, split over the columns by the
  weights of their DP-decided types (VALUE_WEIGHTS: numbers 2, dates 1.5, categoricals 8, the
  target 6, booleans and ignored columns 0: a category is listed only past the thresholded
  histogram's threshold, about ln(1 / delta) / epsilon rows, so a categorical buys most) and, for
  delta, equally over the thresholded histograms that run. A numeric or integer column: DP bounds
  from two exponential-mechanism quantiles, 0.5% and 99.5%, on a public log grid within windows
  around the DP scale (`dp_bounds.QuantileBounds`, pure DP; of the non-zero values when 0 is an
  atom), an integer column also a thresholded histogram for its atoms
  (`dp_histogram.ThresholdedHistogram`, approx DP) and, with an identifier's name, a Laplace count
  of distinct values (`ignore` when it is at least ID_SHARE of the present values); a date or
  datetime column: the years of its 0.5% and 99.5% quantiles by the exponential mechanism on the
  public years (`dp_bounds.YearQuantileBounds`, pure DP); a categorical column: a thresholded
  histogram whose values holding at least CATEGORY_SHARE of the present values (TARGET_SHARE for
  the target) are listed, the rest read as `other` (the column `ignore` when the listed ones cover
  less than COVER_SHARE: identifier-like or free text; a target with no class listed is left out
  with a warning). Since which of these run, and at which epsilon, depends on the DP types, the
  ledger records the part as ONE `ApproxDPEvent(epsilon_values, delta)`: basic composition, which
  holds for adaptively chosen mechanisms and budgets (a privacy filter, Rogers, Roth, Ullman &
  Vadhan 2016); each branch costs at most its share.

The ledger records `[LaplaceEvent(rows), RepeatedEvent(LaplaceEvent(kinds), d),
ApproxDPEvent(values)]`, (epsilon, delta) in all by basic composition and less by the ledger's
PLD composition. The draft writes `on_out_of_bounds: clamp` and `other` so that values past its
bounds (about 0.5% at each end by construction) are clamped and unlisted categories are read as
`other` instead of failing rows; it states those shares with DP figures, and warns when the
epsilon is too small for the table (a kind count's noise sd above 1% of the DP row count).
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
from typing import cast

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
from privflow.privacy.mechanisms.dp_quantile import CandidateQuantile
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism

ROWS_DIGITS = 2  # expected_rows: the DP row count rounded to this many significant digits
# the split of epsilon (module docstring): a wrong type fails every row of its column, a coarse
# bound or list only clamps its tail, so the kinds get 40% (25% drafted a 3,563-row, 14-column
# table's number columns as booleans at epsilon 0.3: results/draft_run_credit.md; and again, as
# datetimes and `ignore`, in 7 of 140 decisions when the weights below were tried)
ROWS_SHARE, KINDS_SHARE, VALUES_SHARE = 0.03, 0.40, 0.57
VALUE_WEIGHTS = {"numeric": 2.0, "integer": 2.0, "date": 1.5, "datetime": 1.5, "categorical": 8.0, "target": 6.0}
NULLABLE_SD = 3.0  # nullable unless the DP missing count + this many noise sd is below 0.5
ATOM_SHARE = 0.05  # a value holding at least this share of the present values (DP) is an atom
CATEGORY_SHARE = 0.05  # a category holding at least this share of the present values (DP) is listed
TARGET_SHARE = 0.002  # ... of the target's classes
TARGET_HINT_SHARE = 0.01  # a target that keeps no class: the epsilon at which classes this share pass
COVER_SHARE = 0.5  # a text column whose listed categories cover less than this share is `ignore`
ID_SHARE = 0.95  # an integer column with an identifier's name and this share of distinct values: ignore
NOISE_WARN = 0.01  # warn when a kind count's noise sd passes this share of the DP row count
OTHER_LABELS = ("other", "(other)", "other_")  # the first that is no category (case-blind) is `other`
PAIRS_SHARE = 0.15  # of the values' epsilon, when some columns may go missing together
PAIR_MISSING_SHARE = 0.05  # a missing-together candidate: this share of its values missing (DP, by PAIR_Z sd)
MAX_PAIR_COLUMNS = 4  # ... the most missing of them: at most 6 pairs
TOGETHER_SHARE = 0.005  # a pair goes missing together when at most this share of rows has one missing
PAIR_Z = 2.0  # ... by this many noise sd
POWER_SHARE = 0.01  # no rule is drafted where PAIR_Z noise sd of a pair count pass this share of the rows
EXACT_INTEGER_SUPPORT = 1024  # integer columns this narrow keep every value exactly: no atoms needed
# the default delta: this share of the dataset budget's delta. The ledger's bound for adaptively
# chosen runs keeps a quarter of the dataset's delta for all (epsilon, delta) releases together
# (privacy/ledger/filter.py, APPROX_DELTA_SHARE): at 0.1 a third draft of a dataset was refused
DELTA_SHARE = 0.02
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
    target: str | None = None
    positive: str | None = None

    @property
    def eps_rows(self) -> float:
        return ROWS_SHARE * float(self.epsilon or 0.0)

    @property
    def eps_kinds(self) -> float:
        """Each column's kind histogram's epsilon."""
        return KINDS_SHARE * float(self.epsilon or 0.0) / len(self.columns)

    @property
    def eps_values(self) -> float:
        return VALUES_SHARE * float(self.epsilon or 0.0)

    @property
    def column_delta(self) -> float:
        return self.delta / len(self.columns)

    @property
    def events(self) -> list[Event]:
        if self.epsilon is None:
            return []
        return [
            laplace_event(1.0 / self.eps_rows),
            RepeatedEvent(laplace_event(1.0 / self.eps_kinds), len(self.columns)),
            ApproxDPEvent(self.eps_values, self.delta),
        ]

    def stages(self) -> dict[str, str]:
        d = len(self.columns)
        return {
            "schema_draft": f"row count eps={self.eps_rows:.4g}; {d} kind histogram(s) at eps={self.eps_kinds:.4g} "
            f"each; value statistics eps={self.eps_values:.4g}, delta={self.delta:.3g} (split by DP types)"
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
    target: str | None = None,
    positive: str | None = None,
) -> DraftPlan:
    """Every check a user's mistake can fail, from the arguments, the header and the ledger: nothing
    is recorded, and no row is read except, for a DP draft, by the curator's data-identity check
    (tasks/dataset_identity.py: only where the ledger holds another dataset's charged rows).
    Raises a PrivflowError (ConfigError, DataError, BudgetExceeded)."""
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
    if positive is not None and target is None:
        raise ConfigError("--positive names the target's positive class; give --target COLUMN too.")
    if target is not None and target not in header:
        raise ConfigError(f"--target '{target}' is not a column of '{data}'; its columns: {', '.join(header)}.")
    if positive is not None and not positive.strip():
        raise ConfigError("--positive must be a class label as written in the data, not empty.")
    plan = DraftPlan(
        Path(data), Path(out), dataset, budget, tuple(header), dtypes is not None, epsilon, d, target, positive
    )
    if epsilon is not None:
        if plan.delta > dp_histogram.MAX_DELTA:  # the thresholded histograms share it
            raise ConfigError(f"--delta {d:g} is too large for the draft's thresholded histograms; use at most 1e-3.")
        # the curator's data-identity check: reads the rows only where another dataset has charged ones
        from privflow.tasks.dataset_identity import check_rows_not_charged_elsewhere

        check_rows_not_charged_elsewhere(Path(data), None, Path(store), dataset)
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
    _record_charged_rows(ledger, Path(store), plan.name, run_id, frame, text)
    spent = compose_epsilon(plan.events, plan.budget.delta)
    return DraftResult(plan.out, plan.name, text, run_id, spent, list(notes) + filled.notes)


def _record_charged_rows(ledger: Ledger, store: Path, name: str, run_id: str, frame: pl.DataFrame, text: str) -> None:
    """The keyed digests of the rows the draft read, as its own drafted schema coerces them
    (tasks/warm_start.py, `record_charged_rows`; curator-only, in the ledger), so that `privflow
    pretrain` refuses them as public. A draft that does not load as a schema yet (a placeholder
    the DP statistics could not fill) cannot coerce its rows: nothing is recorded for it, and the
    training runs on the same rows record their own."""
    import yaml

    from privflow.core.errors import PrivflowError
    from privflow.data.schema import Schema
    from privflow.data.validation import validate
    from privflow.tasks.warm_start import record_charged_rows

    try:
        schema = Schema.validated(yaml.safe_load(text), "The drafted schema")
        typed, _ = validate(frame, schema, "strict", None, lambda _failing, _passing: False)
    except PrivflowError:
        return
    record_charged_rows(ledger, store, name, run_id, typed)


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
    suggestions: list[dd.Suggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    top: list[dd.Entry] = field(default_factory=list)


def _nullable(kind: dd.KindDecision, eps: float) -> dd.Entry:
    """Nullable unless the DP missing count is confidently zero: noisy count + NULLABLE_SD sd < 0.5."""
    about = max(0, int(round(kind.missing)))
    nullable = not abs(kind.missing) + NULLABLE_SD * kind.sd < 0.5  # |.|: a very negative draw says nothing
    return dd.Entry(
        "nullable",
        bool(nullable),
        f"DP count of missing values about {about} (Laplace, eps {eps:.3g}); false only when its size is below 0.5 "
        f"by {NULLABLE_SD:g} noise sd",
    )


def _dtype_suggestion(name: str, dtype: pl.DataType) -> dd.Suggestion | None:
    """A Parquet column's type from its dtype (public metadata); None for a text column."""
    if dtype == pl.String or isinstance(dtype, pl.Categorical | pl.Enum):
        return None
    if dtype == pl.Boolean:
        return dd.Suggestion(name, "boolean", dd.FROM_DTYPE, labels=("true", "false"))
    if dtype.is_integer():
        return dd.Suggestion(name, "integer", dd.FROM_DTYPE)
    if dtype.is_float():
        return dd.Suggestion(name, "numeric", dd.FROM_DTYPE)
    if dtype == pl.Date:
        return dd.Suggestion(name, "date", dd.FROM_DTYPE, format="%Y-%m-%d")
    if isinstance(dtype, pl.Datetime):
        return dd.Suggestion(name, "datetime", dd.FROM_DTYPE, format="%Y-%m-%dT%H:%M:%S", granularity="second")
    return dd.Suggestion(name, "ignore", dd.FROM_DTYPE, note=f"stored as {dtype}, which privflow does not model")


def _fill(plan: DraftPlan, frame: pl.DataFrame, suggestions: list[dd.Suggestion]) -> _Filled:
    """Phase 1 (row count, each column's kind histogram: types), then phase 2 (value statistics,
    split by the DP types' weights). `suggestions` (read off the values) are not used here."""
    del suggestions  # types by DP only (privacy rule 2)
    noisy_rows = float(laplace_mechanism(np.array([float(frame.height)]), 1.0, 1.0 / plan.eps_rows)[0])
    rows = _round_rows(noisy_rows)
    rows_sd = math.sqrt(2.0) / plan.eps_rows
    cell_sd = math.sqrt(2.0) * dd.KIND_SENSITIVITY / plan.eps_kinds
    rows_comment = f"DP row count (Laplace, eps {plan.eps_rows:.3g}) rounded to {ROWS_DIGITS} significant digits"
    notes: list[str] = []
    if cell_sd > NOISE_WARN * max(noisy_rows, 1.0):
        notes.append(
            f"epsilon {plan.epsilon:g} is small for a table of about {rows:,} rows and {len(plan.columns)} columns: "
            f"a kind count's noise sd is about {cell_sd:.0f} rows, more than {NOISE_WARN:.0%} of the rows, so types, "
            "bounds and category lists are coarse; review them, or draft with a larger --epsilon"
        )
    kinds: dict[str, dd.KindDecision] = {}
    hist = dp_histogram.PublicHistogram(plan.eps_kinds, dd.KIND_SENSITIVITY)
    for name in plan.columns:
        s = frame.get_column(name)
        noisy = hist.release(dd.kind_counts(s.cast(pl.String)))
        kind = dd.decide_kind(name, noisy, noisy_rows, cell_sd, rows_sd)
        fixed = _dtype_suggestion(name, s.dtype) if plan.parquet else None
        sug = fixed if fixed is not None else kind.suggestion
        if name == plan.target and sug.type not in ("boolean", "categorical"):
            sug = dd.Suggestion(name, "categorical", "categorical: the target (--target)")
        kinds[name] = dd.KindDecision(sug, kind.present, kind.missing, kind.zeros, kind.negatives, kind.sd, kind.decade)
    weights = {n: _weight(k.suggestion, n == plan.target) for n, k in kinds.items()}
    pairs = _missing_pair_candidates(kinds)
    eps_pairs = PAIRS_SHARE * plan.eps_values if pairs else 0.0
    if pairs and PAIR_Z * _pair_sd(len(pairs), eps_pairs) > POWER_SHARE * max(noisy_rows, 1.0):
        notes.append(  # decided from public settings and DP counts before anything is spent on it
            f"columns missing together were not drafted: the DP pair counts' noise sd (about "
            f"{_pair_sd(len(pairs), eps_pairs):,.0f} rows) would be too large for {len(pairs)} pair(s) at this "
            "epsilon; declare `missing_together` rules from the data's documentation, or draft with a larger --epsilon"
        )
        pairs, eps_pairs = [], 0.0
    unit = (plan.eps_values - eps_pairs) / max(sum(weights.values()), 1e-12)
    histograms = sum(1 for n, k in kinds.items() if k.suggestion.type in ("categorical", "integer") and weights[n] > 0)
    hdelta = plan.delta / max(histograms, 1)
    columns: dict[str, list[dd.Entry]] = {}
    out_suggestions: list[dd.Suggestion] = []
    top: list[dd.Entry] = []
    for name in plan.columns:
        kind = kinds[name]
        s = frame.get_column(name)
        eps = unit * weights[name]
        t = kind.suggestion.type
        if t in ("numeric", "integer"):
            sug, entries = _fill_number(kind, s, eps, hdelta, plan.eps_kinds)
        elif t in ("date", "datetime"):
            sug, entries = kind.suggestion, _fill_time(kind, s, eps, plan.eps_kinds)
        elif t == "categorical":
            sug, entries = _fill_categories(kind, s, eps, hdelta, plan, notes)
        else:
            sug, entries = kind.suggestion, ([] if t == "ignore" else [_nullable(kind, plan.eps_kinds)])
        out_suggestions.append(sug)
        columns[name] = entries
    if plan.target is not None:
        top += _target_entries(plan, out_suggestions, columns, notes)
    if pairs:
        top += _missing_together(frame, pairs, eps_pairs, noisy_rows)
    return _Filled(rows, rows_comment, columns, out_suggestions, notes, top)


def _missing_pair_candidates(kinds: dict[str, dd.KindDecision]) -> list[tuple[str, str]]:
    """Pairs of modelled columns that may go missing together: each with a DP missing share of at
    least PAIR_MISSING_SHARE by PAIR_Z noise sd (post-processing of the kind counts: a column whose
    missing count is noise alone is no candidate), at most MAX_PAIR_COLUMNS of them (the most
    missing first), so that the pairs' count vector stays short."""
    shares = {}
    for n, k in kinds.items():
        rows = max(k.missing + k.present, 1.0)
        if k.suggestion.type != "ignore" and k.missing - PAIR_Z * k.sd >= PAIR_MISSING_SHARE * rows:
            shares[n] = k.missing / rows
    names = sorted(shares, key=lambda n: -shares[n])[:MAX_PAIR_COLUMNS]
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def _pair_sd(pairs: int, eps: float) -> float:
    """The noise sd of one pair count: Laplace at L1 sensitivity `pairs` and `eps`."""
    return math.sqrt(2.0) * pairs / eps


def _missing_together(frame: pl.DataFrame, pairs: list[tuple[str, str]], eps: float, rows: float) -> list[dd.Entry]:
    """`missing_together` rules from one Laplace release of, per candidate pair, the rows with
    exactly one of the two missing (a row is in every pair's count at most once: L1 sensitivity
    len(pairs)); a pair whose noisy count is under TOGETHER_SHARE of the rows by PAIR_Z noise sd
    goes missing together, and pairs sharing a column join one rule (the caller releases nothing
    where PAIR_Z noise sd would pass POWER_SHARE of the rows: the counts could not tell a pair
    apart). Public once declared: the sampler keeps them on every released row (data/rules.py)."""
    missing = {n: frame.get_column(n).is_null().to_numpy() for pair in pairs for n in pair}
    counts = np.array([float(np.sum(missing[a] ^ missing[b])) for a, b in pairs])
    noisy = laplace_mechanism(counts, float(len(pairs)), 1.0 / eps)
    sd = _pair_sd(len(pairs), eps)
    groups: dict[str, set[str]] = {}
    for (a, b), n in zip(pairs, noisy, strict=True):
        if n <= TOGETHER_SHARE * max(rows, 1.0) + PAIR_Z * sd:
            merged = groups.get(a, {a}) | groups.get(b, {b})
            for c in merged:
                groups[c] = merged
    rules = {tuple(sorted(g)) for g in groups.values()}
    if not rules:
        return []
    said = (
        f"DP counts of rows with exactly one of a pair missing (Laplace, eps {eps:.3g} over {len(pairs)} pair(s)) "
        f"under {TOGETHER_SHARE:.1%} of the rows by {PAIR_Z:g} noise sd: kept on every synthetic row"
    )
    value = [{"kind": "missing_together", "columns": list(r)} for r in sorted(rules)]
    return [dd.Entry("rules", value, said)]


def _weight(sug: dd.Suggestion, target: bool) -> float:
    if target and sug.type == "categorical":
        return VALUE_WEIGHTS["target"]
    return VALUE_WEIGHTS.get(sug.type, 0.0)


def _round_rows(noisy: float) -> int:
    if noisy < 1:
        return 1
    digits = ROWS_DIGITS - 1 - int(math.floor(math.log10(noisy)))
    return max(1, int(round(noisy, digits)))


def _fill_number(
    kind: dd.KindDecision, s: pl.Series, eps: float, hdelta: float, eps_kinds: float
) -> tuple[dd.Suggestion, list[dd.Entry]]:
    """Bounds from DP quantiles (of the non-zero values when 0 is an atom), the zero atom from the
    kind counts, an integer column's other atoms from a thresholded histogram, and for an integer
    column with an identifier's name a DP count of distinct values (ignore when nearly all distinct)."""
    sug = kind.suggestion
    values = dd.numbers(s)
    present = values[np.isfinite(values)]
    integer = sug.type == "integer" or (sug.type == "numeric" and sug.decimals == 0)  # whole numbers
    shares = {"bounds": 3.0, "atoms": 0.5 if integer else 0.0, "distinct": 0.0}
    if integer and dd.ID_NAME.search(sug.name):
        shares["distinct"] = 0.5
    part = eps / sum(shares.values())
    if shares["distinct"]:
        distinct = float(laplace_mechanism(np.array([float(np.unique(present).size)]), 1.0, 1.0 / part)[0])
        if distinct >= ID_SHARE * kind.present:
            note = f"an identifier's name and a DP count of distinct values about {distinct:.0f} of {kind.present:.0f}"
            return dd.Suggestion(sug.name, "ignore", dd.BY_DP, note=note), []
    # three noise sd of the two cells (0 and the label '0') above the share: at one sd, a column with
    # no zero got a zero atom about once in 14 at epsilon 0.3 (results/draft_run_credit.md, Age)
    zero_atom = kind.zeros >= ATOM_SHARE * kind.present + dd.SAFE_Z * math.sqrt(2.0) * kind.sd
    body = present[present != 0] if zero_atom else present
    margin = 2.0 * math.sqrt(2.0 * dd.NUMBER_DECIMALS + 2.0) * kind.sd
    sign: dp_bounds.Sign = "both"
    if kind.negatives <= max(dp_bounds.SIGN_SHARE * kind.present, margin):
        sign = "nonnegative"
    elif kind.present - kind.negatives - kind.zeros <= max(dp_bounds.SIGN_SHARE * kind.present, margin) and (
        kind.present > 2.0 * margin  # too few present values for the noise to tell the sign: both
    ):
        sign = "nonpositive"
    if kind.decade is not None:  # the upper edge of the two fullest adjacent decades (DP kind counts)
        mech = dp_bounds.QuantileBounds(part * 1.5, 10.0 ** (kind.decade + 1), sign)  # each end 1.5 of the 3 parts
    else:  # no decade stood out of the noise: a wide, flat public window, 1e-3 to 1e6
        mech = dp_bounds.QuantileBounds(part * 1.5, 100.0, sign, below=5, above=4, prior=0.0)
    rel = mech.release(body)
    lows, _, highs, _ = mech.candidates()
    rank_error = CandidateQuantile(
        dp_bounds.HIGH_Q, mech.epsilon, tuple(cast(np.ndarray, max(lows, highs, key=len)))
    ).rank_error()
    low, high = dp_bounds.round_out(rel.low, rel.high, integer)
    atoms: list[float] = [0.0] if zero_atom else []
    if shares["atoms"]:
        hist = dp_histogram.ThresholdedHistogram(part * shares["atoms"], hdelta)
        keys = Counter(int(v) for v in body.tolist() if float(v).is_integer())
        kept = hist.release(keys)
        more = sorted((k for k, c in kept.items() if c >= ATOM_SHARE * kind.present), key=lambda k: -kept[k])
        atoms += [float(k) for k in more[: MAX_ATOMS - len(atoms)]]  # type: ignore[arg-type]
    if integer and high - low <= EXACT_INTEGER_SUPPORT:
        atoms = []  # every value of a narrow integer column is kept exactly already
    atoms = sorted(set(atoms))
    if atoms:
        low, high = min(low, atoms[0]), max(high, atoms[-1])
    if zero_atom:  # the bounds are of the non-zero values: they hold 0 too
        low, high = min(low, 0.0), max(high, 0.0)
    bound = [int(low), int(high)] if integer or (low.is_integer() and high.is_integer()) else [low, high]
    where = "non-zero values" if zero_atom else "values"
    out = [
        dd.Entry(
            "bounds",
            bound,
            f"DP bounds: the {dp_bounds.LOW_Q:.1%} and {dp_bounds.HIGH_Q:.1%} DP quantiles of the {where} (exponential "
            f"mechanism on a public log grid, eps {part * 1.5:.3g} each), rounded outward; at this epsilon a pick "
            f"lies within about {rank_error:,.0f} rows ({rank_error / max(kind.present, 1.0):.0%} of the values) of "
            "its quantile with 95% probability, so more or fewer may be clamped: `privflow check` counts them "
            "(curator-only)",
        ),
        _nullable(kind, eps_kinds),
    ]
    if atoms:
        out.append(
            dd.Entry(
                "atoms",
                [int(a) if integer else a for a in atoms],
                f"DP counts: values holding at least {ATOM_SHARE:.0%} of the present values (0: the kind histogram, "
                f"about {max(kind.zeros, 0) / kind.present:.0%}; others: a thresholded histogram)",
            )
        )
    return sug, out


def _fill_time(kind: dd.KindDecision, s: pl.Series, eps: float, eps_kinds: float) -> list[dd.Entry]:
    """DP bounds of a date or datetime column: the 0.5% and 99.5% DP quantiles on the public year
    grid (`dp_bounds.YearQuantileBounds`), the first and last day of the years they pick."""
    sug = kind.suggestion
    values = dd.days(s, sug)
    present = values[np.isfinite(values)]
    first, last = dp_bounds.YearQuantileBounds(eps / 2).release(present)
    bound = [dd.iso_day(first, sug.type), dd.iso_day(last, sug.type, end=True)]
    last_unit = {"minute": "T23:59:00", "hour": "T23:00:00", "day": "T00:00:00"}.get(sug.granularity or "")
    if sug.type == "datetime" and last_unit is not None:
        bound[1] = last.isoformat() + last_unit  # the last day's last whole unit of the granularity
    comment = (
        f"DP bounds: the years of the {dp_bounds.LOW_Q:.1%} and {dp_bounds.HIGH_Q:.1%} DP quantiles (exponential "
        f"mechanism on the public years {dp_bounds.FIRST_YEAR}-{dp_bounds.LAST_YEAR}, eps {eps / 2:.3g} each); "
        "values past them are clamped"
    )
    return [dd.Entry("bounds", bound, comment), _nullable(kind, eps_kinds)]


def _epsilon_to_list(plan: DraftPlan, hist: dp_histogram.ThresholdedHistogram, eps: float, rows: float) -> str | None:
    """The draft's --epsilon (rounded up) at which a value held by `rows` (DP) passes the column's
    thresholded histogram, its share `eps` of the draft's epsilon scaling with it; None where it
    passes at this epsilon already (or `rows` is too few to say)."""
    if not hist.threshold > rows > 1.0:
        return None
    return _round_up(float(plan.epsilon or 0.0) * hist.epsilon_to_pass(rows) / eps)


def _round_up(x: float) -> str:
    """x rounded up to two significant digits, as text."""
    if not x > 0:
        return "0"
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return f"{float(f'{math.ceil(round(x / step, 9)) * step:.12g}'):g}"


def _other_label(categories: list[str]) -> str:
    taken = {c.casefold() for c in categories} | {t.casefold() for t in dd.MISSING_TOKENS}
    return next((o for o in OTHER_LABELS if o.casefold() not in taken), f"other_{len(categories)}")


def _fill_categories(
    kind: dd.KindDecision, s: pl.Series, eps: float, hdelta: float, plan: DraftPlan, notes: list[str]
) -> tuple[dd.Suggestion, list[dd.Entry]]:
    """The values whose DP count passes the thresholded histogram's threshold and holds at least
    CATEGORY_SHARE (TARGET_SHARE for the target) of the present values; the rest read as `other`."""
    sug = kind.suggestion
    target = sug.name == plan.target
    share = TARGET_SHARE if target else CATEGORY_SHARE
    hist = dp_histogram.ThresholdedHistogram(eps, hdelta)
    need = None if target else _epsilon_to_list(plan, hist, eps, share * kind.present)
    if need is not None:
        notes.append(
            f"'{sug.name}': at this epsilon a value is listed only when it holds about {hist.threshold:,.0f} rows "
            f"({hist.threshold / kind.present:.0%} of its values, DP), so values holding {share:.0%} are read as "
            f"`other`; a draft at --epsilon {need} or more lists them (the thresholded histogram's "
            "threshold is 1 + ln(1/delta) / epsilon rows: no DP release can list a value held by fewer rows than about "
            "ln(1/delta) / epsilon)"
        )
    kept = hist.release(Counter(v for v in dd.texts(s) if v is not None))
    listed = {str(k): c for k, c in kept.items() if c >= share * kind.present}
    cover = sum(listed.values()) / kind.present
    if not target and (not listed or cover < COVER_SHARE):
        note = (
            f"the values holding at least {share:.0%} of the rows (DP) cover about {max(cover, 0):.0%} of them: "
            "identifier-like or free text, or too few rows for this epsilon"
        )
        return dd.Suggestion(sug.name, "ignore", dd.BY_DP, note=note), []
    out: list[dd.Entry] = []
    if not listed:
        need = _epsilon_to_list(plan, hist, eps, TARGET_HINT_SHARE * kind.present)
        hint = ""
        if need is not None:
            hint = (
                f" (a class is listed when it holds about {hist.threshold:,.0f} rows here; at --epsilon "
                f"{need} classes holding {TARGET_HINT_SHARE:.0%} of the rows pass)"
            )
        notes.append(
            f"target '{sug.name}': no class passed the DP threshold (too few rows for this epsilon), so the draft "
            f"leaves it out (type ignore, no `target`); declare its classes by hand, or draft with a larger --epsilon"
            + hint
        )
        return dd.Suggestion(sug.name, "ignore", dd.BY_DP, note="the target: no class passed the DP threshold"), out
    categories = sorted(listed)
    if plan.positive is not None and target and plan.positive not in categories:
        categories.append(plan.positive)  # the user's public word: it is a class
    rest = max(0.0, 1.0 - cover)
    other = _other_label(categories)
    out.append(
        dd.Entry(
            "categories",
            [*categories, other],
            f"DP thresholded histogram: the values holding at least {share:.1%} of the present values (DP count above "
            f"{max(hist.threshold, share * kind.present):.3g}), eps {eps:.3g}, delta {hdelta:.2g}; about {rest:.1%} of "
            f"the values (DP) are read as '{other}'",
        )
    )
    out.append(_nullable(kind, plan.eps_kinds))
    out.append(dd.Entry("other", other, "values not listed are read as this category"))
    sd = math.sqrt(2.0) / eps
    if target and rest * kind.present > 3.0 * sd * math.sqrt(len(listed) + 1):
        notes.append(
            f"target '{sug.name}': about {rest:.1%} of its rows (DP) hold classes below the DP threshold and are read "
            f"as '{other}'; list them by hand if they are known public classes"
        )
    return sug, out


def _target_entries(
    plan: DraftPlan, suggestions: list[dd.Suggestion], columns: dict[str, list[dd.Entry]], notes: list[str]
) -> list[dd.Entry]:
    sug = next(s for s in suggestions if s.name == plan.target)
    if sug.type == "ignore":
        return []
    out = [dd.Entry("target", plan.target, "--target")]
    if plan.positive is None:
        return out
    classes: list[str] = []
    if sug.type == "boolean" and sug.labels is not None:
        classes = list(sug.labels)
    for e in columns.get(sug.name, []):
        if e.key == "categories" and isinstance(e.value, list):
            classes = [str(v) for v in e.value]
    match = next((c for c in classes if c == plan.positive), None)
    match = match or next((c for c in classes if c.casefold() == plan.positive.casefold()), None)
    if match is None:
        notes.append(f"--positive '{plan.positive}' is not one of target '{plan.target}' classes {classes}; not set")
        return out
    out.append(dd.Entry("target_positive", match, "--positive"))
    return out


def _text(
    plan: DraftPlan,
    tokens: tuple[str, ...],
    suggestions: list[dd.Suggestion],
    filled: _Filled | None,
    run_id: str | None,
) -> str:
    header = [f"Schema drafted by `privflow schema draft` from '{plan.data.name}' on {date.today().isoformat()}."]
    if filled is None:
        header += [
            "Review every line before using it: types marked 'suggested from the values' were read off the rows for",
            "the data owner (the curator) to check, and become public by that review.",
        ]
        header += [
            f"Every '{DRAFT_PLACEHOLDER}' is a draft placeholder: fill it with public knowledge (the data's",
            "documentation, definitions), rounded outward, never with the file's min/max; the schema refuses to",
            "load until then. Or draft with --epsilon E to fill them by DP, charged to the dataset's budget.",
        ]
    else:
        header += [
            "Every type, format, bound, list and flag below is a DP statistic or public metadata (the header,",
            f"Parquet dtypes), charged to dataset '{plan.name}' in the privacy ledger (run {run_id}: epsilon",
            f"{plan.epsilon:g}, delta {plan.delta:.3g}: {ROWS_SHARE:.0%} the row count, {KINDS_SHARE:.0%} the kind "
            f"histograms of the {len(plan.columns)} column(s), {VALUES_SHARE:.0%} and delta the",
            "values' statistics, split by the DP types). Values past the bounds are clamped and unlisted categories",
            "read as `other` (on_out_of_bounds: clamp); review it as you would any schema.",
        ]
        header += [f"WARNING: {n}" for n in filled.notes]
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
        dataset.append(dd.Entry("on_out_of_bounds", "clamp", "a value past its column's drafted bounds is clamped"))
        tokens = dd.MISSING_TOKENS
    else:
        dataset.append(
            dd.Entry("#", "expected_rows: fill with a public, approximate row count (`privflow run` needs it)")
        )
    if tokens:
        said = "a public list of text that often means missing" if filled else "suggested from the values"
        dataset.append(dd.Entry("missing_values", list(tokens), f"{said} (curator's review makes it public)"))
    draft = dd.Draft(header, dataset, top=filled.top if filled is not None else [])
    for sug in filled.suggestions if filled is not None else suggestions:
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
    "KINDS_SHARE",
    "ROWS_SHARE",
    "VALUES_SHARE",
    "ROWS_DIGITS",
    "DraftPlan",
    "DraftResult",
    "default_name",
    "plan_draft",
    "write_draft",
]
