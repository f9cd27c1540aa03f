"""Reading and writing the private table (CSV or Parquet).

`read_table` only parses: it does not check the data against the schema (that is
`privflow.data.validation.validate`). CSV columns are all read as strings so a value of the wrong
type reaches validation, where it is counted. The reader is total over rows (privacy rule 8):
a row is a line, and a line that cannot be read as a row of the header's columns becomes a
failing row, never a refusal of the file. Each line is decoded on its own (a line fails only for
its own bytes), and a line longer than the public cap (`MAX_LINE_BYTES`, the schema's
`dataset.max_line_bytes`) is a failing row read in bounded memory: a CSV file is streamed, never
held whole. In Parquet, a row holding a text value that is not UTF-8, or more text than that cap,
is a failing row in the same way. Only what is public may refuse a file before a row
is read, each as a `DataError` with one paragraph that names the file: the format (decided
by the content, not the suffix: Parquet by its magic bytes, gzip by its own, CSV text in
UTF-8 with or without a byte-order mark, or UTF-16 with one) and the header line (which
also decides the delimiter: comma, semicolon, tab or pipe). `sniff` and `read_header` read
the first bytes and the header line only.

Two other sources read as one table (docs/configuration.md): a folder of Parquet files (its own
`*.parquet` / `*.pq` files, sorted by name, not its subfolders: `table_parts`), read file by file
as one Parquet file is and concatenated, after their columns were checked to agree (public
metadata, `read_header`); and a PostgreSQL table or query named by a `postgresql://` URI
(privflow/data/sources.py), read with the same total semantics.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import polars as pl

from privflow.core.errors import DataError, first_line
from privflow.core.source_uri import is_database_uri

CSV_SUFFIXES = (".csv", ".tsv", ".txt")
PARQUET_SUFFIXES = (".parquet", ".pq")
TABLE_SUFFIXES = (".csv", *PARQUET_SUFFIXES)  # the tables privflow writes and takes as new data
_SUPPORTED = "CSV (.csv) or Parquet (.parquet, .pq), optionally gzip-compressed (.gz)"
DELIMITERS = (",", ";", "\t", "|")
DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
_HEAD_BYTES = 1 << 16

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

    kind: str  # "csv" | "parquet" | "postgresql"
    compression: str | None = None  # "gzip" | None
    encoding: str | None = None  # "utf-8" | "utf-8-sig" | "utf-16" (CSV only)
    delimiter: str | None = None  # CSV only
    files: int | None = None  # a folder of Parquet files: how many
    source: str | None = None  # a database: what it is (`PostgresSource.describe`, no password)

    def describe(self) -> str:
        if self.kind == "postgresql":
            return self.source or "PostgreSQL"
        if self.kind == "parquet":
            out = "Parquet" + (f", a folder of {self.files} file{'s' if self.files != 1 else ''}" if self.files else "")
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


def _folder_error(p: Path, why: str, fix: str) -> DataError:
    return DataError(
        f"Data path '{p}' is a directory, which privflow reads as a folder of Parquet files (its own *.parquet and "
        f"*.pq files in name order, skipping names that start with '.' or '_'; not its subfolders: no hive-style "
        f"partitions), but it {why}; {fix}."
    )


def table_parts(path: str | Path) -> list[Path]:
    """The files a table is read from: `[path]` for a file; for a folder, its Parquet files
    (`*.parquet`, `*.pq`) sorted by name, skipping names that start with '.' or '_' (`_SUCCESS`,
    `.crc` files). A folder that holds a subfolder or another file, or no Parquet file, is refused
    (DataError): no part of the table is silently left out."""
    p = Path(path)
    if not p.is_dir():
        return [p]
    try:
        entries = sorted(p.iterdir(), key=lambda e: e.name)
    except PermissionError:
        raise DataError(
            f"Data folder '{p}' cannot be listed: permission denied. Give the user running privflow read access."
        ) from None
    except OSError as exc:
        raise DataError(f"Data folder '{p}' cannot be listed: {exc.strerror or exc}.") from None
    entries = [e for e in entries if not e.name.startswith((".", "_"))]
    folders = [e.name for e in entries if e.is_dir()]
    if folders:
        raise _folder_error(p, f"holds the subfolder(s) {folders[:5]}", "move their files up, or pass a subfolder")
    others = [e.name for e in entries if e.suffix.lower() not in PARQUET_SUFFIXES]
    if others:
        more = f" and {len(others) - 5} more" if len(others) > 5 else ""
        example = next((o for o in others if o.lower().endswith(CSV_SUFFIXES + (".gz",))), others[0])
        raise _folder_error(
            p,
            f"holds file(s) that are not Parquet: {others[:5]}{more}",
            f"move them out, or pass the table file itself (e.g. '{p / example}')",
        )
    if not entries:
        raise _folder_error(p, "holds no Parquet file", "pass the table file itself, or a folder of Parquet files")
    return entries


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


def _header_bytes(head: bytes) -> bytes:
    """The first line of a head of the file (the header): public, unlike every line after it."""
    cut = head.find(b"\n")
    return head if cut < 0 else head[: cut + 1]


def _encoding(p: Path, head: bytes) -> str:
    """The text encoding of a CSV file, from its byte-order mark and its header line only, or a
    DataError with a hint. Rows are never looked at: a row that does not decode is a failing row
    (`read_table`), not a verdict on the file."""
    if head.startswith(codecs.BOM_UTF8):
        enc = "utf-8-sig"
    elif head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    elif head.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        raise DataError(f"Data file '{p}' is UTF-32 text; save it as UTF-8 CSV.")
    else:
        enc = "utf-8"
    line = _header_bytes(head)
    if len(line) >= 4 and line.count(b"\x00") * 3 >= len(line):
        raise DataError(
            f"Data file '{p}' looks like UTF-16 text without a byte-order mark; privflow reads UTF-8, or UTF-16 "
            "with a byte-order mark. Save it as UTF-8 CSV (e.g. iconv -f UTF-16LE -t UTF-8)."
        )
    if b"\x00" in line:
        raise DataError(
            f"Data file '{p}' has NUL bytes in its header line, so it is neither CSV text nor Parquet (a binary or "
            "corrupted file?); export the table as UTF-8 CSV or Parquet."
        )
    try:
        codecs.getincrementaldecoder(enc)().decode(line, final=False)
    except UnicodeDecodeError:
        raise DataError(
            f"Data file '{p}' has a header line that is not UTF-8 text. If the file is Latin-1 or Windows-1252 "
            f"(common for spreadsheet exports), convert it, e.g. `iconv -f WINDOWS-1252 -t UTF-8 '{p}' > out.csv`; "
            "privflow reads UTF-8, or UTF-16 with a byte-order mark."
        ) from None
    return enc


def _header_text(head: bytes, enc: str) -> str:
    """The header line of a head of the file, decoded (without its line break)."""
    if enc == "utf-16":
        head = head[: len(head) - len(head) % 2]
        text = codecs.getincrementaldecoder(enc)(errors="replace").decode(head, final=False)
        return text.split("\n", 1)[0].rstrip("\r")
    text = _header_bytes(head).decode(enc, errors="replace")
    return text.split("\n", 1)[0].rstrip("\r")


def _sniff_delimiter(header: str) -> str:
    """The candidate that splits the header line into the most fields (comma on ties). Only the
    header is public: a delimiter sniffed from rows would let one row decide how every row is read."""
    best, best_width = ",", 1
    for d in DELIMITERS:
        try:
            width = len(next(csv.reader([header], delimiter=d)))
        except (csv.Error, StopIteration):
            continue
        if width > best_width:
            best, best_width = d, width
    return best


def sniff(path: str | Path) -> TableFormat:
    """The file's format from its first bytes and header line: Parquet or CSV (encoding,
    delimiter), gzip or not.

    Raises DataError for a missing or unreadable path, an empty file, a known non-table format
    (ZIP/Excel, PDF, ...), or a header line that is binary or in an encoding privflow does not
    read. What the rows hold is never looked at here.
    """
    if is_database_uri(path):
        from privflow.data.sources import parse_source

        return TableFormat("postgresql", source=parse_source(path).describe())
    p = Path(path)
    if p.is_dir():
        parts = table_parts(p)
        for part in parts:
            fmt = sniff(part)
            if fmt.kind != "parquet" or fmt.compression is not None:
                raise _folder_error(
                    p, f"holds '{part.name}', which is {fmt.describe()}", "write it as plain Parquet, or move it out"
                )
        return TableFormat("parquet", files=len(parts))
    head, compression = _raw(p, _HEAD_BYTES)
    if not head.strip():
        raise DataError(f"Data file '{p}' is empty; it needs a header row naming the columns.")
    if head.startswith(b"PAR1"):
        return TableFormat("parquet", compression)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            raise DataError(f"Data file '{p}' is {what}, not a table privflow reads; export it as {_SUPPORTED}.")
    enc = _encoding(p, head)
    return TableFormat("csv", compression, enc, _sniff_delimiter(_header_text(head, enc)))


UNREADABLE = "_privflow_unreadable"  # read_table: why a row could not be read (null on rows that were)
MAX_LINE_BYTES = 1_048_576  # the default public cap on one line's bytes (the schema's dataset.max_line_bytes)
_CAP_NAME = "dataset.max_line_bytes"
_CHUNK_BYTES = 1 << 20  # bytes read from the file at a time: a CSV file is never held whole


def _byte_chunks(p: Path, size: int | None = None) -> Iterator[bytes]:
    """The file's bytes, decompressed if gzip, `size` (default `_CHUNK_BYTES`) at a time: a stream,
    memory stays one chunk."""
    size = size or _CHUNK_BYTES
    _check_file(p)
    try:
        fh = p.open("rb")
    except PermissionError:
        raise DataError(
            f"Data file '{p}' cannot be read: permission denied. Give the user running privflow read access "
            f"(e.g. chmod u+r '{p}')."
        ) from None
    except OSError as exc:
        raise DataError(f"Data file '{p}' cannot be read: {exc.strerror or exc}.") from None
    with fh:
        gz = False
        try:
            gz = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            source: io.BufferedIOBase = gzip.GzipFile(fileobj=fh) if gz else fh
            while chunk := source.read(size):
                yield chunk
        except (OSError, EOFError, zlib.error) as exc:
            if gz:
                raise DataError(f"Data file '{p}' is a damaged gzip archive ({exc}); compress it again.") from None
            raise DataError(f"Data file '{p}' cannot be read: {getattr(exc, 'strerror', None) or exc}.") from None


def _longer(line: bytes, cr: bytes, cap: int) -> bool:
    """Whether a line's bytes, less a final carriage return, pass the cap."""
    return len(line) - (len(cr) if line.endswith(cr) else 0) > cap


def _split(chunks: Iterable[bytes], newline: bytes, cr: bytes, cap: int) -> Iterator[bytes | None]:
    """The physical lines of a byte stream, without their newline; None for a line longer than `cap`
    bytes (its CRLF's carriage return not counted). A line ends at the first `newline` after its
    start, at any byte offset. The bytes of an over-long line are dropped as they stream by (only its
    last len(newline) - 1 bytes are kept, in case the newline straddles two chunks), so at most
    cap + one chunk is held, whatever a line's size."""
    keep = len(newline) - 1
    tail, over = b"", False
    for chunk in chunks:
        parts = (tail + chunk).split(newline)
        tail = parts.pop()
        for part in parts:
            yield None if over or _longer(part, cr, cap) else part
            over = False
        if over or len(tail) > cap + len(cr) + keep:  # (its end may be a newline's first bytes)
            over, tail = True, tail[len(tail) - keep :]
    if tail or over:
        yield None if over or _longer(tail, cr, cap) else tail


def _text_lines(p: Path, fmt: TableFormat, cap: int) -> Iterator[tuple[int, str | None, str | None]]:
    """Each physical line of a CSV file: (its number, from 1; its text without the line ending, or
    None; why it is None). Each line is decoded on its own and strictly, so a line fails only for
    its own bytes: one that does not decode, or is longer than `cap` bytes, is None with its reason;
    a valid U+FFFD is a character like any other. The file is read as a stream (gzip too), never
    whole, and an over-long line is never held.

    UTF-16 (byte-order mark): a line ends at the first newline code unit (LE b"\\n\\x00", BE
    b"\\x00\\n") after its start, at ANY byte offset, not only at an even one. A line with an odd
    number of bytes (which fails: it is not UTF-16) thus ends at its own newline, and the next line
    starts right after it, so it spoils no other line; at even offsets only, every line after it
    would be read shifted by a byte. The price: a line holding those two bytes at an odd offset (LE:
    a character U+0A00-U+0AFF followed by one U+xx00; BE: U+xx00 followed by U+0A00-U+0AFF) is split
    there into two lines of an odd byte count each, two failing rows, each decided by its own bytes."""
    enc = fmt.encoding or "utf-8"
    chunks = _byte_chunks(p)
    head = b""
    for chunk in chunks:  # enough bytes for the byte-order mark
        head += chunk
        if len(head) >= 3:
            break
    if enc == "utf-16":
        codec, name = ("utf-16-be" if head.startswith(codecs.BOM_UTF16_BE) else "utf-16-le"), "UTF-16"
        bom = 2
    else:
        codec, name = "utf-8", "UTF-8"
        bom = 3 if enc == "utf-8-sig" and head.startswith(codecs.BOM_UTF8) else 0
    newline, cr = "\n".encode(codec), "\r".encode(codec)
    too_long = f"is longer than the cap of {cap:,} bytes ({_CAP_NAME})"
    for number, line in enumerate(_split(itertools.chain([head[bom:]], chunks), newline, cr, cap), start=1):
        if line is None:
            yield number, None, too_long
            continue
        try:
            text = line.decode(codec)
        except UnicodeDecodeError as exc:
            if name == "UTF-16" and len(line) % 2:
                why = f"has an odd number of bytes ({len(line):,}), so it is not {name} text"
            else:
                why = f"holds bytes that are not valid {name} text ({exc.reason} at byte {exc.start + 1})"
            yield number, None, why
            continue
        yield number, text[:-1] if text.endswith("\r") else text, None


def _row(line: str, delimiter: str, width: int) -> tuple[list[str] | None, str | None]:
    """One data line split into fields, or None and the reason it is not a row of this table."""
    if "\x00" in line:
        return None, "holds a NUL byte"
    if '"' not in line and "\r" not in line:
        fields = line.split(delimiter)
    else:
        try:
            records = list(csv.reader([line], delimiter=delimiter, strict=True))
        except csv.Error as exc:
            return None, f"is not valid CSV ({exc})"
        fields = records[0] if records else []
    if len(fields) != width:
        return None, f"has {len(fields)} fields where the header has {width}"
    return fields, None


def _parse_csv(path: Path, fmt: TableFormat, cap: int) -> pl.DataFrame:
    """Parse a CSV file into all-string columns, one row per line, totally: the header decides the
    columns, and a line that is not a row of them (a field too many or too few, broken quoting, a
    NUL, bytes that do not decode, more than `cap` bytes) becomes a row of nulls whose `UNREADABLE`
    field says why, so that validation counts it as a failing row instead of refusing the file.
    Whatever one line holds, it changes no other row (privacy rule 8). Blank lines are not rows.

    A consequence: a quoted field may not hold a line break (each part would be a failing row).
    polars' reader is not used: it pads short rows, renames duplicate headers and reads invalid
    UTF-8 lossily, each of which would make a broken row look like plausible data.
    """
    delimiter = fmt.delimiter or ","
    lines = _text_lines(path, fmt, cap)
    first: str | None = None
    for _, text, why in lines:
        if text is None:
            raise DataError(f"Data file '{path}' has a header line that {why}.")
        if text.strip():
            first = text
            break
    if first is None:
        raise DataError(f"Data file '{path}' is empty; it needs a header row naming the columns.")
    try:
        header = next(csv.reader([first], delimiter=delimiter, strict=True), None)
    except csv.Error as exc:
        raise DataError(f"Data file '{path}' has a header line that is not valid CSV: {exc}.") from None
    header = _check_header(path, header)
    width = len(header)
    rows: list[list[str | None]] = []
    reasons: list[str | None] = []
    empty: list[str | None] = [None] * width
    for number, text, why in lines:
        if text is not None and not text.strip():
            continue
        fields, why = (None, why) if text is None else _row(text, delimiter, width)
        if fields is None:
            rows.append(empty)
            reasons.append(f"line {number} {why}")
        else:
            rows.append(fields)  # type: ignore[arg-type]
            reasons.append(None)
    columns = list(zip(*rows, strict=True)) if rows else [()] * width
    frame = pl.DataFrame(
        {name: list(col) for name, col in zip(header, columns, strict=True)},
        schema={name: pl.String for name in header},
    )
    if any(r is not None for r in reasons):
        frame = frame.with_columns(pl.Series(UNREADABLE, reasons, dtype=pl.String))
    return frame


def _check_header(path: Path | str, header: list[str] | None, what: str = "Data file") -> list[str]:
    if header is None or not any(h.strip() for h in header):
        raise DataError(f"{what} '{path}' has no header row; the first line must name the columns.")
    blank = [i + 1 for i, h in enumerate(header) if not h.strip()]
    if blank:
        raise DataError(
            f"{what} '{path}' has {len(blank)} blank column name(s) in its header (position(s) "
            f"{blank[:5]}); every column needs a name that matches the schema."
        )
    dups = sorted({h for h in header if header.count(h) > 1})
    if dups:
        raise DataError(
            f"{what} '{path}' names these columns more than once in its header: {dups}; "
            "each column must appear exactly once."
        )
    if UNREADABLE in header:
        raise DataError(f"{what} '{path}' has a column named '{UNREADABLE}', a name privflow reserves.")
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
        first = first_line(exc)
        raise DataError(
            f"Data file '{p}' starts like Parquet but its metadata does not parse ({first}); write it again."
        ) from None


def _folder_schema(p: Path) -> dict[str, pl.DataType]:
    """The columns of a folder's Parquet files, which must agree on their names (any order); a
    column stored with different types in different files takes their common supertype (as
    polars' relaxed concatenation does), and there must be one. Metadata only (public)."""
    parts = table_parts(p)
    schemas = [(part, _parquet_schema(part, TableFormat("parquet"))) for part in parts]
    first, names = schemas[0][0], list(schemas[0][1])
    for part, dtypes in schemas[1:]:
        missing = [c for c in names if c not in dtypes]
        extra = [c for c in dtypes if c not in names]
        if missing or extra:
            said = []
            if missing:
                said.append(f"lacks column(s) {missing[:10]}")
            if extra:
                said.append(f"has column(s) {extra[:10]} that '{first.name}' does not")
            raise DataError(
                f"Data folder '{p}' holds Parquet files whose columns disagree: '{part.name}' {' and '.join(said)} "
                f"(compared with '{first.name}', the first by name). Every file of a folder is a part of one table "
                "and must have the same column names; write the files again with one schema, or move the odd ones out."
            )
    out: dict[str, pl.DataType] = {}
    for name in names:
        kinds = {str(d[name]): (part, d[name]) for part, d in schemas}
        if len(kinds) == 1:
            out[name] = schemas[0][1][name]
            continue
        try:
            frames = [pl.DataFrame(schema={name: d[name]}) for _, d in schemas]
            out[name] = pl.concat(frames, how="vertical_relaxed").schema[name]
        except Exception:
            seen = "; ".join(f"'{part.name}': {dtype}" for part, dtype in list(kinds.values())[:4])
            raise DataError(
                f"Data folder '{p}' holds Parquet files that store column '{name}' with types that have no common "
                f"type ({seen}). Write the column with one type in every file."
            ) from None
    return out


def read_header(path: str | Path) -> tuple[TableFormat, list[str], dict[str, pl.DataType] | None]:
    """(format, column names, Parquet dtypes or None for CSV) from the head of the file only.

    CSV headers are checked for blank and duplicate names; no row value is read. A folder of
    Parquet files: their columns, which must agree (`_folder_schema`). A database URI: the
    columns of its table or query (a `LIMIT 0` query; the connection is checked too); no dtypes,
    since every column is read as text.
    """
    header: list[str] | None  # None: a CSV file without a first line
    if is_database_uri(path):
        from privflow.data.sources import database_header, parse_source

        src = parse_source(path)
        header = _check_header(src.shown, database_header(src), "Data source")
        return TableFormat("postgresql", source=src.describe()), header, None
    p = Path(path)
    fmt = sniff(p)
    if fmt.files is not None:
        dtypes = _folder_schema(p)
        if not dtypes:
            raise DataError(f"Data folder '{p}' holds Parquet files with no columns.")
        if UNREADABLE in dtypes:
            raise DataError(f"Data folder '{p}' has a column named '{UNREADABLE}', a name privflow reserves.")
        return fmt, list(dtypes), dtypes
    if fmt.kind == "parquet":
        dtypes = _parquet_schema(p, fmt)
        if not dtypes:
            raise DataError(f"Data file '{p}' has no columns.")
        return fmt, list(dtypes), dtypes
    head, _ = _raw(p, _HEAD_BYTES)
    try:
        header = next(csv.reader([_header_text(head, fmt.encoding or "utf-8")], delimiter=fmt.delimiter or ","), None)
    except csv.Error as exc:
        raise DataError(f"Data file '{p}' has a header line that is not valid CSV: {exc}.") from None
    return fmt, _check_header(p, header), None


def count_rows(path: str | Path, fmt: TableFormat | None = None, max_line_bytes: int | None = None) -> int:
    """Data rows in the file without parsing values: Parquet metadata, or the CSV's non-blank
    lines after the header (a row is a line, as `read_table` reads it, read as a stream). For
    PUBLIC files only (pretraining): a private file's row count is never a public fact (privacy
    rule 8). A folder: the sum over its files; a database: `count(*)`."""
    if is_database_uri(path):
        from privflow.data.sources import database_rows, parse_source

        return database_rows(parse_source(path))
    p = Path(path)
    fmt = fmt or sniff(p)
    if fmt.files is not None:
        return sum(count_rows(part, TableFormat("parquet")) for part in table_parts(p))
    try:
        if fmt.kind == "parquet":
            if fmt.compression:
                data, _ = _raw(p)
                return int(pl.scan_parquet(io.BytesIO(data)).select(pl.len()).collect().item())
            return int(pl.scan_parquet(p).select(pl.len()).collect().item())
        lines = _text_lines(p, fmt, _cap(max_line_bytes))
        return max(0, sum(1 for _, text, _ in lines if text is None or text.strip()) - 1)
    except DataError:
        raise
    except (pl.exceptions.PolarsError, OSError) as exc:
        first = first_line(exc)
        raise DataError(f"Data file '{p}' could not be scanned as {fmt.describe()} ({first}).") from None


def empty_strings_to_null(df: pl.DataFrame) -> pl.DataFrame:
    """An empty field means a missing value, whether it was written as `,,` or `,"",`."""
    exprs = [
        pl.when(pl.col(name) == "").then(None).otherwise(pl.col(name)).alias(name)
        for name, dtype in df.schema.items()
        if dtype == pl.String
    ]
    return df.with_columns(exprs) if exprs else df


def _cap(max_line_bytes: int | None) -> int:
    if max_line_bytes is None:
        return MAX_LINE_BYTES
    if max_line_bytes < 1:
        raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
    return int(max_line_bytes)


# ----------------------------------------------------------------------------- Parquet rows


def _valid(arr: Any) -> bool:
    import pyarrow as pa

    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _invalid_values(arr: Any) -> tuple[list[int], bool]:
    """Positions of the values of a pyarrow array that are not valid (text that is not UTF-8: the
    Parquet reader does not check it), and whether a dictionary's entries were among them. A clean
    array costs one validation; otherwise halves are validated down to the bad values (bisection)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if _valid(arr):
        return [], False
    if pa.types.is_dictionary(arr.type):
        entries, _ = _invalid_values(arr.dictionary)
        if entries:
            hit = pc.is_in(arr.indices, value_set=pa.array(entries, type=arr.indices.type)).fill_null(False)
            return np.flatnonzero(hit.to_numpy(zero_copy_only=False)).tolist(), True
    nested = pa.types.is_nested(arr.type)  # a slice of a list still validates all its child values: copy

    def piece(lo: int, hi: int) -> Any:
        return arr.take(pa.array(np.arange(lo, hi))) if nested else arr.slice(lo, hi - lo)

    out: list[int] = []

    def walk(lo: int, hi: int) -> None:
        if _valid(piece(lo, hi)):
            return
        if hi - lo == 1:
            out.append(lo)
            return
        mid = (lo + hi) // 2
        walk(lo, mid)
        walk(mid, hi)

    if len(arr):
        walk(0, len(arr))
    return out, False


def _text_bytes(df: pl.DataFrame) -> pl.Series | None:
    """Each row's bytes of text and binary values (nulls count 0), or None without such columns."""
    sizes = []
    for name, dtype in df.schema.items():
        if dtype == pl.String:
            sizes.append(pl.col(name).str.len_bytes())
        elif isinstance(dtype, (pl.Categorical, pl.Enum)):
            sizes.append(pl.col(name).cat.len_bytes())
        elif dtype == pl.Binary:
            sizes.append(pl.col(name).bin.size())
    if not sizes:
        return None
    return df.select(pl.sum_horizontal([s.cast(pl.UInt64).fill_null(0) for s in sizes])).to_series()


def capped_rows(
    df: pl.DataFrame, cap: int = MAX_LINE_BYTES, first_row: int = 0, reasons: dict[int, str] | None = None
) -> pl.DataFrame:
    """Rows of a Parquet table as `read_table` gives them: a row whose text and binary values hold
    more than `cap` bytes together (the public line cap), or that has a reason in `reasons` (by
    position), becomes a row of nulls with its reason in `UNREADABLE` (added only when some row has
    one). `first_row` is the position of `df`'s first row in the file (rows are numbered from 1)."""
    reasons = dict(reasons or {})
    sizes = _text_bytes(df)
    if sizes is not None:
        over = sizes > cap
        if over.any():
            for r in over.arg_true().to_list():
                reasons.setdefault(
                    r,
                    f"row {first_row + r + 1:,} holds {sizes[r]:,} bytes of text, more than the cap of {cap:,} "
                    f"bytes ({_CAP_NAME})",
                )
    if not reasons:
        return df
    why: list[str | None] = [None] * df.height
    for r, text in reasons.items():
        why[r] = text
    keep = pl.Series([w is None for w in why], dtype=pl.Boolean)
    df = df.with_columns(pl.when(keep).then(pl.col(name)).alias(name) for name in df.columns)
    return df.with_columns(pl.Series(UNREADABLE, why, dtype=pl.String))


def parquet_frame(table: Any, cap: int = MAX_LINE_BYTES, first_row: int = 0) -> pl.DataFrame:
    """A pyarrow table read from Parquet as polars rows, totally: a row holding a text value that is
    not valid UTF-8 (in any column, an ignored one too) or more than `cap` bytes of text becomes a
    row of nulls with its reason in `UNREADABLE`, as a CSV line that cannot be read does; every
    other row is as polars reads it. `first_row`: the table's first row's position in the file."""
    import numpy as np
    import pyarrow as pa

    # polars' types for the file's columns (a pyarrow Table converts to a DataFrame, not a Series)
    target = cast(pl.DataFrame, pl.from_arrow(table.schema.empty_table())).schema
    bad: dict[int, str] = {}
    decode: list[str] = []
    for name in table.column_names:
        start = 0
        for chunk in table.column(name).chunks:
            rows, in_dictionary = _invalid_values(chunk)
            for r in rows:
                bad.setdefault(
                    start + r,
                    f"row {first_row + start + r + 1:,} holds a value in column '{name}' that is not valid UTF-8 text",
                )
            if in_dictionary and name not in decode:
                decode.append(name)
            start += len(chunk)
    for name in decode:  # polars never sees a bad dictionary entry, used by a row or not
        i = table.column_names.index(name)
        column = pa.chunked_array([c.dictionary_decode() for c in table.column(name).chunks])
        table = table.set_column(i, name, column)
    if bad:  # nor a bad value: those rows are nulls
        mask = np.zeros(table.num_rows, dtype=bool)
        mask[list(bad)] = True
        table = table.take(pa.array(np.arange(table.num_rows), mask=mask))
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    if decode:
        df = df.with_columns(pl.col(name).cast(target[name]) for name in decode)
    return capped_rows(df, cap, first_row, bad)


def _read_parquet(p: Path, fmt: TableFormat, cap: int) -> pl.DataFrame:
    """The whole Parquet file (row groups in order), read with pyarrow, whose reader leaves text
    unchecked, so that a value that is not UTF-8 fails its own row only (`parquet_frame`); polars'
    reader refuses the whole file for it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if fmt.compression:
            data, _ = _raw(p)
            table = pq.ParquetFile(pa.BufferReader(data)).read()
        else:
            table = pq.ParquetFile(p).read()
    except DataError:
        raise
    except Exception as exc:
        first = first_line(exc)
        raise DataError(
            f"Data file '{p}' does not parse as Parquet ({first}); write it again, or export it as CSV."
        ) from None
    if UNREADABLE in table.column_names:
        raise DataError(f"Data file '{p}' has a column named '{UNREADABLE}', a name privflow reserves.")
    return parquet_frame(table, cap)


def in_part(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """A folder's file's rows, their failing rows' reasons prefixed with the file's name."""
    if UNREADABLE not in df.columns:
        return df
    why = pl.col(UNREADABLE)
    return df.with_columns(pl.when(why.is_not_null()).then(pl.lit(f"file '{name}': ") + why).alias(UNREADABLE))


def as_folder_types(df: pl.DataFrame, dtypes: dict[str, pl.DataType]) -> pl.DataFrame:
    """A folder's file's rows with the folder's column order and common types (`_folder_schema`)."""
    extra = [UNREADABLE] if UNREADABLE in df.columns else []
    casts = [pl.col(n).cast(t) if df.schema[n] != t else pl.col(n) for n, t in dtypes.items()]
    return df.select([*casts, *extra])


def _read_folder(p: Path, cap: int) -> pl.DataFrame:
    """A folder's Parquet files, each read as `_read_parquet` reads one, in name order, as one
    table (columns checked to agree first: `_folder_schema`)."""
    dtypes = _folder_schema(p)
    frames = [
        as_folder_types(in_part(_read_parquet(part, TableFormat("parquet"), cap), part.name), dtypes)
        for part in table_parts(p)
    ]
    return pl.concat(frames, how="diagonal")


def read_table(path: str | Path, max_line_bytes: int | None = None) -> pl.DataFrame:
    """Read a CSV (every column as a string, empty field -> null) or Parquet file, gzipped or not.

    Total over rows (privacy rule 8): it raises DataError only for what the file's format and
    header decide (missing, not a table privflow reads, a header that does not parse, Parquet
    that does not parse); a CSV line that is not a row of the header's columns is kept as a row
    of nulls with the reason in the `UNREADABLE` column (present only when some row has one),
    which validation counts as a failing row. Each line is decoded on its own, and one longer
    than `max_line_bytes` (the schema's public `dataset.max_line_bytes`; default MAX_LINE_BYTES,
    1 MiB) is such a row, read in bounded memory: the CSV file is streamed, never held whole. In
    Parquet, a row with a text value that is not UTF-8, or with more text than the cap, is such a
    row too. A file with a header and no rows gives an empty frame: whether that stops a run is
    the validation gate's DP decision. The schema is not consulted here.

    A folder of Parquet files is read file by file, each as one Parquet file (a failing row's
    reason names its file), and concatenated in name order, once their columns were found to agree
    (`read_header`); a database URI is read as privflow/data/sources.py says, with the same
    semantics (every column as text).
    """
    cap = _cap(max_line_bytes)
    if is_database_uri(path):
        from privflow.data.sources import parse_source, read_database

        fmt, header, _ = read_header(path)
        return empty_strings_to_null(read_database(parse_source(path), header, cap))
    p = Path(path)
    fmt = sniff(p)
    if fmt.files is not None:
        return empty_strings_to_null(_read_folder(p, cap))
    df = _parse_csv(p, fmt, cap) if fmt.kind == "csv" else _read_parquet(p, fmt, cap)
    if df.width == 0:
        raise DataError(f"Data file '{p}' has no columns.")
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
