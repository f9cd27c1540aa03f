"""Reading and writing the private table (CSV or Parquet) and fingerprinting it.

`read_table` only parses: it does not check the data against the schema (that is
`privflow.validation.validate`). CSV columns are all read as strings so a value of the wrong
type reaches validation, where it is counted, instead of crashing the parser. Every problem
becomes a `DataError` with one paragraph that names the file.

The format is decided by the content, not the suffix: Parquet by its magic bytes, gzip
compression by its own (either format may be gzipped), CSV text in UTF-8 (with or without
a byte-order mark) or UTF-16 with a byte-order mark, with the delimiter sniffed from the
first lines (comma, semicolon, tab or pipe). `sniff` and `read_header` look at the head of
the file only and `count_rows` counts without parsing values: the pre-flight check uses them
to refuse a bad file before any privacy is spent.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import zlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from privflow.errors import DataError

CSV_SUFFIXES = (".csv", ".tsv", ".txt")
PARQUET_SUFFIXES = (".parquet", ".pq")
TABLE_SUFFIXES = (".csv", *PARQUET_SUFFIXES)  # the tables privflow writes and takes as new data
_SUPPORTED = "CSV (.csv) or Parquet (.parquet, .pq), optionally gzip-compressed (.gz)"
DELIMITERS = (",", ";", "\t", "|")
DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
_HEAD_BYTES = 1 << 16
_EXACT_COUNT_BYTES = 1 << 20  # below this size rows are counted exactly with the csv module

_MAGIC = {
    b"PK\x03\x04": "a ZIP archive (an Excel .xlsx or .ods workbook?)",
    b"\xd0\xcf\x11\xe0": "an old Excel/Office document (.xls)",
    b"SQLite format 3": "an SQLite database",
    b"%PDF": "a PDF document",
    b"BZh": "a bzip2 archive",
    b"\xfd7zXZ": "an xz archive",
    b"(\xb5/\xfd": "a zstd archive",
    b"ARROW1": "an Arrow/Feather file",
}


@dataclass(frozen=True)
class TableFormat:
    """How a table file is stored, as sniffed from its first bytes."""

    kind: str  # "csv" | "parquet"
    compression: str | None = None  # "gzip" | None
    encoding: str | None = None  # "utf-8" | "utf-8-sig" | "utf-16" (CSV only)
    delimiter: str | None = None  # CSV only

    def describe(self) -> str:
        if self.kind == "parquet":
            out = "Parquet"
        else:
            name = DELIMITER_NAMES.get(self.delimiter or ",", repr(self.delimiter))
            out = f"{self.encoding or 'utf-8'} CSV, {name}-delimited"
        return out + (", gzip-compressed" if self.compression else "")


def _kind(path: Path) -> str:
    """The format chosen by suffix (writing only; reading decides by content)."""
    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise DataError(
        f"Data file '{path}' has the suffix '{path.suffix or '(none)'}'; privflow reads {_SUPPORTED} "
        "files only. Convert the file or rename it if it already is one of these formats."
    )


def _check_file(p: Path) -> None:
    if p.is_dir():
        raise DataError(
            f"Data path '{p}' is a directory, not a file; pass the table file itself (e.g. '{p}/data.csv')."
        )
    if not p.exists():
        raise DataError(f"Data file '{p}' does not exist; check the path (relative paths start in {Path.cwd()}).")
    if not p.is_file():
        raise DataError(f"Data path '{p}' is not a regular file (a device, socket or pipe?); pass a table file.")


def _raw(p: Path, limit: int | None = None) -> tuple[bytes, str | None]:
    """The file's bytes (decompressed if gzip), at most `limit` of them; and the compression."""
    _check_file(p)
    try:
        with p.open("rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == b"\x1f\x8b":
                try:
                    with gzip.GzipFile(fileobj=fh) as gz:
                        return (gz.read(limit) if limit is not None else gz.read()), "gzip"
                except (OSError, EOFError, zlib.error) as exc:
                    if limit is not None:  # a truncated head is fine; a broken archive is not
                        raise DataError(
                            f"Data file '{p}' is a damaged gzip archive ({exc}); compress it again."
                        ) from None
                    raise DataError(f"Data file '{p}' is a damaged gzip archive ({exc}); compress it again.") from None
            return (fh.read(limit) if limit is not None else fh.read()), None
    except PermissionError:
        raise DataError(
            f"Data file '{p}' cannot be read: permission denied. Give the user running privflow read access "
            f"(e.g. chmod u+r '{p}')."
        ) from None
    except IsADirectoryError:
        _check_file(p)
        raise
    except OSError as exc:
        raise DataError(f"Data file '{p}' cannot be read: {exc.strerror or exc}.") from None


def _encoding(p: Path, head: bytes) -> str:
    """The text encoding of a CSV head, or a DataError with a hint."""
    if head.startswith(codecs.BOM_UTF8):
        enc = "utf-8-sig"
    elif head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    elif head.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        raise DataError(f"Data file '{p}' is UTF-32 text; save it as UTF-8 CSV.")
    else:
        enc = "utf-8"
    sample = head[:4096]
    if (
        len(sample) >= 4
        and sample.count(b"\x00") * 3 >= len(sample)
        and (sample[1::2].count(0) * 2 >= len(sample[1::2]) or sample[0::2].count(0) * 2 >= len(sample[0::2]))
    ):
        raise DataError(
            f"Data file '{p}' looks like UTF-16 text without a byte-order mark; privflow reads UTF-8, or UTF-16 "
            "with a byte-order mark. Save it as UTF-8 CSV (e.g. iconv -f UTF-16LE -t UTF-8)."
        )
    if b"\x00" in head:
        raise DataError(
            f"Data file '{p}' contains NUL bytes, so it is neither CSV text nor Parquet (a binary or corrupted "
            "file?); export the table as UTF-8 CSV or Parquet."
        )
    try:
        codecs.getincrementaldecoder(enc)().decode(head, final=False)
    except UnicodeDecodeError as exc:
        byte = head[exc.start : exc.start + 1].hex()
        raise DataError(
            f"Data file '{p}' is not UTF-8 text: byte 0x{byte} at offset {exc.start} is not valid UTF-8. If it is "
            "Latin-1 or Windows-1252 (common for spreadsheet exports), convert it, e.g. "
            f"`iconv -f WINDOWS-1252 -t UTF-8 '{p}' > out.csv`; privflow reads UTF-8, or UTF-16 with a "
            "byte-order mark."
        ) from None
    return enc


def _decode(p: Path, data: bytes, enc: str) -> str:
    try:
        return data.decode(enc)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"Data file '{p}' is not valid {enc} text (undecodable byte at offset {exc.start}); if it is Latin-1 "
            "or Windows-1252, convert it to UTF-8 (e.g. with iconv) and try again."
        ) from None


def _sniff_delimiter(text: str) -> str:
    """The candidate that splits the first lines into the most fields, consistently (comma on ties)."""
    lines = [line for line in text.splitlines()[:21] if line.strip()]
    if len(lines) > 1 and not text.endswith(("\n", "\r")):
        lines = lines[:-1] if len(text) >= _HEAD_BYTES // 2 else lines  # the last line of a head may be cut
    if not lines:
        return ","
    best, best_width = ",", 1
    for d in DELIMITERS:
        try:
            widths = [len(row) for row in csv.reader(lines, delimiter=d)]
        except csv.Error:
            continue
        width = widths[0]
        if width > best_width and all(w == width for w in widths):
            best, best_width = d, width
    if best_width == 1:  # not consistent anywhere: the delimiter with the widest header
        for d in DELIMITERS:
            try:
                width = len(next(csv.reader(lines[:1], delimiter=d)))
            except (csv.Error, StopIteration):
                continue
            if width > best_width:
                best, best_width = d, width
    return best


def sniff(path: str | Path) -> TableFormat:
    """The file's format from its first bytes: Parquet or CSV (encoding, delimiter), gzip or not.

    Raises DataError for a missing or unreadable path, an empty file, a known non-table format
    (ZIP/Excel, PDF, ...), binary content or text in an encoding privflow does not read.
    """
    p = Path(path)
    head, compression = _raw(p, _HEAD_BYTES)
    if not head.strip():
        raise DataError(f"Data file '{p}' is empty; it needs a header row and at least one data row.")
    if head.startswith(b"PAR1"):
        return TableFormat("parquet", compression)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            raise DataError(f"Data file '{p}' is {what}, not a table privflow reads; export it as {_SUPPORTED}.")
    enc = _encoding(p, head)
    if enc == "utf-16":
        head = head[: len(head) - len(head) % 2]
    text = codecs.getincrementaldecoder(enc)(errors="replace").decode(head, final=False)
    return TableFormat("csv", compression, enc, _sniff_delimiter(text))


def _parse_csv(path: Path, text: str, delimiter: str = ",") -> pl.DataFrame:
    """Parse CSV text with Python's csv module into all-string columns; refuse what could mislead.

    polars 2.1's reader renames duplicate headers (`a_duplicated_0`), pads short rows with
    nulls, decodes invalid UTF-8 lossily and turns blank lines (even a trailing one) into rows
    of nulls; each would make a broken file look like plausible data. Here blank lines are not
    rows, and every other defect is a DataError naming the file and the line.
    """
    if "\x00" in text:
        raise DataError(
            f"Data file '{path}' contains NUL bytes, so it is not a text CSV file; export it as UTF-8 CSV or Parquet."
        )
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows: list[list[str]] = []
    try:
        header = _check_header(path, next(reader, None))
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
    columns = list(zip(*rows, strict=False)) if rows else [()] * width
    return pl.DataFrame(
        {name: list(col) for name, col in zip(header, columns, strict=False)},
        schema={name: pl.String for name in header},
    )


def _check_header(path: Path, header: list[str] | None) -> list[str]:
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
    return header


def _parquet_schema(p: Path, fmt: TableFormat) -> dict[str, pl.DataType]:
    try:
        if fmt.compression:
            data, _ = _raw(p)
            return dict(pl.read_parquet_schema(io.BytesIO(data)))
        return dict(pl.read_parquet_schema(p))
    except DataError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(
            f"Data file '{p}' starts like Parquet but its metadata does not parse ({first}); write it again."
        ) from None


def read_header(path: str | Path) -> tuple[TableFormat, list[str], dict[str, pl.DataType] | None]:
    """(format, column names, Parquet dtypes or None for CSV) from the head of the file only.

    CSV headers are checked for blank and duplicate names; no row value is read.
    """
    p = Path(path)
    fmt = sniff(p)
    if fmt.kind == "parquet":
        dtypes = _parquet_schema(p, fmt)
        if not dtypes:
            raise DataError(f"Data file '{p}' has no columns.")
        return fmt, list(dtypes), dtypes
    head, _ = _raw(p, _HEAD_BYTES)
    if fmt.encoding == "utf-16":
        head = head[: len(head) - len(head) % 2]
    text = codecs.getincrementaldecoder(fmt.encoding or "utf-8")(errors="replace").decode(head, final=False)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=fmt.delimiter or ",")
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise DataError(f"Data file '{p}' has a header line that is not valid CSV: {exc}.") from None
    return fmt, _check_header(p, header), None


def count_rows(path: str | Path, fmt: TableFormat | None = None) -> int:
    """Data rows in the file without parsing values: Parquet metadata, or a polars scan of the CSV
    (exact, with the csv module, for files under 1 MiB, where blank lines are not rows)."""
    p = Path(path)
    fmt = fmt or sniff(p)
    try:
        if fmt.kind == "parquet":
            if fmt.compression:
                data, _ = _raw(p)
                return int(pl.scan_parquet(io.BytesIO(data)).select(pl.len()).collect().item())
            return int(pl.scan_parquet(p).select(pl.len()).collect().item())
        plain = fmt.compression is None and fmt.encoding in ("utf-8", "utf-8-sig")
        if plain and p.stat().st_size >= _EXACT_COUNT_BYTES:
            scan = pl.scan_csv(p, separator=fmt.delimiter or ",", infer_schema=False, has_header=True)
            return int(scan.select(pl.len()).collect().item())
        data, _ = _raw(p)
        text = _decode(p, data, fmt.encoding or "utf-8")
        if len(text) >= _EXACT_COUNT_BYTES:
            frame = pl.read_csv(
                io.BytesIO(text.encode()), separator=fmt.delimiter or ",", infer_schema=False, columns=[0]
            )
            return frame.height
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=fmt.delimiter or ",")
        next(reader, None)
        return sum(1 for row in reader if row)
    except DataError:
        raise
    except (csv.Error, pl.exceptions.PolarsError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"Data file '{p}' could not be scanned as {fmt.describe()} ({first}).") from None


def empty_strings_to_null(df: pl.DataFrame) -> pl.DataFrame:
    """An empty field means a missing value, whether it was written as `,,` or `,"",`."""
    exprs = [
        pl.when(pl.col(name) == "").then(None).otherwise(pl.col(name)).alias(name)
        for name, dtype in df.schema.items()
        if dtype == pl.String
    ]
    return df.with_columns(exprs) if exprs else df


def read_table(path: str | Path) -> pl.DataFrame:
    """Read a CSV (every column as a string, empty field -> null) or Parquet file, gzipped or not.

    Raises DataError when the file is missing, is not a table privflow reads, does not parse,
    or holds no rows. The schema is not consulted here.
    """
    p = Path(path)
    fmt = sniff(p)
    data, _ = _raw(p)
    if fmt.kind == "csv":
        text = _decode(p, data, fmt.encoding or "utf-8")
        if not text.strip():
            raise DataError(f"Data file '{p}' is empty; it needs a header row and at least one data row.")
        df = _parse_csv(p, text, fmt.delimiter or ",")
    else:
        try:
            df = pl.read_parquet(io.BytesIO(data))
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(
                f"Data file '{p}' does not parse as Parquet ({first}); write it again, or export it as CSV."
            ) from None
    if df.width == 0:
        raise DataError(f"Data file '{p}' has no columns.")
    if df.height == 0:
        raise DataError(f"Data file '{p}' has a header but no data rows; there is nothing to train on.")
    return empty_strings_to_null(df)


def write_table(df: pl.DataFrame, path: str | Path) -> Path:
    """Write `df` as CSV or Parquet, chosen by the suffix; creates the parent folder. Written
    beside it and renamed when complete, so a failed write (a full disk) leaves no partial
    table under the name, and an earlier file of that name stays as it was."""
    p = Path(path)
    kind = _kind(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".part")
    try:
        if kind == "csv":
            df.write_csv(tmp)
        else:
            df.write_parquet(tmp)
        tmp.replace(p)
    finally:
        tmp.unlink(missing_ok=True)
    return p
