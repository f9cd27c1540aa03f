"""SDMetrics' quality score of a synthetic table (SDV's QualityReport: column shapes and
column-pair trends), the figure most synthetic-data papers and tools report beside their own.

- Column shapes: per column, KSComplement (numerical) or TVComplement (categorical) =
  1 - the KS statistic / total-variation distance of real vs synthetic; averaged.
- Column-pair trends: per pair, 1 - |Pearson(real) - Pearson(synthetic)| / 2 (two
  numerical columns) or 1 - TVD of the two contingency tables (otherwise; SDMetrics bins
  the numerical side itself); averaged.
- Overall: the mean of the two.

The metadata is built from the PUBLIC schema only (names and types; `sdtype` numerical for
integer/numeric columns, categorical otherwise), never inferred from a table, so the score
compares the two tables on the schema's terms. A diagnostic on real rows: NOT differentially
private, so for the curator only, never released. `sdmetrics` is an optional dependency (the `bench`/`dev`
extras); it is imported when a score is asked for.
"""

from __future__ import annotations

import warnings
from typing import Any

import polars as pl

from privflow.data.features import check_columns
from privflow.data.schema import Schema

TABLE = "table"  # the one table's name in SDMetrics' (multi-table shaped) metadata
QUALITY_KEYS: tuple[str, ...] = ("quality_score", "quality_column_shapes", "quality_column_pair_trends")


def sdmetrics_metadata(schema: Schema) -> dict[str, Any]:
    """SDMetrics single-table metadata from the public schema (no column type is guessed from rows)."""
    columns: dict[str, dict[str, str]] = {}
    for col in schema.columns:
        if col.is_categorical:
            columns[col.name] = {"sdtype": "categorical"}
        else:
            rep = "Int64" if col.type == "integer" else "Float"
            columns[col.name] = {"sdtype": "numerical", "computer_representation": rep}
    return {"tables": {TABLE: {"columns": columns}}}


def _pandas(schema: Schema, df: pl.DataFrame) -> Any:
    """The schema's columns as pandas: numbers as float64 (null -> NaN), categories as object
    strings (null -> None), so both tables reach SDMetrics with identical dtypes."""
    out = df.select(
        [
            pl.col(c.name).cast(pl.String) if c.is_categorical else pl.col(c.name).cast(pl.Float64)
            for c in schema.columns
        ]
    ).to_pandas()
    for c in schema.columns:
        if c.is_categorical:
            out[c.name] = out[c.name].astype(object)
    return out


def quality_scores(schema: Schema, real: pl.DataFrame, synthetic: pl.DataFrame) -> dict[str, float]:
    """SDMetrics QualityReport of `synthetic` against `real` (normally the training table):
    overall score, column shapes and column-pair trends, each in [0, 1], higher is better."""
    from sdmetrics.reports import QualityReport

    check_columns(schema, real, "real")
    check_columns(schema, synthetic, "synthetic")
    report = QualityReport()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas/SDMetrics deprecation chatter
        report.generate(
            {TABLE: _pandas(schema, real)},
            {TABLE: _pandas(schema, synthetic)},
            sdmetrics_metadata(schema),
            verbose=False,
        )
    props = report.get_properties().set_index("Property")["Score"]
    return {
        "quality_score": float(report.get_score()),
        "quality_column_shapes": float(props["Column Shapes"]),
        "quality_column_pair_trends": float(props["Column Pair Trends"]),
    }


__all__ = ["QUALITY_KEYS", "quality_scores", "sdmetrics_metadata"]
