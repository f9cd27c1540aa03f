"""`privflow check`: a free, curator-only dry run of validation that says which rows and columns fail.

A run's validation gate is a DP mechanism: its messages may depend on one row only through DP
counts, so they never name a failing column or value (privacy rule 8). The data owner sees
their own rows anyway, so this command tells them exactly, from the same reader
(`privflow.data.io.read_table`) and the same checks (`privflow.data.validation.validate`, with a
gate that never stops and its quarantine file, in a private temporary folder deleted on exit,
as the list of failing rows and the checks each fails), and how many values of each column were
clamped to a bound or read as the column's `other` instead of failing (rows that pass, with a
changed value). It releases nothing and records nothing:
no ledger, no MLflow, no Prefect, no store. Its output holds exact counts and raw values from
the private rows: for the curator, never for publication.

Exit statuses: 0 every row passes; 3 some row fails a check (or the table has no row); 2 a bad
data path, file or schema (one paragraph, as `privflow run`'s pre-flight says it).
"""

from __future__ import annotations

import difflib
import math
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from privflow.cli._common import EXIT_AUDIT, VerboseOpt, guarded

if TYPE_CHECKING:
    import polars as pl

    from privflow.data.schema import Column, Schema
    from privflow.data.validation import Failure, ValidationReport

EXIT_ROWS_FAIL = EXIT_AUDIT  # 3: the CLI's "ran fine, the verdict is not the healthy one"

CURATOR_ONLY = (
    "CURATOR-ONLY: exact counts and values from the private rows; not differentially private, not for "
    "publication. Nothing was recorded or charged."
)
PUBLIC_SCHEMA = (
    "The schema is public: change it with what is true of the data's domain (its documentation), not with "
    "what only this file shows."
)
MISSING_LIKE = {"?", "-", "--", ".", "na", "n/a", "#n/a", "nan", "null", "none", "nil", "missing"}
POINT_MASS_SHARE = 0.05  # a value held by this share of the passing rows of a numeric column is a point mass
POINT_MASS_MIN_ROWS = 20  # fewer passing rows than this: no point-mass advice
CLOSE_MATCH = 0.75  # difflib ratio above which an unknown category is taken for a typo of a declared one
_MAX_SHOWN = 40  # characters of a value shown


def check(
    data: Annotated[Path, typer.Option("--data", help="Input table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML).")],
    examples: Annotated[
        int, typer.Option("--examples", min=0, help="Example values shown per failing check (distinct, most frequent).")
    ] = 5,
    verbose: VerboseOpt = False,
) -> None:
    """Curator-only, free dry run of validation: which rows and columns fail, with examples and fixes.

    The checks of a run's validation; nothing is released or recorded (no ledger, MLflow, Prefect or store).

    Exact counts and values: not for publication. Exit status 0: every row passes; 3: rows fail; 2: bad input.
    """
    status = guarded(verbose, lambda: _check(data, schema, examples, verbose), spends=False)
    if status:
        raise typer.Exit(status)


# ----------------------------------------------------------------------------- the findings


@dataclass
class _Finding:
    """One failing check of one column, with what the curator may do about it."""

    failure: Failure
    values: list[tuple[str | None, int]]  # distinct raw values (stripped), most frequent first
    rows: list[int]  # their 0-based positions in the input
    advice: list[str]


def _check(data: Path, schema_path: Path, examples: int, verbose: bool) -> int:
    from privflow.core import env
    from privflow.core.source_uri import as_data_source
    from privflow.data.io import read_table
    from privflow.data.rules import curator_lines
    from privflow.data.schema import Schema
    from privflow.data.validation import ROWS
    from privflow.preflight import check_table

    env.set_verbosity(verbose)
    schema = Schema.from_yaml(schema_path)  # the checks `privflow run` does before reading a row
    source = as_data_source(data)  # a database URI's password masked in every message
    fmt = check_table(source, schema, "Data file")
    df = read_table(source, max_line_bytes=schema.dataset.max_line_bytes)
    out = Console(highlight=False, soft_wrap=True)

    def say(text: str = "") -> None:
        out.print(text, markup=False)

    say(CURATOR_ONLY)
    with tempfile.TemporaryDirectory(prefix="privflow-check-") as scratch:
        clean, report, failing = _validate(df, schema, Path(scratch) / "quarantine.csv")
    say(
        f"{source} ({fmt}) against schema '{schema.dataset.name}': {_rows(report.total_rows)} read, "
        f"{report.total_rows - report.failing_rows:,} pass{_kept(report)}, {report.failing_rows:,} fail."
    )
    if report.total_rows == 0:
        say("The table has no rows: a run would have nothing to train on.")
    findings = [_finding(f, failing, clean, schema, report) for f in report.failures]
    for item in findings:
        f = item.failure
        where = "rows" if f.column == ROWS else f"column '{f.column}'"
        say(f"- {where} [{f.check}]: {f.detail}")
        if item.values and examples and f.column == ROWS:
            say(f"    lines: {'; '.join(str(v) for v, _ in item.values[:examples])}")
        elif item.values and examples:
            shown = ", ".join(f"{_show(v)} ({n})" for v, n in item.values[:examples])
            more = len(item.values) - examples
            say(f"    values: {shown}" + (f" and {more} more distinct" if more > 0 else ""))
        if verbose and item.rows:
            rows = ", ".join(str(r) for r in item.rows[:20]) + (" ..." if len(item.rows) > 20 else "")
            say(f"    rows (0-based positions, as a quarantine file numbers them): {rows}")
        for line in item.advice:
            say(f"    -> {line}")
    for a in report.adjustments:
        say(f"- column '{a.column}' [{a.change}, kept]: {a.detail}")
    for line in curator_lines(schema, clean):  # real rows breaking a rule: counted, kept (privflow/data/rules.py)
        say(f"- {line}")
    notes = _point_masses(clean, schema) + _size_note(report, schema)
    for head, fix in notes:
        say(f"- {head}")
        say(f"    -> {fix}")
    if findings or notes:
        say(PUBLIC_SCHEMA)
    if report.failing_rows or report.total_rows == 0:
        say("Fix the rows or the schema, then run `privflow check` again.")
        return EXIT_ROWS_FAIL
    say("Every row passes the schema's checks.")
    return 0


def _validate(
    df: pl.DataFrame, schema: Schema, quarantine: Path
) -> tuple[pl.DataFrame, ValidationReport, pl.DataFrame]:
    """`validate` with a gate that never stops, under the quarantine policy: the clean typed rows,
    the exact report, and the failing rows as given (the quarantine file, read back as text)."""
    import polars as pl

    from privflow.data.validation import validate

    clean, report = validate(df, schema, "quarantine", quarantine, gate=lambda _failing, _passing: False)
    failing = pl.read_csv(quarantine, infer_schema=False) if report.failing_rows else pl.DataFrame()
    return clean, report, failing


def _finding(
    failure: Failure, failing: pl.DataFrame, clean: pl.DataFrame, schema: Schema, report: ValidationReport
) -> _Finding:
    """The rows failing `failure`'s check (from the quarantine file's list of failed checks), their
    values, and the advice for that check."""
    import polars as pl

    from privflow.data.io import UNREADABLE
    from privflow.data.validation import REASON_COLUMN, ROW_COLUMN, ROWS

    tag = f";{failure.column}:{failure.check};"
    rows = failing.filter((";" + pl.col(REASON_COLUMN) + ";").str.contains(tag, literal=True))
    positions = [int(r) for r in rows.get_column(ROW_COLUMN).to_list()] if rows.height else []
    source = UNREADABLE if failure.column == ROWS else failure.column
    raw: list[str | None] = rows.get_column(source).to_list() if rows.height and source in rows.columns else []
    if failure.column == ROWS:  # each line's reason names its line: in file order, not by frequency
        return _Finding(failure, [(v, 1) for v in raw], positions, [_UNREADABLE_ADVICE])
    stripped = [None if v is None else v.strip() for v in raw]
    counts = Counter(stripped)
    values = sorted(counts.items(), key=lambda kv: (-kv[1], "" if kv[0] is None else kv[0]))
    if failure.column not in schema.names:  # a check on no declared column: its detail says it all
        return _Finding(failure, values, positions, [])
    advice = _advice(failure, schema.column(failure.column), values, failing, clean, schema, report)
    return _Finding(failure, values, positions, advice)


_UNREADABLE_ADVICE = (
    "fix those lines in the file (a field too many or too few, broken quoting, a NUL, bytes that are not text "
    "in the file's encoding; in Parquet, a text value that is not UTF-8); a line or row longer than the cap is "
    "left unread: shorten it, or raise the schema's `dataset.max_line_bytes` if such rows are expected"
)


def _advice(
    failure: Failure,
    col: Column,
    values: list[tuple[str | None, int]],
    failing: pl.DataFrame,
    clean: pl.DataFrame,
    schema: Schema,
    report: ValidationReport,
) -> list[str]:
    check = failure.check
    nullable = "" if col.nullable else f" and `nullable: true` on '{col.name}'"
    numbers = col.type in ("numeric", "integer")
    shown = [(v, n) for v, n in values[:3] if v is not None]
    if check == "not_null":
        return [f"declare `nullable: true` on '{col.name}' if a missing value is valid there, or fill those rows"]
    if check == "category" and col.type == "categorical":
        return [_category_advice(col, v, n, report.total_rows, nullable) for v, n in shown]
    if check in ("type", "category"):  # a value that does not read as the column's type
        out = []
        for v, n in shown:
            if v.casefold() in MISSING_LIKE or (numbers and n >= 2 and not any(ch.isdigit() for ch in v)):
                out.append(f"{_marker(v, n)}: declare it in `dataset.missing_values`{nullable}")
            elif numbers:
                out.append(
                    f"'{_cut(v)}' is not a plain number (a unit, a thousands separator, a decimal comma?): "
                    "write it as one (e.g. 1234.5), or fix the row"
                )
            else:
                out.append(
                    f"'{_cut(v)}' does not read as a {col.type} value of '{col.name}': fix those rows, or the "
                    "column's declaration in the schema"
                )
        return out
    if check == "integer":
        return [f"round those values in the file, or declare '{col.name}' `type: numeric`"]
    if check == "bounds":
        public = "widen `bounds` to what the data's documentation allows (bounds are public: never the file's min/max)"
        seen = _range(col.name, failing, clean) if numbers and col.bounds else None
        if seen is None or col.bounds is None:
            return [f"fix those rows, or {public}"]
        lo, hi = col.bounds
        return [
            f"values seen span [{_num(seen[0])}, {_num(seen[1])}], the declared bounds are [{_num(lo)}, {_num(hi)}]: "
            f"fix those rows, or {public}"
        ]
    return []  # a check with no specific advice: its detail says it


def _marker(value: str, n: int) -> str:
    return f"'{_cut(value)}' ({_rows(n)}) looks like a missing-value marker"


def _category_advice(col: Column, value: str, n: int, total: int, nullable: str) -> str:
    """An unknown category: a missing-value marker, a typo of a declared one, a new category
    holding many rows, or a few stray rows."""
    cats = list(col.categories or ())
    if value.casefold() in MISSING_LIKE:
        return f"{_marker(value, n)}: declare it in `dataset.missing_values`{nullable}"
    same_case = [c for c in cats if c.casefold() == value.casefold()]
    close = same_case or difflib.get_close_matches(value, cats, n=1, cutoff=CLOSE_MATCH)
    if close:
        return f"'{_cut(value)}' ({_rows(n)}): did you mean '{close[0]}'? or add '{_cut(value)}' to categories"
    if n >= max(5, math.ceil(0.01 * total)):
        return f"'{_cut(value)}' holds {_rows(n)}: add it to '{col.name}' categories if it is a real category"
    return f"'{_cut(value)}' ({_rows(n)}): fix those rows, or add it to '{col.name}' categories"


def _range(name: str, failing: pl.DataFrame, clean: pl.DataFrame) -> tuple[float, float] | None:
    """The smallest and largest number in the column, over the passing rows and the failing rows
    whose value there is a number."""
    import polars as pl

    parts = []
    if name in clean.columns:
        parts.append(clean.get_column(name).cast(pl.Float64))
    if name in failing.columns:
        parts.append(failing.get_column(name).str.strip_chars().cast(pl.Float64, strict=False))
    if not parts:
        return None
    s = pl.concat(parts).drop_nulls()
    s = s.filter(s.is_finite())
    if s.is_empty():
        return None
    return float(s.min()), float(s.max())  # type: ignore[arg-type]


def _point_masses(clean: pl.DataFrame, schema: Schema) -> list[tuple[str, str]]:
    """Numeric or integer columns where one value holds POINT_MASS_SHARE of the passing rows but
    the public cells of the DP marginals would smear it (not a declared atom, not a one-integer cell)."""
    import numpy as np

    from privflow.data.copula import column_cells

    n = clean.height
    if n < POINT_MASS_MIN_ROWS:
        return []
    out: list[tuple[str, str]] = []
    for col in schema.columns:
        if col.type not in ("numeric", "integer") or col.name not in clean.columns:
            continue
        counts = clean.get_column(col.name).drop_nulls().value_counts(sort=True)
        cells = column_cells(col)
        masses = []
        for value, k in counts.iter_rows():
            if k < POINT_MASS_SHARE * n:
                break
            v = float(value)
            if v in col.atoms:
                continue
            if cells.kind == "integer":
                i = int(np.searchsorted(cells.starts, v, side="right")) - 1
                if 0 <= i < cells.starts.size and cells.ends[i] - cells.starts[i] == 1:
                    continue  # its own cell: kept exactly already
            masses.append((v, k))
        if not masses:
            continue
        shown = masses[:8]
        atoms = ", ".join(_num(a) for a in sorted({*col.atoms, *(v for v, _ in shown)}))
        smeared = "(else it comes out smeared over its cell of the DP marginals)"
        if len(masses) > 1:
            smeared = smeared.replace("it comes", "they come")
        if len(masses) == 1:
            v, k = masses[0]
            head = f"column '{col.name}': {_num(v)} holds {k / n:.0%} of the passing rows but is not a declared atom"
            out.append((head, f"declare `atoms: [{atoms}]` if that is a known point mass {smeared}"))
            continue
        held = ", ".join(f"{_num(v)} ({k / n:.0%})" for v, k in shown) + (" ..." if len(masses) > 8 else "")
        head = (
            f"column '{col.name}': values {held} each hold {POINT_MASS_SHARE:.0%} or more of the passing rows but "
            "are not declared atoms"
        )
        fix = f"declare `atoms: [{atoms}]` if those are known point masses {smeared}"
        s = clean.get_column(col.name).drop_nulls()
        if col.type == "numeric" and bool((s.round(0) == s).all()):
            integer = f"declare '{col.name}' `type: integer` (each value a cell of its own)"
            fix = f"every value is a whole number: {integer}, or {fix}"
        out.append((head, fix))
    return out


def _size_note(report: ValidationReport, schema: Schema) -> list[tuple[str, str]]:
    """The schema's expected_rows far from the rows read: DP-SGD's sampling rate and the gate's
    limits come from expected_rows, so a run may be stopped for too few rows."""
    expected = schema.dataset.expected_rows
    if expected is None or report.total_rows == 0 or 0.5 <= report.total_rows / expected <= 2:
        return []
    return [
        (
            f"the table has {report.total_rows:,} rows, the schema's dataset.expected_rows says about {expected:,}",
            "is --data the whole table? expected_rows (public and approximate: the data's documented size, "
            "never this count) sets a run's sampling rate and its validation gate's limits",
        )
    ]


# ----------------------------------------------------------------------------- formatting


def _kept(report: ValidationReport) -> str:
    """How many passing rows hold a value clamped to a bound / read as `other` (where the schema
    clamps / declares `other`)."""
    parts = []
    if report.clamp:
        parts.append(f"{report.rows_clamped:,} with a value clamped to a bound")
    if report.other:
        parts.append(f"{report.rows_other:,} with a category read as 'other'")
    return f" ({', '.join(parts)})" if parts else ""


def _rows(n: int) -> str:
    return f"{n:,} row{'' if n == 1 else 's'}"


def _num(x: Any) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else f"{x:g}"


def _cut(value: str) -> str:
    return value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "..."


def _show(value: str | None) -> str:
    return "(empty)" if value is None else f"'{_cut(value)}'"
