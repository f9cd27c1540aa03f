"""Validating a table, whole or in chunks: the steps in order, the gate's decision, the result.

`validate` prepares the table (privflow/data/validation/coerce.py), runs the schema's Great
Expectations suites (expectations.py), checks GX's counts against the polars masks that say
which rows fail and which values change (changes.py), asks the DP gate or the policy whether to
stop, writes the quarantine file (quarantine.py) and returns the clean typed rows with the
report (report.py). `validate_chunks` does the same for a table read in chunks, `merged_report`
sums their reports, and `typed_rows` is the polars-only twin of `validate`'s rows.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypedDict

import polars as pl

from privflow.core.errors import ConfigError, ValidationFailed
from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.data.validation.changes import adjustment, apply_changes, clamping, row_changes, value_masks
from privflow.data.validation.coerce import Coerced, prepared, typed
from privflow.data.validation.expectations import GxOutcome, run_gx
from privflow.data.validation.quarantine import write_quarantine
from privflow.data.validation.report import (
    CHANGE_ORDER,
    CHECK_ORDER,
    NOTHING_PASSES_ADVICE,
    QUARANTINE_ADVICE,
    ROW_LEVEL,
    ROWS,
    SCHEMA_LEVEL,
    Failure,
    Policy,
    RowCells,
    ValidationReport,
    failed,
    failure_detail,
    gate_stopped,
)

Gate = Callable[..., bool]  # gate(failing, passing) -> stop; given `cells=RowCells` where it takes that keyword

Masks = dict[tuple[str, str], pl.Series]  # (column, check or change) -> boolean row mask


def _takes_cells(gate: Gate) -> bool:
    try:
        params = inspect.signature(gate).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "cells" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def ask_gate(gate: Gate, cells: RowCells) -> bool:
    """The gate's decision on `cells`: `gate(failing, passing, cells=cells)` where the callback
    takes a `cells` keyword (or **kwargs), else `gate(failing, passing)` as before."""
    if _takes_cells(gate):
        return bool(gate(cells.failing, cells.passing, cells=cells))
    return bool(gate(cells.failing, cells.passing))


class _Flags(TypedDict):
    """A report's public flags, as `ValidationReport` takes them by keyword."""

    clamp: bool
    other: bool


def _flags(schema: Schema) -> _Flags:
    """A report's public flags: whether the schema clamps some column, declares some `other`."""
    return {"clamp": bool(clamping(schema)), "other": any(c.other is not None for c in schema.columns)}


def _any_row(masks: Masks, n: int) -> pl.Series:
    """The rows that fail at least one of `masks`."""
    row_fail = pl.Series([False] * n, dtype=pl.Boolean)
    for mask in masks.values():
        row_fail = row_fail | mask
    return row_fail


def typed_rows(df: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """The rows of `df` that pass every row-level check, typed and with values clamped or sent to
    `other`, as `validate` returns them, computed with polars alone: `validate` checks this polars
    twin against Great Expectations on every call, and reading a table back (its rows' keyed
    digests, privacy/fingerprint.py) need not import GX and pandas for it. A table missing a
    declared column or holding an undeclared one has no passing row here."""
    unreadable, raw, co = prepared(df, schema)
    model = lower(schema)
    if set(schema.names) != set(raw.columns) or co.schema_failures:
        return pl.DataFrame()
    masks = dict(co.masks)
    changes: Masks = {}
    for key, mask in value_masks(co.frame, raw, model, clamping(schema)).items():
        if mask.any():
            (changes if key[1] in CHANGE_ORDER else masks)[key] = mask
    row_fail = _any_row(masks, raw.height)
    if unreadable is not None:
        row_fail = row_fail | unreadable
    return typed(apply_changes(co.frame, model, changes).filter(~row_fail), model)


# ----------------------------------------------------------------------------- validate's steps


def _check_arguments(
    df: pl.DataFrame, schema: Schema, policy: Policy, quarantine_path: Path | None, gate: Gate | None
) -> None:
    if policy not in ("strict", "quarantine"):
        raise ConfigError(f"Validation policy must be 'strict' or 'quarantine', got '{policy}'.")
    if policy == "quarantine" and quarantine_path is None:
        raise ConfigError("The quarantine policy needs a quarantine_path for the rows it sets aside.")
    if df.height == 0 and gate is None:
        raise ValidationFailed(
            f"Dataset '{schema.dataset.name}': the table has no rows, so there is nothing to validate or train on."
        )


def _reconciled(
    gx_out: GxOutcome, raw: pl.DataFrame, co: Coerced, schema: Schema, unreadable: pl.Series | None
) -> tuple[Masks, Masks]:
    """(the failing checks' row masks, the changed values' row masks), each checked against GX's
    count of record. A line the reader could not read fails as a row, once, under `ROWS`, and
    no column's count includes it."""
    declared, present = set(schema.names), set(raw.columns)
    if sorted(gx_out.missing) != sorted(declared - present) or gx_out.extra != sorted(present - declared):
        raise RuntimeError("internal: Great Expectations and polars disagree about the table's columns")
    masks = dict(co.masks)
    changes: Masks = {}  # (column, "clamped" | "other") -> rows whose value changes
    twins = value_masks(co.frame, raw, lower(schema), clamping(schema))
    for column, check, gx_count in gx_out.counts:
        mask = twins[(column, check)]
        if int(mask.sum()) != gx_count:
            raise RuntimeError(
                f"internal: GX counts {gx_count} rows failing {check} on '{column}', polars {int(mask.sum())}"
            )
        if gx_count:
            (changes if check in CHANGE_ORDER else masks)[(column, check)] = mask
    if unreadable is not None and unreadable.any():
        masks = {key: mask & ~unreadable for key, mask in masks.items()}
        masks = {key: mask for key, mask in masks.items() if mask.any()}
        masks[(ROWS, "unreadable")] = unreadable
        changes = {key: mask & ~unreadable for key, mask in changes.items()}
        changes = {key: mask for key, mask in changes.items() if mask.any()}
    return masks, changes


def _failures(schema: Schema, n: int, gx_out: GxOutcome, co: Coerced, masks: Masks) -> list[Failure]:
    """The report's failures, the schema-level ones first, in schema order (`ROWS` first)."""
    failures = [
        Failure(c, "missing_column", n, SCHEMA_LEVEL, "is declared in the schema but missing from the table")
        for c in gx_out.missing
    ]
    failures += [
        Failure(c, "extra_column", n, SCHEMA_LEVEL, "is in the table but not declared in the schema")
        for c in gx_out.extra
    ]
    failures += co.schema_failures
    for (column, check), mask in masks.items():
        k = int(mask.sum())
        detail = failure_detail(None if column == ROWS else schema.column(column), check, k)
        failures.append(Failure(column, check, k, ROW_LEVEL, detail))  # type: ignore[arg-type]
    order = _order(schema)
    failures.sort(key=lambda f: (order.get(f.column, len(order)), CHECK_ORDER[f.check]))
    return failures


def _order(schema: Schema) -> dict[str, int]:
    """A column's place in a report and a quarantine file's reasons: `ROWS` first, then schema order."""
    return {ROWS: -1, **{c: i for i, c in enumerate(schema.names)}}


def _exact_report(
    schema: Schema, policy: Policy, gx_out: GxOutcome, co: Coerced, masks: Masks, changes: Masks, row_fail: pl.Series
) -> ValidationReport:
    """The report before any row is set aside (exact counts; curator-only)."""
    n = row_fail.len()
    failures = _failures(schema, n, gx_out, co, masks)
    order = _order(schema)
    adjustments = sorted(
        (adjustment(schema.column(c), k, int(m.sum())) for (c, k), m in changes.items()),
        key=lambda a: (order.get(a.column, len(order)), CHANGE_ORDER[a.change]),
    )
    schema_level = any(f.level == SCHEMA_LEVEL for f in failures)
    rows_clamped, rows_other, rows_both = (0, 0, 0) if schema_level else row_changes(changes, row_fail)
    return ValidationReport(
        dataset=schema.dataset.name,
        policy=policy,
        total_rows=n,
        failing_rows=n if schema_level else int(row_fail.sum()),
        quarantined_rows=0,
        failures=tuple(failures),
        expectations=gx_out.expectations,
        quarantine_path=None,
        adjustments=tuple(adjustments),
        rows_clamped=rows_clamped,
        rows_other=rows_other,
        rows_both=rows_both,
        **_flags(schema),
    )


def _decide(report: ValidationReport, gate: Gate | None, advice: str) -> None:
    """Raise where the table stops: a schema-level failure always; else the gate's DP decision
    where there is a gate, the strict policy's on any failure where there is none."""
    if report.schema_level:
        raise failed(report, "schema-level problem")
    if gate is not None:
        if ask_gate(gate, report.cells):
            raise gate_stopped(report)
    elif report.failures and report.policy == "strict":
        raise failed(report, "strict policy", advice)


# ----------------------------------------------------------------------------- validate


def validate(
    df: pl.DataFrame,
    schema: Schema,
    policy: Policy = "strict",
    quarantine_path: Path | None = None,
    gate: Gate | None = None,
    *,
    row_offset: int = 0,
    append: bool = False,
    advice: str = QUARANTINE_ADVICE,
) -> tuple[pl.DataFrame, ValidationReport]:
    """Check `df` against `schema`; return the clean typed frame (schema order) and the report.

    With `gate` (the pipeline's DP validation gate, privacy/mechanisms/validation_gate.py),
    the decision to stop is not taken on exact counts: `gate(failing_rows, passing_rows)`
    (with `cells=RowCells(...)`, the rows' partition, where the callback takes that keyword:
    `ask_gate`) releases DP counts and returns whether to stop; a table with no row at all goes
    to the gate too. Values past a clamping column's bounds are clamped and values not in a
    categorical's list sent to its `other` (privflow/data/validation/changes.py): they do not
    fail their row.
    Each row fails or passes on its own values (the header's structure is checked before, in
    the pre-flight); a line the reader could not read (`privflow.data.io.UNREADABLE`)
    is a failing row. If the gate says go, failing rows are dropped (strict) or set aside
    (quarantine) and the rest is returned, possibly empty: later mechanisms are DP on any
    number of rows. If it says stop, ValidationFailed carries only the report, whose exact
    counts are for the curator; the caller words the message from the DP counts.

    Typed: numeric -> Float64, integer -> Int64, categorical -> Enum of the declared list, in the
    columns of the modelled schema (`lowering.lower`): a date or datetime as Int64 units, a boolean
    as the Enum of its labels, and no ignored column.
    strict: any failure raises ValidationFailed. quarantine: rows failing a row-level check are
    written to `quarantine_path` (CSV of the raw rows plus `_privflow_row`, their 0-based
    position, and `_privflow_failed_checks`; rewritten on every call, header only when no row
    fails; `row_offset` is added to the position and `append` adds to the file: how
    `validate_chunks` writes one file for a table read in chunks) and left out of the returned
    frame. Schema-level failures (missing or undeclared column, a whole column of the wrong
    type) and a quarantine that leaves no row always raise.
    A raised ValidationFailed carries the report as `.report`; its message ends with `advice`
    for failing rows (`SCORED_ADVICE` where every row must be answered: score, the API).
    """
    _check_arguments(df, schema, policy, quarantine_path, gate)
    unreadable, raw, co = prepared(df, schema)
    gx_out = run_gx(raw, co.frame, schema)
    masks, changes = _reconciled(gx_out, raw, co, schema, unreadable)
    row_fail = _any_row(masks, raw.height)
    report = _exact_report(schema, policy, gx_out, co, masks, changes, row_fail)
    _decide(report, gate, advice)
    if policy == "quarantine":
        assert quarantine_path is not None
        # as read: the quarantine file keeps the reader's reason for a line it could not read
        write_quarantine(df, masks, row_fail, _order(schema), Path(quarantine_path), row_offset, append)
        report = dataclasses.replace(report, quarantined_rows=report.failing_rows, quarantine_path=str(quarantine_path))
    model = lower(schema)
    clean = apply_changes(co.frame, model, changes).filter(~row_fail)
    if clean.height == 0 and gate is None:
        reason = "no row passes, nothing is left to train on"
        raise failed(report, reason, NOTHING_PASSES_ADVICE if policy == "quarantine" else advice)
    return typed(clean, model), report


def validate_chunks(
    chunks: Iterable[pl.DataFrame],
    schema: Schema,
    policy: Policy,
    quarantine_path: Path | None,
    gate: Gate,
    consume: Callable[[pl.DataFrame], None],
) -> ValidationReport:
    """`validate` for a table read in chunks (a streamed run, privflow/data/chunked.py): each chunk is
    checked as `validate` checks a table and its clean typed rows go to `consume` as they come;
    failing rows are dropped or written to the one quarantine file with their position in the
    whole table. The gate then decides once, on the total number of failing rows (and the
    summed cells of `RowCells`, `ask_gate`), as it does for a table read whole; if it says
    stop, ValidationFailed carries the merged report (and whatever `consume` built must be
    discarded: nothing was released).
    """
    if policy == "quarantine" and quarantine_path is None:
        raise ConfigError("The quarantine policy needs a quarantine_path for the rows it sets aside.")
    reports: list[ValidationReport] = []
    for chunk in chunks:
        if chunk.height == 0:
            continue
        offset = sum(r.total_rows for r in reports)
        clean, rep = validate(
            chunk, schema, policy, quarantine_path, lambda _f, _p: False, row_offset=offset, append=bool(reports)
        )
        reports.append(rep)
        consume(clean)
    if not reports:  # no row at all: the gate decides, as for any other count
        where = str(quarantine_path) if quarantine_path else None
        reports.append(ValidationReport(schema.dataset.name, policy, 0, 0, 0, (), 0, where, **_flags(schema)))
    report = merged_report(reports, schema)
    if ask_gate(gate, report.cells):
        raise gate_stopped(report)
    return report


def merged_report(reports: Sequence[ValidationReport], schema: Schema) -> ValidationReport:
    """One report for a table checked in chunks: rows and failing rows summed, each column's
    check (and each column's changed values) once with its rows summed, the passing rows with a
    changed value summed (so the same report as for the table read whole)."""
    counts: dict[tuple[str, str, str], int] = {}
    changed: dict[tuple[str, str], int] = {}
    for rep in reports:
        for f in rep.failures:
            key = (f.column, f.check, f.level)
            counts[key] = counts.get(key, 0) + f.failing_rows
        for a in rep.adjustments:
            changed[(a.column, a.change)] = changed.get((a.column, a.change), 0) + a.values
    order = {c: i for i, c in enumerate(schema.names)}
    adjustments = sorted(
        (adjustment(schema.column(c), k, n) for (c, k), n in changed.items()),
        key=lambda a: (order.get(a.column, -1), CHANGE_ORDER[a.change]),
    )
    failures = sorted(
        (
            Failure(c, k, n, lv, failure_detail(None if c == ROWS else schema.column(c), k, n))  # type: ignore[arg-type]
            for (c, k, lv), n in counts.items()
        ),
        key=lambda f: (order.get(f.column, -1), CHECK_ORDER[f.check]),
    )
    first = reports[0]
    return ValidationReport(
        dataset=first.dataset,
        policy=first.policy,
        total_rows=sum(r.total_rows for r in reports),
        failing_rows=sum(r.failing_rows for r in reports),
        quarantined_rows=sum(r.quarantined_rows for r in reports),
        failures=tuple(failures),
        expectations=first.expectations,
        quarantine_path=first.quarantine_path,
        adjustments=tuple(adjustments),
        rows_clamped=sum(r.rows_clamped for r in reports),
        rows_other=sum(r.rows_other for r in reports),
        rows_both=sum(r.rows_both for r in reports),
        clamp=first.clamp,
        other=first.other,
    )
