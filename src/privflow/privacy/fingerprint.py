"""Data fingerprints, keyed with a per-store secret (docs/architecture.md, privacy rules 5 and 9).

An unsalted hash of a private file is a release: anyone who knows every row but one can
hash each guess for the last row and compare. Every fingerprint here is keyed with a random
per-store key that never leaves the store (created 0600 on first use); fingerprints are kept
in the ledger for the curator, never logged to MLflow or printed in the publishable summary.

Two kinds:

- `keyed_fingerprint`: HMAC-SHA256 of a file's BYTES. It tells "same file as before" from
  "different file" for a dataset's content-change notes, and nothing more: the same rows
  gzipped, reordered or re-encoded give another value.
- `row_digests` / `table_fingerprint`: a keyed digest of each PARSED row, taken over the row's
  values after the schema's coercion (validation's typed values), so the same table as CSV,
  gzipped CSV, UTF-16, CRLF lines or Parquet, in any row order, gives the same multiset of
  digests; the table's fingerprint is the keyed digest of its sorted row digests. These decide
  what a pretraining table holds (tasks/warm_start.py: rows a run was charged for are never
  public, rows `privflow generate` wrote link their generating run).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from privflow.core.errors import DataError

if TYPE_CHECKING:
    from privflow.data.schema import Schema

KEY_FILE = "fingerprint.key"
# 8 bytes per row: two different rows collide with probability 2^-64 per pair, so a table of a
# million rows checked against a million recorded ones shows a false match with odds ~5e-8.
ROW_DIGEST_BYTES = 8
_ROW_PERSON = b"privflow-row"  # blake2b personalisation: a row digest is never a table's
_TABLE_PERSON = b"privflow-table"
_NULL = "\x00"  # a missing value; a NUL byte never survives the reader in a valid value
_SEPARATOR = "\x1f"  # the ASCII unit separator between a row's values


def store_key(store: Path) -> bytes:
    """The store's secret fingerprint key, created from the OS CSPRNG on first use."""
    path = store / "secret" / KEY_FILE
    if path.is_file():
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def keyed_fingerprint(path: str | Path, key: bytes) -> str | None:
    """HMAC-SHA256 (hex) of the table's bytes under `key`: a file's, or a folder's Parquet parts
    in name order (each part's name and size framed before its bytes). None for a database
    source, which has no bytes of its own (the ledger then notes no content change)."""
    from privflow.core.source_uri import is_database_uri
    from privflow.data.io import table_parts

    if is_database_uri(path):
        return None
    p = Path(path)
    parts = table_parts(p)  # [p] for a file: its fingerprint is the file's bytes, as before
    if not all(f.is_file() for f in parts):
        raise DataError(f"Data file '{p}' does not exist, so it cannot be fingerprinted.")
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for f in parts:
        if p.is_dir():
            name = f.name.encode()
            mac.update(len(name).to_bytes(8, "little") + name + f.stat().st_size.to_bytes(8, "little"))
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                mac.update(chunk)
    return "hmac-sha256:" + mac.hexdigest()


def _canonical(typed: pl.DataFrame) -> pl.Series:
    """Each row's values as one text, its columns in the order of their names (a table whose
    columns are reordered, or a schema that declares them in another order, gives the same text):
    a number, or a label that reads as one ("02134", "39.0"), as a number - one that holds an
    integer (below 2^53) as that integer (39.0, 39 and "039" are one value whether a schema reads
    the column as numeric, integer or labels; -0.0 is 0), any other in its shortest round-trip
    form - other labels as their text, a missing value as NUL."""
    if typed.width == 0:
        return pl.Series("row", [""] * typed.height, dtype=pl.String)
    parts = []
    for name in sorted(typed.columns):
        dtype = typed.schema[name]
        col = pl.col(name)
        if dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum):
            col = col.cast(pl.String)
            number = col.str.strip_chars().cast(pl.Float64, strict=False)
            text = pl.when(number.is_finite()).then(_number_text(number)).otherwise(col)
        elif dtype.is_float():
            text = _number_text(col)
        else:
            text = col.cast(pl.String)
        parts.append(text.fill_null(_NULL))
    return typed.select(pl.concat_str(parts, separator=_SEPARATOR).alias("row")).to_series()


def _number_text(col: pl.Expr) -> pl.Expr:
    """A float as text: an integer (below 2^53) in decimal, any other value in its shortest round-trip form."""
    whole = col.is_finite() & (col == col.round(0)) & (col.abs() < 2.0**53)
    return pl.when(whole).then(col.cast(pl.Int64).cast(pl.String)).otherwise(col.cast(pl.String))


def row_digests(typed: pl.DataFrame, key: bytes) -> np.ndarray:
    """One keyed digest per row of `typed` (validation's typed frame: the schema's coerced
    values, `privflow.data.validation.validate`), as uint64, in the frame's row order:
    BLAKE2b-64 keyed with the store's key over the row's canonical values (`_canonical`)."""
    base = hashlib.blake2b(digest_size=ROW_DIGEST_BYTES, key=key[:64], person=_ROW_PERSON)
    out = bytearray()
    for row in _canonical(typed):
        h = base.copy()
        h.update(row.encode("utf-8", "surrogatepass"))
        out += h.digest()
    return np.frombuffer(bytes(out), dtype="<u8").copy()


def table_fingerprint(digests: np.ndarray, key: bytes) -> str:
    """The table's keyed fingerprint: BLAKE2b-128, keyed, over its sorted row digests (the
    multiset of rows: neither the file's encoding nor the rows' order changes it)."""
    h = hashlib.blake2b(digest_size=16, key=key[:64], person=_TABLE_PERSON)
    h.update(digests_blob(digests))
    return "blake2b-rows:" + h.hexdigest()


def digests_blob(digests: np.ndarray) -> bytes:
    """Row digests as stored in the ledger: sorted (no row order is kept), little-endian uint64."""
    return np.sort(np.asarray(digests, dtype="<u8")).astype("<u8").tobytes()


def digests_from_blob(blob: bytes) -> np.ndarray:
    """`digests_blob`'s inverse (sorted digests)."""
    return np.frombuffer(blob, dtype="<u8").copy()


SAMPLE_EVERY = 64  # a sampled record keeps the digests that are 0 modulo this (about 1 row in 64)
SAMPLED = "blake2b-rows-sample:"  # the fingerprint field of a sampled record: no table fingerprint
# a whole table is compared with a sampled record when this many of its own rows are in the sample
# (fewer: the share's estimate is too rough to refuse on)
MIN_SAMPLED = 32


def in_sample(digests: np.ndarray) -> np.ndarray:
    """Which digests are in the keyed sample: those that are 0 modulo SAMPLE_EVERY. A digest is keyed
    and uniform, so the sample is a random ~1/SAMPLE_EVERY of any table's rows that no one without
    the store's key can steer, and the same rows of two tables are in both samples or in neither: the
    share of a table's sampled rows found among another's sampled rows estimates the share of its
    rows found among the other's. What a table too large to hold whole (a streamed run) keeps."""
    return np.asarray(digests, dtype="<u8") % np.uint64(SAMPLE_EVERY) == 0


def sampled(digests: np.ndarray) -> np.ndarray:
    """The digests in the keyed sample (`in_sample`)."""
    d = np.asarray(digests, dtype="<u8")
    return d[in_sample(d)]


def sample_mark(rows: int) -> str:
    """The fingerprint field of a sampled record of a table of `rows` rows (no table fingerprint)."""
    return f"{SAMPLED}1/{SAMPLE_EVERY} of {rows} rows"


def is_sample(fingerprint: str | None) -> bool:
    return bool(fingerprint) and str(fingerprint).startswith(SAMPLED)


def sampled_rows(fingerprint: str | None) -> int | None:
    """The rows of the table a sampled record was taken from (`sample_mark`); None for a whole record."""
    if not is_sample(fingerprint):
        return None
    found = re.search(r" of (\d+) rows$", str(fingerprint))
    return int(found.group(1)) if found else None


def charged_share(digests: np.ndarray, whole: np.ndarray, sample: np.ndarray, skip: np.ndarray | None = None) -> float:
    """The share of a table's rows (`digests`, one per row) found among charged rows the ledger keeps
    whole (`whole`) or as keyed samples (`sample`, a streamed run's): over all rows against `whole`,
    and over the table's own rows in the sample (when at least MIN_SAMPLED are) against both; the
    larger. `skip` (a mask per row): rows never counted as found."""
    d = np.asarray(digests, dtype="<u8")
    if d.size == 0:
        return 0.0
    keep = np.ones(d.size, dtype=bool) if skip is None else ~np.asarray(skip, dtype=bool)
    found = found_in(d, whole) & keep
    share = float(np.mean(found))
    keyed = in_sample(d)
    if len(sample) and int(keyed.sum()) >= MIN_SAMPLED:
        share = max(share, float(np.mean(found[keyed] | (found_in(d[keyed], sample) & keep[keyed]))))
    return share


def found_in(digests: np.ndarray, recorded: np.ndarray) -> np.ndarray:
    """Which of `digests` (one per row) are among `recorded`: a boolean mask, row by row."""
    if len(digests) == 0 or len(recorded) == 0:
        return np.zeros(len(digests), dtype=bool)
    return np.isin(digests, recorded)


def surface_schema(schema: Schema) -> Schema:
    """`schema` without its ignored columns: the columns of a table privflow writes
    (`lowering.output_names`), to read such a table back as validation reads the input."""
    from privflow.data.schema import Schema

    kept = tuple(c for c in schema.columns if c.type != "ignore")
    if len(kept) == len(schema.columns):
        return schema
    return Schema(dataset=schema.dataset, columns=kept, target=schema.target, target_positive=schema.target_positive)


def table_rows(path: str | Path, schema: Schema) -> pl.DataFrame:
    """The rows of the table at `path` as a run reads them: `read_table`, then validation's
    coercion to the schema's typed values, keeping the rows that pass (`typed_rows`: polars
    alone, no file written, no row stops it). What `row_digests` is taken over for a table read back from disk."""
    from privflow.data.io import read_table
    from privflow.data.validation import typed_rows

    return typed_rows(read_table(path, max_line_bytes=schema.dataset.max_line_bytes), schema)


__all__ = [
    "KEY_FILE",
    "ROW_DIGEST_BYTES",
    "charged_share",
    "digests_blob",
    "digests_from_blob",
    "found_in",
    "in_sample",
    "is_sample",
    "MIN_SAMPLED",
    "sample_mark",
    "sampled",
    "sampled_rows",
    "SAMPLE_EVERY",
    "keyed_fingerprint",
    "row_digests",
    "store_key",
    "surface_schema",
    "table_fingerprint",
    "table_rows",
]
