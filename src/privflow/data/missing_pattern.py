"""The missing pattern: which of a table's nullable columns are missing on a row, as one column.

Each nullable column's DP marginal has a null cell, and the flow learns how those cells go
together; under DP-SGD's noise it learns it loosely, so two measurements that are missing on the
same rows came back with exactly one of them missing on a fifth of the synthetic rows (issue 44).
The copula codec (privflow/data/copula.py) therefore also takes the pattern: a categorical column
of 2^k cells, cell b holding the rows whose missing columns are the bits of b (bit i: the i-th
column of `pattern_columns`). Its DP marginal is the joint distribution of missingness, released
with the other marginals (one cell per row: the sensitivity counts it as one more column), and
the flow places it among the other columns like any of them (a measurement missing before a year
stays so). Decoding, the pattern decides which of its columns are null on a row. Since
`Marginals.nulls_in_pattern`, a covered column's coordinate holds its values alone (their CDF), a
missing value a draw in a narrow band around 1/2 (`Marginals.null_band`), and sampling ranks the
coordinate among the rows the pattern calls present (privflow/data/copula.py); in releases made
before, a column's own null cell was followed where the pattern says null and redrawn among its
values where it does not. Fixed by the public schema (privacy rule 2): a per-row map, no
statistic of the rows.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from privflow.data.schema import Schema

MAX_COLUMNS = 10  # at most 2^10 pattern cells: the first MAX_COLUMNS nullable columns take part
NAME = "(missing)"  # the pattern's column (primed until no declared column has the name)


def pattern_columns(schema: Schema) -> tuple[str, ...]:
    """The nullable columns of the pattern, in schema order (the target, drawn by its head, and
    the (k < 2)-column case, where the column's own null cell says it all, take none)."""
    names = tuple(c.name for c in schema.columns if c.nullable and c.name != schema.target)[:MAX_COLUMNS]
    return names if len(names) >= 2 else ()


def pattern_name(schema: Schema) -> str:
    name = NAME
    while name in schema.names:
        name += "'"
    return name


def labels(k: int) -> tuple[str, ...]:
    """The cells' labels: the pattern code b as text, for b = 0 .. 2^k - 1 (0: nothing missing)."""
    return tuple(str(b) for b in range(1 << k))


def codes(df: pl.DataFrame, columns: tuple[str, ...]) -> np.ndarray:
    """[n] int64: each row's pattern code, sum of 2^i over the columns i that are null (or NaN)."""
    out = np.zeros(df.height, dtype=np.int64)
    for i, name in enumerate(columns):
        s = df.get_column(name)
        null = s.is_null().to_numpy()
        if s.dtype.is_float():
            null = null | np.isnan(s.to_numpy())
        out |= null.astype(np.int64) << i
    return out


def nulls(code: np.ndarray, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """A decoded pattern code per row -> each column's null mask."""
    c = np.asarray(code, dtype=np.int64)
    return {name: ((c >> i) & 1).astype(bool) for i, name in enumerate(columns)}


__all__ = ["MAX_COLUMNS", "NAME", "codes", "labels", "nulls", "pattern_columns", "pattern_name"]
