"""One budget per table: the same rows under a second dataset name are refused before
anything is reserved (privacy rules 7 and 9; docs/privacy.md, "Public data is the data owner's
declaration").

Each dataset has its own budget, keyed by the schema's `dataset.name`; the same file drafted or
trained under a second name would get a second budget. Before `privflow run` reserves anything
(privflow/preflight) and before a DP `privflow schema draft` does (tasks/draft.py, `plan_draft`), the
curator's own data-identity check compares the file's keyed row digests (privacy/fingerprint.py,
the store's key) with the rows the store's ledger charged to OTHER datasets (`row_prints`, kind
'charged'). It reads the file's rows for this purpose only: no mechanism, nothing recorded, and
its outcome is told to the store's operator only (a refusal names the other dataset, never a row
or a count). A store whose ledger holds no charged row prints returns at once, without reading.

The digests compared:

- with a schema (a run): `table_rows` (validation's typed passing rows) - what runs record;
- without one (a draft, before its schema exists): `raw_typed`, the rows as `read_table` reads them,
  text trimmed, empty text and the draft's missing tokens as missing, and a column whose every
  value reads as a number as numbers. Through `fingerprint._canonical` (columns in the order of
  their names; a number, or a label that reads as one, as that number) this gives the digests a
  run or a draft records for the same rows whatever order its schema or the file keeps the columns
  in and whether a column of digits ("02134") is read as labels or numbers. Digests are over the columns a
  schema models, so a table read under a schema that ignores other columns than the charged run's
  gives other digests and is not caught (`_projections` tries the column sets a draft is likely
  to keep).

A table half or more of whose rows (`PUBLIC_ROW_SHARE`) are one other dataset's charged rows, or
whose fingerprint equals such a table's, is refused (`SameRowsOtherDataset`, exit 2). A streamed
run (`--stream`) is not checked: reading the whole table would defeat streaming (the run reads it
in chunks); streamed runs record no row digests either. Datasets linked by the curator
(`privflow ledger link`) are not refused for each other's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privflow.core.errors import ConfigError
from privflow.privacy.fingerprint import (
    digests_from_blob,
    found_in,
    row_digests,
    store_key,
    table_fingerprint,
    table_rows,
)
from privflow.privacy.ledger import Ledger
from privflow.tasks.warm_start import PUBLIC_ROW_SHARE  # the threshold `privflow pretrain` applies

if TYPE_CHECKING:
    import polars as pl

    from privflow.data.schema import Schema

# A column this share of whose values are distinct may be an identifier a draft typed `ignore`.
_DISTINCT_SHARE = 0.9


class SameRowsOtherDataset(ConfigError):
    """The table's rows are another dataset's charged rows: a second name would be a second budget."""


def raw_typed(frame: pl.DataFrame) -> pl.DataFrame:
    """A schema-free typed form of the rows `read_table` read (module docstring): unreadable rows
    left out, text trimmed, empty text and missing tokens as missing, all-numeric columns as numbers."""
    import polars as pl

    from privflow.data import draft as dd
    from privflow.data.io import UNREADABLE

    if UNREADABLE in frame.columns:
        frame = frame.filter(pl.col(UNREADABLE).is_null()).drop(UNREADABLE)
    frame = dd.normalised(frame, dd.missing_tokens(frame))
    exprs = []
    for name, dtype in frame.schema.items():
        if dtype == pl.String:
            col = frame.get_column(name)
            number = col.cast(pl.Float64, strict=False)
            if col.null_count() < frame.height and number.null_count() == col.null_count():
                exprs.append(pl.col(name).cast(pl.Float64, strict=False))
    return frame.with_columns(exprs) if exprs else frame


def _charged_elsewhere(ledger: Ledger, dataset: str) -> dict[str, list[tuple[bytes, str]]]:
    linked = set(ledger.linked(dataset))
    out: dict[str, list[tuple[bytes, str]]] = {}
    for p in ledger.row_prints("charged"):
        if p.dataset != dataset and p.dataset not in linked:
            out.setdefault(p.dataset, []).append((p.digests, p.fingerprint))
    return out


def check_rows_not_charged_elsewhere(
    data: str | Path, schema_or_none: Schema | None, store: Path, dataset: str
) -> None:
    """Refuse (`SameRowsOtherDataset`) a table half or more of whose rows, or whose fingerprint,
    are charged rows of a dataset other than `dataset` in `store`'s ledger. Returns at once, reading
    nothing, when the ledger does not exist or holds no charged row prints of another dataset.
    A database source has no rows to compare before the run and is not checked."""
    from privflow.core.source_uri import is_database_uri

    ledger_path = Path(store) / "ledger.db"
    if not ledger_path.is_file() or is_database_uri(data):
        return
    ledger = Ledger(ledger_path)
    others = _charged_elsewhere(ledger, dataset)
    if not others:
        return
    key = store_key(Path(store))
    recorded = {
        other: (np.unique(np.concatenate([digests_from_blob(b) for b, _ in records])), {f for _, f in records})
        for other, records in sorted(others.items())
    }
    if schema_or_none is None:
        from privflow.data.io import read_table

        frames = _projections(raw_typed(read_table(data)))
    else:
        frames = [table_rows(data, schema_or_none)]
    for typed in frames:
        digests = row_digests(typed, key)
        if len(digests) == 0:
            continue
        fingerprint = table_fingerprint(digests, key)
        for other, (rows, fingerprints) in recorded.items():
            if float(np.mean(found_in(digests, rows))) >= PUBLIC_ROW_SHARE or fingerprint in fingerprints:
                _refuse(data, dataset, other, ledger_path)


def _projections(frame: pl.DataFrame) -> list[pl.DataFrame]:
    """The column sets a drafted schema may keep of `frame` (`raw_typed`), most likely first: a
    draft types a column with no value, and often one whose values are nearly all distinct (an
    identifier), as `ignore`, and a run's typed rows leave ignored columns out. So: every column
    with a value; those without the nearly-distinct ones; those without each one of them."""
    kept = [c for c in frame.columns if frame.get_column(c).null_count() < frame.height]
    distinct = [c for c in kept if frame.height and frame.get_column(c).n_unique() >= _DISTINCT_SHARE * frame.height]
    candidates = [kept, [c for c in kept if c not in distinct]]
    candidates += [[c for c in kept if c != d] for d in distinct] if len(distinct) > 1 else []
    out: list[pl.DataFrame] = []
    seen: set[tuple[str, ...]] = set()
    for columns in candidates:
        if columns and tuple(columns) not in seen:
            seen.add(tuple(columns))
            out.append(frame.select(columns))
    return out


def _refuse(data: str | Path, dataset: str, other: str, ledger_path: Path) -> None:
    raise SameRowsOtherDataset(
        f"'{data}' holds rows that runs on dataset '{other}' were charged for in the privacy ledger "
        f"('{ledger_path}'), so it cannot be spent as dataset '{dataset}' with a budget of its own: half or "
        "more of its rows are that dataset's (compared by keyed row digests, curator-only, so format, "
        "compression, encoding and row order do not matter). Use the dataset name "
        f"'{other}' in the schema (`dataset.name`, or --name for a draft), or, if the data owner decides "
        f"the two names are one table on purpose, record that with `privflow ledger link {dataset} {other}`"
        " (the two budgets then stay separate, which is that decision's consequence). Nothing was reserved."
    )


__all__ = ["PUBLIC_ROW_SHARE", "SameRowsOtherDataset", "check_rows_not_charged_elsewhere", "raw_typed"]
