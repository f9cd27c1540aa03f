"""The quarantine file: the rows a table's checks set aside, as given, for the data owner.

A CSV of the raw rows (values as read: it holds private rows and stays with the data owner,
never released) plus `_privflow_row`, each row's 0-based position in the input, and
`_privflow_failed_checks`, the checks it fails ("column:check;...", in the report's order).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from privflow.data.validation.report import CHECK_ORDER

ROW_COLUMN = "_privflow_row"  # quarantine file: the row's 0-based position in the input
REASON_COLUMN = "_privflow_failed_checks"  # quarantine file: "column:check;..." for the row


def write_quarantine(
    df: pl.DataFrame,
    masks: dict[tuple[str, str], pl.Series],
    row_fail: pl.Series,
    order: dict[str, int],
    path: Path,
    row_offset: int = 0,
    append: bool = False,
) -> None:
    """Failing rows as given (raw values), with their input position (`row_offset` + their place
    in `df`) and the checks they fail; `append` adds them to the file without a header."""
    n = df.height
    reasons = pl.Series(REASON_COLUMN, [""] * n)
    ordered = sorted(masks.items(), key=lambda kv: (order.get(kv[0][0], -1), CHECK_ORDER[kv[0][1]]))
    for (column, check), mask in ordered:
        tag = f"{column}:{check}"
        joined = pl.when(reasons == "").then(pl.lit(tag)).otherwise(reasons + ";" + tag)
        reasons = pl.select(pl.when(mask).then(joined).otherwise(reasons)).to_series().alias(REASON_COLUMN)
    as_text = [pl.col(c).cast(pl.String) for c, t in df.schema.items() if isinstance(t, (pl.Enum, pl.Categorical))]
    rows = (
        df.with_columns(as_text)
        .with_columns(pl.Series(ROW_COLUMN, range(row_offset, row_offset + n), dtype=pl.Int64), reasons)
        .filter(row_fail)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        with open(path, "ab") as f:
            rows.write_csv(f, include_header=False)
    else:
        rows.write_csv(path)
