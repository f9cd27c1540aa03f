"""Tables larger than memory: a Parquet file read in chunks, and row matrices kept on disk.

A streamed run (``privflow run --stream``; tasks/stream.py) never holds every row: it reads
the input Parquet file (or a folder of them, file after file) a row group batch at a time
(`parquet_chunks`) and writes what the
DP-SGD stages train on, the encoded rows, to `DiskRows` files. DP-SGD's Poisson sample is
then gathered from the file at each step (`DiskRows.__getitem__` maps the file only for the
gather, so that resident memory stays one batch, not the table), and the statistics,
selection and diagnostics read it in slices.

The files are private working data (encoded rows): they live in the run's curator folder and
are deleted when the run ends, failed or not (`scratch`); nothing in them is released.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from privflow.core.config import RunConfig
from privflow.core.errors import DataError, first_line
from privflow.core.source_uri import is_database_uri
from privflow.data.io import sniff
from privflow.data.schema import Schema

CHUNK_ROWS = 65_536  # rows per chunk read from the input (bounded memory per pass)


def parquet_chunks(
    path: str | Path, rows: int = CHUNK_ROWS, max_line_bytes: int | None = None
) -> Iterator[pl.DataFrame]:
    """The table's rows at most `rows` at a time, in file order, as `privflow.data.io.read_table`
    gives them (empty strings as nulls; a row with a text value that is not UTF-8, or with more text
    than the public line cap `max_line_bytes`, a failing row with its reason in `UNREADABLE`),
    without ever reading the whole file: polars reads only the row groups a slice needs (pyarrow's
    batch reader was much slower, and held more memory in its pool). A folder of Parquet files is
    read file after file in name order (a chunk never spans two files), with the folder's column
    order and common types, a failing row's reason naming its file, as `read_table` reads it."""
    from privflow.data.io import MAX_LINE_BYTES, as_folder_types, in_part, read_header

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    cap = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    p = Path(path)
    if not p.is_dir():
        yield from _file_chunks(p, rows, cap)
        return
    _, _, dtypes = read_header(p)  # the files' columns agree (else a DataError before any row)
    assert dtypes is not None
    for part in _parts(p):
        for chunk in _file_chunks(part, rows, cap):
            yield as_folder_types(in_part(chunk, part.name), dtypes)


def _parts(path: Path) -> list[Path]:
    from privflow.data.io import table_parts

    return table_parts(path)


def _file_chunks(path: Path, rows: int, cap: int) -> Iterator[pl.DataFrame]:
    from privflow.data.io import empty_strings_to_null

    total = _file_rows(path)
    scan = pl.scan_parquet(path)
    for offset in range(0, total, rows):
        yield empty_strings_to_null(_chunk(path, scan, offset, rows, cap))


def _chunk(path: Path, scan: pl.LazyFrame, offset: int, rows: int, cap: int) -> pl.DataFrame:
    """Rows [offset, offset + rows) checked as `read_table` checks them. polars refuses a row group
    that holds text that is not UTF-8: those rows are then read with pyarrow (which leaves text
    unchecked) so that such a value fails its own row only; both ways give every other row alike."""
    from privflow.data.io import capped_rows, parquet_frame

    try:
        frame = scan.slice(offset, rows).collect()
    except Exception as exc:  # polars raises several types for a bad file
        text = str(exc).lower()
        if "utf-8" not in text and "utf8" not in text:
            raise _refusal(path, exc) from None
        return _parquet(path, lambda: parquet_frame(_arrow_rows(path, offset, rows), cap, offset))
    return capped_rows(frame, cap, offset)


def _arrow_rows(path: Path, offset: int, rows: int) -> Any:
    """Rows [offset, offset + rows) as a pyarrow table, reading only the row groups that hold them."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path)
    groups: list[int] = []
    first = start = 0
    for g in range(meta.metadata.num_row_groups):
        n = meta.metadata.row_group(g).num_rows
        if start + n > offset and start < offset + rows:
            first = start if not groups else first
            groups.append(g)
        start += n
    return meta.read_row_groups(groups).slice(offset - first, rows)


def parquet_rows(path: str | Path) -> int:
    """The number of rows a Parquet file's footer records, summed over a folder's files (read
    without the data; shown to the curator as the progress total, never released)."""
    p = Path(path)
    return sum(_file_rows(part) for part in _parts(p)) if p.is_dir() else _file_rows(p)


def _file_rows(path: Path) -> int:
    return int(_parquet(path, lambda: pl.scan_parquet(path).select(pl.len()).collect().item()))


def _parquet(path: Path, read: Any) -> Any:
    """`read()`, with a file that does not parse as Parquet reported as a DataError."""
    try:
        return read()
    except Exception as exc:  # polars raises several types for a bad file
        raise _refusal(path, exc) from None


def _refusal(path: Path, exc: Exception) -> DataError:
    first = first_line(exc)
    return DataError(f"Data file '{path}' does not parse as Parquet ({first}); write it again.")


class DiskRows:
    """A float32 [n, d] matrix in a file, appended to chunk by chunk and read back by slices or
    by row indices. Enough of an array for the trainer (``shape``, ``len``, ``x[idx]``) and the
    chunked readers (``x[a:b]``); every read returns a numpy copy."""

    def __init__(self, path: Path, columns: int) -> None:
        if columns < 0:
            raise ValueError(f"columns must be >= 0, got {columns}")
        self.path = Path(path)
        self.columns = int(columns)
        self.rows = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # private working data: readable by the owner only (as the curator folder is)
        fd = os.open(self.path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        os.close(fd)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.columns)

    @property
    def dtype(self) -> Any:
        import torch

        return torch.float32

    def __len__(self) -> int:
        return self.rows

    def append(self, block: np.ndarray) -> None:
        """Add rows [k, d] at the end."""
        block = np.ascontiguousarray(block, dtype=np.float32)
        if block.ndim != 2 or block.shape[1] != self.columns:
            raise ValueError(f"rows must be [k, {self.columns}], got {block.shape}")
        with open(self.path, "ab") as f:
            block.tofile(f)
        self.rows += block.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        """Rows by a slice (read sequentially) or by an index array / tensor (positioned reads of
        those rows only, so the table never becomes resident)."""
        if isinstance(key, slice):
            start, stop, step = key.indices(self.rows)
            if step != 1:
                raise IndexError("DiskRows slices take step 1")
            count = max(0, stop - start)
            if count == 0 or self.columns == 0:
                return np.zeros((count, self.columns), dtype=np.float32)
            out = np.fromfile(self.path, dtype=np.float32, count=count * self.columns, offset=start * self.columns * 4)
            return out.reshape(count, self.columns)
        idx = np.asarray(key.cpu().numpy() if hasattr(key, "cpu") else key, dtype=np.int64)
        if idx.ndim != 1:
            raise IndexError(f"DiskRows takes a slice or a 1-D index array, got shape {idx.shape}")
        if idx.size and (idx.min() < -self.rows or idx.max() >= self.rows):
            raise IndexError(f"row index out of range for {self.rows} rows")
        if idx.size == 0 or self.rows == 0 or self.columns == 0:
            return np.zeros((idx.size, self.columns), dtype=np.float32)
        return self._gather(np.where(idx < 0, idx + self.rows, idx))

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        """Rows by index, one positioned read each (in file order), into fresh memory. Not a
        memory map: a page fault on a mapping brings in its neighbours too (fault-around,
        readahead), and mapped file pages count in the resident set: gathering one batch of a
        large table through a mapping raises peak RSS by far more than the batch's own rows."""
        width = self.columns * 4
        order = np.argsort(idx, kind="stable")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = b"".join([os.pread(fd, width, int(r) * width) for r in idx[order]])
        finally:
            os.close(fd)
        if len(data) != width * idx.size:
            raise OSError(f"{self.path} is shorter than its {self.rows} rows: was it changed while in use?")
        out = np.empty((idx.size, self.columns), dtype=np.float32)
        out[order] = np.frombuffer(data, dtype=np.float32).reshape(idx.size, self.columns)
        return out


def streamed(config: RunConfig, schema: Schema) -> bool:
    """Whether the run reads its table in chunks: `stream.enabled`, or with "auto" a Parquet
    input (a file or a folder) whose schema expects more than `stream.auto_rows` rows (public: no
    row is read). A database source is read whole with "auto" (streaming one is refused in pre-flight)."""
    if config.stream.enabled != "auto":
        return bool(config.stream.enabled)
    if is_database_uri(config.data):
        return False
    expected = schema.dataset.expected_rows or 0
    fmt = sniff(config.data)
    return expected > config.stream.auto_rows and fmt.kind == "parquet" and fmt.compression is None


@contextmanager
def scratch(folder: Path) -> Iterator[Path]:
    """A private working folder that is removed when the block ends, however it ends."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["CHUNK_ROWS", "DiskRows", "parquet_chunks", "parquet_rows", "scratch", "streamed"]
