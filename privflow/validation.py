"""Validate a table against its public schema with a Great Expectations suite built from it.

Two steps. (1) polars coerces each numeric/integer column (per-column cast, strict=False) and
counts the values that do not parse ("type") or are not whole numbers ("integer"). (2) A GX 1.x
suite, built in code from the schema on an ephemeral context, checks the structure (every
declared column present, no undeclared column, values present where not nullable) on the
frame as given and the values (public bounds, declared categories) on the coerced frame.
GX's `unexpected_count` is the count of record; polars computes the same row masks to know
which rows to quarantine, and the two must agree exactly.

The report is a diagnostic for the data owner computed on private rows: it is NOT
differentially private and is never released (privacy rule 5). It holds counts only, never a
raw value; the quarantine file does hold raw rows and stays with the data owner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from privflow.errors import ConfigError, ValidationFailed
from privflow.schema import Column, Schema

NOT_DP_LABEL = (
    "NOT differentially private: diagnostic for the data owner computed on the private rows; "
    "never released with the model or the synthetic data."
)

Policy = Literal["strict", "quarantine"]
Check = Literal["missing_column", "extra_column", "type", "integer", "bounds", "category", "not_null"]
SCHEMA_LEVEL = "schema"
ROW_LEVEL = "row"

_NUMERIC_DTYPES = (
    pl.Float32, pl.Float64, pl.Int8, pl.Int16, pl.Int32, pl.Int64,
    pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64, pl.Boolean,
)  # fmt: skip


@dataclass(frozen=True)
class Failure:
    """One failed check on one column: how many rows fail it (a count, never a value)."""

    column: str
    check: Check
    failing_rows: int
    level: Literal["schema", "row"]
    detail: str

    def sentence(self) -> str:
        return f"column '{self.column}': {self.detail}"


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of `validate`: per-column failures and row counts. NOT differentially private."""

    dataset: str
    policy: Policy
    total_rows: int
    failing_rows: int
    quarantined_rows: int
    failures: tuple[Failure, ...]
    expectations: int
    quarantine_path: str | None = None
    label: str = field(default=NOT_DP_LABEL)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def schema_level(self) -> bool:
        """True when a failure concerns a whole column (always fatal, even under quarantine)."""
        return any(f.level == SCHEMA_LEVEL for f in self.failures)

    def by_column(self) -> dict[str, list[Failure]]:
        out: dict[str, list[Failure]] = {}
        for f in self.failures:
            out.setdefault(f.column, []).append(f)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "dataset": self.dataset,
            "policy": self.policy,
            "passed": self.passed,
            "total_rows": self.total_rows,
            "failing_rows": self.failing_rows,
            "quarantined_rows": self.quarantined_rows,
            "quarantine_path": self.quarantine_path,
            "expectations": self.expectations,
            "columns": {
                col: [
                    {"check": f.check, "level": f.level, "failing_rows": f.failing_rows, "detail": f.detail}
                    for f in fs
                ]
                for col, fs in self.by_column().items()
            },
        }

    def to_markdown(self) -> str:
        lines = [
            f"# Validation report: {self.dataset}",
            "",
            f"> **{self.label}**",
            "",
            f"- policy: {self.policy}",
            f"- result: {'passed' if self.passed else 'FAILED'}",
            f"- rows: {self.total_rows} total, {self.failing_rows} failing, {self.quarantined_rows} quarantined",
            f"- expectations evaluated: {self.expectations}",
        ]
        if self.quarantine_path:
            lines.append(f"- quarantine file (raw rows, keep private): `{self.quarantine_path}`")
        lines.append("")
        if self.failures:
            lines += ["| column | check | level | failing rows | detail |", "| --- | --- | --- | ---: | --- |"]
            for f in self.failures:
                lines.append(f"| {f.column} | {f.check} | {f.level} | {f.failing_rows} | {f.detail} |")
        else:
            lines.append("Every column passes every check.")
        return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- coercion


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _rows(n: int) -> str:
    return f"{n} row{'s' if n != 1 else ''}"


@dataclass
class _Coerced:
    frame: pl.DataFrame  # declared columns present in the input, numeric ones as Float64
    masks: dict[tuple[str, str], pl.Series]  # (column, check) -> boolean row mask
    schema_failures: list[Failure]


def _normalise(df: pl.DataFrame) -> pl.DataFrame:
    """Empty strings are missing values; Enum/Categorical columns are compared as strings."""
    exprs = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, (pl.Enum, pl.Categorical)):
            exprs.append(pl.col(name).cast(pl.String))
        elif dtype == pl.String:
            exprs.append(pl.when(pl.col(name) == "").then(None).otherwise(pl.col(name)).alias(name))
    return df.with_columns(exprs) if exprs else df


def _raw_missing(s: pl.Series) -> pl.Series:
    """Missing as GX (pandas) sees it: null, or NaN in a float column."""
    m = s.is_null()
    if s.dtype in (pl.Float32, pl.Float64):
        m = m | s.is_nan().fill_null(False)
    return m


def _coerce(raw: pl.DataFrame, schema: Schema) -> _Coerced:
    """Cast declared columns to their schema type in polars, counting what does not parse."""
    out: dict[str, pl.Series] = {}
    masks: dict[tuple[str, str], pl.Series] = {}
    schema_failures: list[Failure] = []
    for col in schema.columns:
        if col.name not in raw.columns:
            continue
        s = raw.get_column(col.name)
        if col.is_categorical:
            try:
                out[col.name] = s.cast(pl.String)
            except Exception:
                schema_failures.append(
                    Failure(col.name, "type", raw.height, SCHEMA_LEVEL,
                            f"holds {s.dtype} values, which cannot be read as category labels")  # fmt: skip
                )
                out[col.name] = pl.Series(col.name, [None] * raw.height, dtype=pl.String)
            continue
        if s.dtype == pl.String:
            parsed = s.str.strip_chars().cast(pl.Float64, strict=False)
            # a value that is present but is not a finite-or-infinite number ("abc", "nan")
            bad = s.is_not_null() & (parsed.is_null() | parsed.is_nan().fill_null(False))
            parsed = pl.select(pl.when(bad).then(None).otherwise(parsed)).to_series()
        elif s.dtype in _NUMERIC_DTYPES or s.dtype == pl.Null:
            parsed = s.cast(pl.Float64)
            parsed = pl.select(pl.when(parsed.is_nan()).then(None).otherwise(parsed)).to_series()
            bad = pl.Series([False] * raw.height)
        else:
            schema_failures.append(
                Failure(col.name, "type", raw.height, SCHEMA_LEVEL,
                        f"holds {s.dtype} values where {col.type} numbers are declared")  # fmt: skip
            )
            out[col.name] = pl.Series(col.name, [None] * raw.height, dtype=pl.Float64)
            continue
        parsed = parsed.alias(col.name)
        n_bad = int(bad.sum())
        n_present = int(s.is_not_null().sum())
        if n_bad and n_bad == n_present:
            schema_failures.append(
                Failure(col.name, "type", n_bad, SCHEMA_LEVEL,
                        f"no value parses as a number ({_rows(n_bad)}): the whole column has the wrong type")  # fmt: skip
            )
        elif n_bad:
            masks[(col.name, "type")] = bad
        if col.type == "integer":
            finite = parsed.is_not_null() & parsed.is_finite().fill_null(False)
            frac = finite & (parsed != parsed.round(0)).fill_null(False)
            if int(frac.sum()):
                masks[(col.name, "integer")] = frac
        out[col.name] = parsed
    return _Coerced(pl.DataFrame(out, schema={k: v.dtype for k, v in out.items()}), masks, schema_failures)


# ----------------------------------------------------------------------------- GX suite


def _gx_quiet() -> None:
    """No usage statistics, no progress bars (must be set before GX is imported)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("GE_USAGE_STATS", "FALSE")


def _run_gx(
    raw: pl.DataFrame, coerced: pl.DataFrame, schema: Schema
) -> tuple[list[tuple[str, str, int]], list[str], list[str], int]:
    """Build the suites from the schema and run them; return (column, check, unexpected_count).

    Structure suite on the frame as given (presence, no undeclared columns, not-null);
    value suite on the coerced frame (bounds, categories). Also returns the missing and
    extra column lists and the number of expectations evaluated.
    """
    _gx_quiet()
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas("privflow").add_dataframe_asset("table")
    batch = asset.add_batch_definition_whole_dataframe("whole")

    tag: dict[str, tuple[str, str]] = {}

    def add(suite: Any, exp: Any, column: str, check: str) -> None:
        exp = suite.add_expectation(exp)
        tag[str(exp.id)] = (column, check)

    structure = ctx.suites.add(gx.ExpectationSuite(name=f"{schema.dataset.name}-structure"))
    add(structure, gxe.ExpectTableColumnsToMatchSet(column_set=schema.names, exact_match=True), "*", "columns")
    for col in schema.columns:
        add(structure, gxe.ExpectColumnToExist(column=col.name), col.name, "missing_column")
        if not col.nullable and col.name in raw.columns:
            add(structure, gxe.ExpectColumnValuesToNotBeNull(column=col.name), col.name, "not_null")

    values = ctx.suites.add(gx.ExpectationSuite(name=f"{schema.dataset.name}-values"))
    for col in schema.columns:
        if col.name not in coerced.columns:
            continue
        if col.is_categorical:
            add(values, gxe.ExpectColumnValuesToBeInSet(column=col.name, value_set=list(col.categories or ())),
                col.name, "category")  # fmt: skip
        else:
            lo, hi = col.bounds  # type: ignore[misc]
            add(values, gxe.ExpectColumnValuesToBeBetween(column=col.name, min_value=lo, max_value=hi),
                col.name, "bounds")  # fmt: skip

    # counts only: no partial list of unexpected values is kept
    fmt = {"result_format": "BASIC", "partial_unexpected_count": 0}
    counts: list[tuple[str, str, int]] = []
    missing: list[str] = []
    extra: list[str] = []
    n_exp = 0
    for suite, frame in ((structure, raw), (values, coerced)):
        if not suite.expectations:
            continue
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=f"{suite.name}-run", data=batch, suite=suite))
        result = vd.run(batch_parameters={"dataframe": frame.to_pandas()}, result_format=fmt)
        for r in result.results:
            n_exp += 1
            column, check = tag[str(r.expectation_config.id)]
            exc = r.exception_info or {}
            if isinstance(exc, dict) and exc.get("raised_exception"):
                raise RuntimeError(f"Great Expectations failed to evaluate {check} on '{column}': "
                                   f"{exc.get('exception_message')}")  # fmt: skip
            if check == "columns":
                mism = (r.result.get("details") or {}).get("mismatched") or {}
                extra = sorted(str(c) for c in mism.get("unexpected") or [])
            elif check == "missing_column":
                if not r.success:
                    missing.append(column)
            else:
                counts.append((column, check, int(r.result.get("unexpected_count") or 0)))
    return counts, missing, extra, n_exp


# ----------------------------------------------------------------------------- validate


def _value_masks(coerced: pl.DataFrame, raw: pl.DataFrame, schema: Schema) -> dict[tuple[str, str], pl.Series]:
    """The polars twin of each GX row-level expectation (to find the rows to quarantine)."""
    masks: dict[tuple[str, str], pl.Series] = {}
    for col in schema.columns:
        if col.name not in coerced.columns:
            continue
        s = coerced.get_column(col.name)
        if not col.nullable:
            masks[(col.name, "not_null")] = _raw_missing(raw.get_column(col.name))
        if col.is_categorical:
            masks[(col.name, "category")] = s.is_not_null() & ~s.is_in(list(col.categories or ())).fill_null(False)
        else:
            lo, hi = col.bounds  # type: ignore[misc]
            masks[(col.name, "bounds")] = s.is_not_null() & ((s < lo) | (s > hi)).fill_null(False)
    return masks


def _detail(col: Column, check: str, n: int) -> str:
    if check == "type":
        return f"{_rows(n)} with a value that is not a number"
    if check == "integer":
        return f"{_rows(n)} with a number that is not a whole number"
    if check == "bounds":
        lo, hi = col.bounds  # type: ignore[misc]
        return f"{_rows(n)} outside the public bounds [{_fmt(lo)}, {_fmt(hi)}]"
    if check == "category":
        return f"{_rows(n)} with a category not in the declared list of {len(col.categories or ())}"
    if check == "not_null":
        return f"{_rows(n)} missing a value, but the column is not nullable"
    raise ValueError(check)


_CHECK_ORDER = {"missing_column": 0, "extra_column": 1, "type": 2, "integer": 3, "not_null": 4, "bounds": 5, "category": 6}


def _message(report: ValidationReport, fatal_reason: str) -> str:
    parts = "; ".join(f.sentence() for f in report.failures)
    return (
        f"Validation of dataset '{report.dataset}' against its schema failed ({fatal_reason}): "
        f"{report.failing_rows} of {report.total_rows} rows fail. {parts}. "
        "Counts only are shown; this diagnostic is not differentially private and stays with the data owner. "
        + (
            "Missing, undeclared or wrongly typed columns cannot be quarantined: fix the file or the schema."
            if report.schema_level
            else "Fix those rows, or use the quarantine policy to set them aside and train on the rest."
        )
    )


def _typed(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    exprs = []
    for col in schema.columns:
        if col.is_categorical:
            exprs.append(pl.col(col.name).cast(pl.Enum(list(col.categories or ()))))
        elif col.type == "integer":
            exprs.append(pl.col(col.name).round(0).cast(pl.Int64))
        else:
            exprs.append(pl.col(col.name).cast(pl.Float64))
    return frame.select(exprs)


def validate(
    df: pl.DataFrame,
    schema: Schema,
    policy: Policy = "strict",
    quarantine_path: Path | None = None,
) -> tuple[pl.DataFrame, ValidationReport]:
    """Check `df` against `schema`; return the clean typed frame (schema order) and the report.

    Typed: numeric -> Float64, integer -> Int64, categorical -> Enum of the declared list.
    strict: any failure raises ValidationFailed. quarantine: rows failing a row-level check are
    written to `quarantine_path` (CSV, raw values plus `_row` and `_failed_checks`) and left
    out of the returned frame; schema-level failures (missing/extra column, a whole column of
    the wrong type) always raise. The raised error carries the report as `.report`.
    """
    if policy not in ("strict", "quarantine"):
        raise ConfigError(f"Validation policy must be 'strict' or 'quarantine', got '{policy}'.")
    if policy == "quarantine" and quarantine_path is None:
        raise ConfigError("The quarantine policy needs a quarantine_path for the rows it sets aside.")
    if df.height == 0:
        raise ValidationFailed(f"Dataset '{schema.dataset.name}': the table has no rows, so there is nothing to validate or train on.")

    raw = _normalise(df)
    n = raw.height
    co = _coerce(raw, schema)
    counts, missing, extra, n_exp = _run_gx(raw, co.frame, schema)

    # cross-check GX's structure result with plain set arithmetic
    declared = set(schema.names)
    if sorted(missing) != sorted(declared - set(raw.columns)) or extra != sorted(set(raw.columns) - declared):
        raise RuntimeError("internal: Great Expectations and polars disagree about the table's columns")

    masks = dict(co.masks)
    twin = _value_masks(co.frame, raw, schema)
    for column, check, gx_count in counts:
        mask = twin[(column, check)]
        if int(mask.sum()) != gx_count:
            raise RuntimeError(
                f"internal: GX counts {gx_count} rows failing {check} on '{column}' but polars counts {int(mask.sum())}"
            )
        if gx_count:
            masks[(column, check)] = mask

    failures: list[Failure] = [
        Failure(c, "missing_column", n, SCHEMA_LEVEL, "is declared in the schema but missing from the table") for c in missing
    ]
    failures += [Failure(c, "extra_column", n, SCHEMA_LEVEL, "is in the table but not declared in the schema") for c in extra]
    failures += co.schema_failures
    order = {c: i for i, c in enumerate(schema.names)}
    for (column, check), mask in masks.items():
        failures.append(Failure(column, check, int(mask.sum()), ROW_LEVEL, _detail(schema.column(column), check, int(mask.sum()))))  # type: ignore[arg-type]
    failures.sort(key=lambda f: (order.get(f.column, len(order)), _CHECK_ORDER[f.check]))

    row_fail = pl.Series([False] * n)
    for mask in masks.values():
        row_fail = row_fail | mask
    schema_level = any(f.level == SCHEMA_LEVEL for f in failures)
    failing = n if schema_level else int(row_fail.sum())

    def report(quarantined: int, qpath: str | None) -> ValidationReport:
        return ValidationReport(
            dataset=schema.dataset.name, policy=policy, total_rows=n, failing_rows=failing,
            quarantined_rows=quarantined, failures=tuple(failures), expectations=n_exp, quarantine_path=qpath,
        )  # fmt: skip

    if schema_level or (failures and policy == "strict"):
        rep = report(0, None)
        err = ValidationFailed(_message(rep, "schema-level problem" if schema_level else "strict policy"))
        err.report = rep  # type: ignore[attr-defined]
        raise err

    qpath: str | None = None
    if policy == "quarantine":
        assert quarantine_path is not None
        reasons = pl.Series([""] * n)
        for (column, check), mask in sorted(masks.items(), key=lambda kv: (order[kv[0][0]], _CHECK_ORDER[kv[0][1]])):
            tag = f"{column}:{check}"
            reasons = pl.select(
                pl.when(mask).then(pl.when(reasons == "").then(pl.lit(tag)).otherwise(reasons + ";" + tag)).otherwise(reasons)
            ).to_series()
        bad_rows = (
            df.with_columns(pl.col(c).cast(pl.String) for c, t in df.schema.items() if isinstance(t, (pl.Enum, pl.Categorical)))
            .with_columns(pl.Series("_row", range(n), dtype=pl.Int64), reasons.alias("_failed_checks"))
            .filter(row_fail)
        )
        qp = Path(quarantine_path)
        qp.parent.mkdir(parents=True, exist_ok=True)
        bad_rows.write_csv(qp)
        qpath = str(qp)

    clean = co.frame.filter(~row_fail)
    if clean.height == 0:
        rep = report(failing, qpath)
        err = ValidationFailed(_message(rep, "no row passes; nothing is left to train on"))
        err.report = rep  # type: ignore[attr-defined]
        raise err
    return _typed(clean, schema), report(failing if policy == "quarantine" else 0, qpath)
