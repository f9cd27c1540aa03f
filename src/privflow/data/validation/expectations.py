"""The Great Expectations adapter: a GX 1.x suite built in code from the public schema, run on
an ephemeral context.

Two suites: the structure suite checks the frame as given (every declared column present, no
undeclared column, values present where not nullable), the value suite the coerced frame
(public bounds, declared categories; "clamped" / "other" where the schema changes such a value
instead of failing its row: privflow/data/validation/changes.py). GX's `unexpected_count` is the
count of record; polars computes the same row masks (`changes.value_masks`) to know which rows
to quarantine, and the two must agree exactly. GX validates a pandas copy, in chunks of
`GX_CHUNK_ROWS` rows, and results are kept at counts (no unexpected values).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import polars as pl

from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.data.validation.changes import clamping


def _gx_quiet() -> None:
    """No usage statistics (read when GX is imported); progress bars are switched off per context."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("GE_USAGE_STATS", "FALSE")


def import_gx() -> None:
    """Import Great Expectations (about a second here) with its usage statistics off, without
    building a context: the CLI does it while Prefect's temporary server starts."""
    _gx_quiet()
    import great_expectations  # noqa: F401
    import great_expectations.expectations  # noqa: F401


def _gx_exception(info: Any) -> str | None:
    """GX reports an evaluation error either flat or keyed by metric; find any raised one."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for v in info.values():
        if isinstance(v, dict) and v.get("raised_exception"):
            return str(v.get("exception_message"))
    return None


@dataclass
class GxOutcome:
    counts: list[tuple[str, str, int]]  # (column, check, unexpected_count) per row-level expectation
    missing: list[str]
    extra: list[str]
    expectations: int


GX_CHUNK_ROWS = 250_000  # rows per Great Expectations batch (its pandas copy), whatever the table's size


_GX_SETUPS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[Any, Any, Any]] = {}


def _gx_setup(schema: Schema, raw_columns: list[str], coerced_columns: list[str]) -> tuple[Any, Any, Any]:
    """(batch definition, structure suite, value suite) for a schema and the frames' columns,
    built once per process: a table read in chunks validates every chunk with them, and a new
    GX context per call keeps its memory for good, so the process grows with every chunk."""
    key = (schema.model_dump_json(), tuple(raw_columns), tuple(coerced_columns))
    if key not in _GX_SETUPS:
        _GX_SETUPS[key] = _build_gx(schema, raw_columns, coerced_columns, f"privflow-{len(_GX_SETUPS)}")
    return _GX_SETUPS[key]


def _build_gx(schema: Schema, raw_columns: list[str], coerced_columns: list[str], name: str) -> tuple[Any, Any, Any]:
    """Structure suite on the frame as given (columns match the declared set exactly, each
    declared column exists, not-null where not nullable); value suite on the coerced frame
    (public bounds, declared categories)."""
    _gx_quiet()
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas(name).add_dataframe_asset("table")
    batch_def = asset.add_batch_definition_whole_dataframe("whole")

    def tagged(exp_cls: Any, name: str, check: str, **kwargs: Any) -> Any:
        return exp_cls(meta={"privflow": {"column": name, "check": check}}, **kwargs)

    structure = gx.ExpectationSuite(name=f"{schema.dataset.name}-structure")
    structure.add_expectation(
        tagged(gxe.ExpectTableColumnsToMatchSet, "*", "columns", column_set=schema.names, exact_match=True)
    )
    for col in schema.columns:
        structure.add_expectation(tagged(gxe.ExpectColumnToExist, col.name, "missing_column", column=col.name))
        if not col.nullable and col.type != "ignore" and col.name in raw_columns:
            structure.add_expectation(tagged(gxe.ExpectColumnValuesToNotBeNull, col.name, "not_null", column=col.name))

    values = gx.ExpectationSuite(name=f"{schema.dataset.name}-values")
    clamp = clamping(schema)
    for col in lower(schema).columns:  # on the coerced frame: date bounds as days, booleans as labels
        if col.name not in coerced_columns:
            continue
        if col.is_categorical:  # the values not in the list: failing, or counted and sent to `other`
            exp = tagged(gxe.ExpectColumnValuesToBeInSet, col.name, "other" if col.other is not None else "category",
                         column=col.name, value_set=list(col.categories or ()))  # fmt: skip
        else:  # the values past the bounds: failing, or counted and clamped
            lo, hi = col.bounds  # type: ignore[misc]
            exp = tagged(gxe.ExpectColumnValuesToBeBetween, col.name, "clamped" if col.name in clamp else "bounds",
                         column=col.name, min_value=lo, max_value=hi)  # fmt: skip
        values.add_expectation(exp)
    return batch_def, structure, values


_WIDE_INTEGERS = (pl.Int128, pl.UInt128)  # no pandas / Arrow conversion


def _pandas_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with the numeric storages pandas cannot take (128-bit integers) as floats: the
    structure suite looks at columns and nulls only, and the value suite gets coerced floats."""
    wide = [c for c, t in frame.schema.items() if t in _WIDE_INTEGERS]
    return frame.with_columns(pl.col(wide).cast(pl.Float64)) if wide else frame


def run_gx(raw: pl.DataFrame, coerced: pl.DataFrame, schema: Schema) -> GxOutcome:
    """Run the schema's two suites (`_gx_setup`) on whole-dataframe batches of `raw` and
    `coerced`. Results are kept at counts (no unexpected values)."""
    batch_def, structure, values = _gx_setup(schema, raw.columns, coerced.columns)
    fmt = {"result_format": "BASIC", "partial_unexpected_count": 0}
    outcome = GxOutcome([], [], [], 0)
    counts: dict[tuple[str, str], int] = {}
    for suite, frame in ((structure, raw), (values, coerced)):
        if not suite.expectations:
            continue
        # GX validates a pandas copy: chunks of rows keep that copy bounded on large tables (the
        # row-level counts add up; the table-level checks see the same columns in every chunk)
        for k, start in enumerate(range(0, max(frame.height, 1), GX_CHUNK_ROWS)):
            chunk = _pandas_ready(frame.slice(start, GX_CHUNK_ROWS)).to_pandas()
            for r in (
                batch_def.get_batch(batch_parameters={"dataframe": chunk}).validate(suite, result_format=fmt).results
            ):
                tag = r.expectation_config.meta["privflow"]
                column, check = tag["column"], tag["check"]
                problem = _gx_exception(r.exception_info)
                if problem:
                    raise RuntimeError(f"internal: GX could not evaluate {check} on '{column}': {problem}")
                if k == 0:
                    outcome.expectations += 1
                if check == "columns":
                    mismatched = (r.result.get("details") or {}).get("mismatched") or {}
                    outcome.extra = sorted(str(c) for c in mismatched.get("unexpected") or [])
                elif check == "missing_column":
                    if not r.success and k == 0:
                        outcome.missing.append(column)
                else:
                    counts[(column, check)] = counts.get((column, check), 0) + int(
                        r.result.get("unexpected_count") or 0
                    )
    outcome.counts = [(column, check, n) for (column, check), n in counts.items()]
    return outcome
