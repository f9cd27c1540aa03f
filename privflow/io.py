"""Reading and writing the private table (CSV or Parquet) and fingerprinting it.

`read_table` only parses: it does not check the data against the schema (that is
`privflow.validation.validate`). CSV columns are all read as strings so a value of the wrong
type reaches validation, where it is counted, instead of crashing the parser. Every problem
becomes a `DataError` with one paragraph that names the file.
"""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

import polars as pl

from privflow.errors import DataError

CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
_SUPPORTED = "CSV (.csv) or Parquet (.parquet, .pq)"


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise DataError(
        f"Data file '{path}' has the suffix '{path.suffix or '(none)'}'; privflow reads {_SUPPORTED} "
        "files only. Convert the file or rename it if it already is one of these formats."
    )


def _empty_strings_to_null(df: pl.DataFrame) -> pl.DataFrame:
    """An empty field means a missing value, whether it was written as `,,` or `,"",`."""
    exprs = [
        pl.when(pl.col(name) == "").then(None).otherwise(pl.col(name)).alias(name)
        for name, dtype in df.schema.items()
        if dtype == pl.String
    ]
    return df.with_columns(exprs) if exprs else df


def _parse_csv(path: Path, data: bytes) -> pl.DataFrame:
    """Parse CSV with Python's csv module into all-string columns; refuse what could mislead.

    polars 2.1's reader renames duplicate headers (`a_duplicated_0`), pads short rows with
    nulls, decodes invalid UTF-8 lossily and turns blank lines (even a trailing one) into rows
    of nulls; each would make a broken file look like plausible data. Here blank lines are not
    rows, and every other defect is a DataError naming the file and the line.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"Data file '{path}' is not a UTF-8 text CSV file (undecodable byte at offset {exc.start}); "
            "if it is Parquet, give it a .parquet suffix, otherwise export it again as UTF-8 CSV."
        ) from None
    if "\x00" in text:
        raise DataError(
            f"Data file '{path}' contains NUL bytes, so it is not a text CSV file; if it is Parquet, "
            "give it a .parquet suffix."
        )
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows: list[list[str]] = []
    try:
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise DataError(f"Data file '{path}' has no header row; the first line must name the columns.")
        blank = [i + 1 for i, h in enumerate(header) if not h.strip()]
        if blank:
            raise DataError(
                f"Data file '{path}' has {len(blank)} blank column name(s) in its header (position(s) "
                f"{blank[:5]}); every column needs a name that matches the schema."
            )
        dups = sorted({h for h in header if header.count(h) > 1})
        if dups:
            raise DataError(
                f"Data file '{path}' names these columns more than once in its header: {dups}; "
                "each column must appear exactly once."
            )
        width = len(header)
        bad_lines: list[int] = []
        n_bad = 0
        for row in reader:
            if not row:  # a blank line carries no row
                continue
            if len(row) != width:
                n_bad += 1
                if len(bad_lines) < 5:
                    bad_lines.append(reader.line_num)
                continue
            rows.append(row)
    except csv.Error as exc:
        raise DataError(f"Data file '{path}' is not valid CSV: {exc} (near line {reader.line_num}).") from None
    if n_bad:
        raise DataError(
            f"Data file '{path}' has {n_bad} row(s) whose number of fields differs from the header's "
            f"{width} (first at line(s) {bad_lines}); a short or long row would shift or invent values, "
            "so the file is refused. Fix the quoting or the separators in those rows."
        )
    columns = list(zip(*rows)) if rows else [()] * width
    return pl.DataFrame(
        {name: list(col) for name, col in zip(header, columns)},
        schema={name: pl.String for name in header},
    )


def read_table(path: str | Path) -> pl.DataFrame:
    """Read a CSV (every column as a string, empty field -> null) or Parquet file.

    Raises DataError when the file is missing, has an unsupported suffix, does not parse, or
    holds no rows. The schema is not consulted here.
    """
    p = Path(path)
    kind = _kind(p)
    if not p.is_file():
        raise DataError(f"Data file '{p}' does not exist or is not a regular file.")
    data = p.read_bytes()
    if not data.strip():
        raise DataError(f"Data file '{p}' is empty; it needs a header row and at least one data row.")
    if kind == "csv":
        df = _parse_csv(p, data)
    else:
        try:
            df = pl.read_parquet(io.BytesIO(data))
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(
                f"Data file '{p}' does not parse as Parquet ({first}); if it is a CSV file, give it a .csv suffix."
            ) from None
    if df.width == 0:
        raise DataError(f"Data file '{p}' has no columns.")
    if df.height == 0:
        raise DataError(f"Data file '{p}' has a header but no data rows; there is nothing to train on.")
    return _empty_strings_to_null(df)


def write_table(df: pl.DataFrame, path: str | Path) -> Path:
    """Write `df` as CSV or Parquet, chosen by the suffix; creates the parent folder."""
    p = Path(path)
    kind = _kind(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        df.write_csv(p)
    else:
        df.write_parquet(p)
    return p


def fingerprint(path: str | Path) -> str:
    """SHA-256 (hex) of the file's bytes: the dataset content fingerprint the ledger records."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Data file '{p}' does not exist, so it cannot be fingerprinted.")
    h = hashlib.sha256()
    with p.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
