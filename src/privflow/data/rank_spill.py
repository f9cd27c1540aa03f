"""Occurrence ranks of a table read in chunks, with memory that does not grow with the table.

A streamed run (tasks/stream.py) needs each clean row's occurrence rank
(`privflow.data.row_hash.occurrence_ranks`: how many earlier rows equal it) while it encodes the
rows, chunk by chunk, to split them by `privflow.data.row_hash.row_units`. Counting the distinct
rows seen so far in memory costs 24 bytes per distinct row (77 MB at 3.2M rows, 2.4 GB at
100M), so the counting is done on disk, as a hash join does it (Grace hash partitioning):

1. `record`, in the validation pass: each clean row's 128-bit key (two salted row hashes,
   `row_keys`) and its position go to one of P partition files, chosen by the key's mixed top
   bits, so that equal rows land in the same file, in table order.
2. `finish` (on the first `ranks`): each partition file is read alone, its rows' ranks are
   counted by a stable sort on the key, and only the non-zero ranks (the second and later
   copies of a row) are written back with their positions, in table order.
3. `ranks`, in the encoding pass: a chunk's ranks are the non-zero ones whose positions fall
   in it (every partition is read forward, a block at a time), zero elsewhere.

P is a power of two chosen from the input's row count so that a partition holds about
`PARTITION_ROWS` rows; resident memory is then one partition's sort plus one block per
partition, whatever the table's size. On disk: 24 bytes per clean row until `finish`, then 16
per later copy of a row. The ranks are the same whatever P is (and the same as
`occurrence_ranks` of the whole table unless two distinct rows share all 128 bits), so the
row count, which the curator's process reads from the file footer, decides only memory.

Both passes must see the same clean rows: each `record` call leaves the number of rows and
an XOR of their keys, and `ranks` refuses a chunk that does not match (the input file changed
between the passes). The files are private working data (keys of private rows) in the run's
curator scratch folder, removed with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from privflow.core.errors import DataError
from privflow.data.row_hash import mix64, row_keys

PARTITION_ROWS = 1 << 19  # rows per partition file, about 30 MB while its ranks are counted
MAX_PARTITIONS = 256  # files open at once in the encoding pass
BLOCK_ROWS = 1 << 14  # (position, rank) pairs read from a partition at a time

_RECORD = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("at", "<u8")])
_RANKED = np.dtype([("at", "<u8"), ("rank", "<u8")])


def partitions_for(rows: int) -> int:
    """The number of partition files for about `rows` rows: a power of two, 1 to MAX_PARTITIONS."""
    want = max(1, -(-int(rows) // PARTITION_ROWS))
    return min(MAX_PARTITIONS, 1 << (want - 1).bit_length())


class SpilledRanks:
    """`occurrence_ranks` of a table read twice in the same chunks (module docstring):
    `record` every chunk of the first pass, then `ranks` every chunk of the second."""

    def __init__(self, folder: Path, rows: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.partitions = partitions_for(rows)
        self._shift = np.uint64(64 - max(1, self.partitions.bit_length() - 1))
        self._recorded: list[tuple[int, bytes]] = []  # (rows, XOR of keys) per record call
        self._rows = 0
        self._served = 0  # chunks and rows handed out by `ranks`
        self._position = 0
        self._cursors: list[_Cursor] | None = None

    def _path(self, part: int, kind: str) -> Path:
        return self.folder / f"{kind}-{part:04d}.bin"

    def _part(self, keys: np.ndarray) -> np.ndarray:
        if self.partitions == 1:
            return np.zeros(len(keys), dtype=np.int64)
        return (mix64(keys[:, 0]) >> self._shift).astype(np.int64)

    def record(self, chunk: pl.DataFrame) -> None:
        """First pass: note the chunk's rows (in table order) in their partition files."""
        if self._cursors is not None:
            raise RuntimeError("record() after ranks(): the first pass is over")
        keys = row_keys(chunk)
        self._recorded.append((len(keys), _digest(keys)))
        if not len(keys):
            return
        rec = np.empty(len(keys), dtype=_RECORD)
        rec["k0"], rec["k1"] = keys[:, 0], keys[:, 1]
        rec["at"] = np.arange(self._rows, self._rows + len(keys), dtype=np.uint64)
        self._rows += len(keys)
        part = self._part(keys)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        for p in range(self.partitions):
            if bounds[p] < bounds[p + 1]:
                with open(self._path(p, "keys"), "ab", opener=_private) as f:
                    rec[order[bounds[p] : bounds[p + 1]]].tofile(f)

    def finish(self) -> None:
        """Between the passes: each partition's non-zero ranks, in table order (step 2)."""
        if self._cursors is not None:
            return
        for p in range(self.partitions):
            path = self._path(p, "keys")
            rec = np.fromfile(path, dtype=_RECORD) if path.exists() else np.zeros(0, dtype=_RECORD)
            ranked = _nonzero_ranks(rec)
            with open(self._path(p, "ranks"), "wb", opener=_private) as f:
                ranked.tofile(f)
            del rec
            path.unlink(missing_ok=True)
        self._cursors = [_Cursor(self._path(p, "ranks")) for p in range(self.partitions)]

    def ranks(self, chunk: pl.DataFrame) -> np.ndarray:
        """Second pass: the chunk's ranks in the whole table; chunks must come as recorded."""
        self.finish()
        assert self._cursors is not None
        keys = row_keys(chunk)
        if self._served >= len(self._recorded) or self._recorded[self._served] != (len(keys), _digest(keys)):
            self.close()
            raise DataError(
                "The data file's clean rows differ between the validation pass and the encoding pass "
                f"(at chunk {self._served + 1}): was the file changed while the run read it? "
                "The mechanisms that ran on the first pass (the validation gate and the DP statistics read "
                "there) stay charged in the ledger (`privflow ledger show`); nothing else was spent. "
                "Run again on a file nothing writes to."
            )
        self._served += 1
        start, stop = self._position, self._position + len(keys)
        self._position = stop
        out = np.zeros(len(keys), dtype=np.uint64)
        for cursor in self._cursors:
            at, rank = cursor.take_below(stop)
            out[(at - start).astype(np.int64)] = rank
        return out

    def close(self) -> None:
        """Close the partition files (the folder goes with the run's scratch)."""
        for cursor in self._cursors or []:
            cursor.close()


def _nonzero_ranks(rec: np.ndarray) -> np.ndarray:
    """(position, rank) of the rows with rank > 0, in position order, from one partition's
    records (in position order): a stable sort by key keeps each key's copies in table order."""
    if not len(rec):
        return np.zeros(0, dtype=_RANKED)
    order = np.lexsort((rec["k1"], rec["k0"]))  # stable: equal keys stay in table order
    k0, k1 = rec["k0"][order], rec["k1"][order]
    new = np.ones(len(rec), dtype=bool)
    new[1:] = (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])
    idx = np.arange(len(rec))
    starts = np.maximum.accumulate(np.where(new, idx, 0))
    rank = (idx - starts).astype(np.uint64)
    dup = rank > 0
    out = np.empty(int(dup.sum()), dtype=_RANKED)
    out["at"], out["rank"] = rec["at"][order[dup]], rank[dup]
    return out[np.argsort(out["at"], kind="stable")]


def _digest(keys: np.ndarray) -> bytes:
    return np.bitwise_xor.reduce(keys, axis=0).tobytes() if len(keys) else b""


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)  # keys of private rows: readable by the owner only


class _Cursor:
    """One partition's (position, rank) pairs, read forward a block at a time."""

    def __init__(self, path: Path) -> None:
        self._file: BinaryIO = open(path, "rb")  # noqa: SIM115 - held for the encoding pass, closed by close()
        self._block = np.zeros(0, dtype=_RANKED)

    def take_below(self, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The pairs whose position is below `stop` (all earlier ones already taken)."""
        parts: list[np.ndarray] = []
        while True:
            if not len(self._block):
                self._block = np.fromfile(self._file, dtype=_RANKED, count=BLOCK_ROWS)
                if not len(self._block):
                    break
            cut = int(np.searchsorted(self._block["at"], np.uint64(stop)))
            parts.append(self._block[:cut])
            self._block = self._block[cut:]
            if len(self._block):
                break
        got = np.concatenate(parts) if parts else np.zeros(0, dtype=_RANKED)
        return got["at"], got["rank"]

    def close(self) -> None:
        self._file.close()


__all__ = ["BLOCK_ROWS", "MAX_PARTITIONS", "PARTITION_ROWS", "SpilledRanks", "partitions_for"]
