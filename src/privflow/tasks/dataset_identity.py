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
run (`--stream`) never holds its table whole: it records, and is checked by, the keyed sample of its
rows' digests (`fingerprint.sampled`: about 1 row in `SAMPLE_EVERY`, the same rows in every table),
read chunk by chunk; a whole table is compared with such a sample through its own rows in the
sample. A database source is read for the check as the run reads it. Datasets linked by the
curator (`privflow ledger link`) are not refused for each other's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privflow.core.errors import ConfigError
from privflow.privacy.fingerprint import (
    charged_share,
    digests_from_blob,
    is_sample,
    row_digests,
    sampled,
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


@dataclass(frozen=True)
class _Charged:
    """Another dataset's charged rows as the ledger keeps them: the digests of its whole tables, the
    keyed samples of its streamed ones (`fingerprint.sampled`), and its tables' fingerprints."""

    whole: np.ndarray
    sample: np.ndarray
    fingerprints: frozenset[str]


def _charged_elsewhere(ledger: Ledger, dataset: str) -> dict[str, _Charged]:
    linked = set(ledger.linked(dataset))
    records: dict[str, list[tuple[bytes, str]]] = {}
    for p in ledger.row_prints("charged"):
        if p.dataset != dataset and p.dataset not in linked:
            records.setdefault(p.dataset, []).append((p.digests, p.fingerprint))
    out: dict[str, _Charged] = {}
    for other, recs in sorted(records.items()):
        whole = [digests_from_blob(b) for b, f in recs if not is_sample(f)]
        part = [digests_from_blob(b) for b, f in recs if is_sample(f)]
        out[other] = _Charged(
            np.unique(np.concatenate(whole)) if whole else np.zeros(0, dtype="<u8"),
            np.unique(np.concatenate(part)) if part else np.zeros(0, dtype="<u8"),
            frozenset(f for _, f in recs if not is_sample(f)),
        )
    return out


def check_rows_not_charged_elsewhere(
    data: str | Path, schema_or_none: Schema | None, store: Path, dataset: str, streamed: bool = False
) -> None:
    """Refuse (`SameRowsOtherDataset`) a table half or more of whose rows, or whose fingerprint,
    are charged rows of a dataset other than `dataset` in `store`'s ledger. Returns at once, reading
    nothing, when the ledger does not exist or holds no charged row prints of another dataset.
    `streamed` (a run that reads its table in chunks, with its schema): the table is read chunk by
    chunk and only its rows in the keyed sample are compared (`fingerprint.sampled`), never held whole."""
    ledger_path = Path(store) / "ledger.db"
    if not ledger_path.is_file():
        return
    ledger = Ledger(ledger_path)
    others = _charged_elsewhere(ledger, dataset)
    if not others:
        return
    key = store_key(Path(store))
    if streamed and schema_or_none is not None:
        part = _sampled_rows(data, schema_or_none, key)
        for other, charged in others.items():
            if charged_share(part, charged.whole, charged.sample) >= PUBLIC_ROW_SHARE:
                _refuse(data, dataset, other, ledger_path)
        return
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
        for other, charged in others.items():
            same_table = fingerprint in charged.fingerprints
            if same_table or charged_share(digests, charged.whole, charged.sample) >= PUBLIC_ROW_SHARE:
                _refuse(data, dataset, other, ledger_path)


def _sampled_rows(data: str | Path, schema: Schema, key: bytes) -> np.ndarray:
    """The keyed sample of the digests of a streamed table's typed passing rows, read chunk by chunk."""
    from privflow.data.chunked import parquet_chunks
    from privflow.data.validation import typed_rows

    parts = [
        sampled(row_digests(typed_rows(chunk, schema), key))
        for chunk in parquet_chunks(data, max_line_bytes=schema.dataset.max_line_bytes)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype="<u8")


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
