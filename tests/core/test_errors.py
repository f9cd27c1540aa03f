"""The wording helpers of privflow/core/errors.py: which failures are a full disk, and byte sizes."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from privflow.core.errors import byte_size, disk_full


def test_a_full_disk_is_found_anywhere_in_the_chain() -> None:
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(enospc) is enospc
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded")) is not None
    try:
        try:
            raise enospc
        except OSError as inner:
            raise RuntimeError("writing the table failed") from inner
    except RuntimeError as outer:
        assert disk_full(outer) is enospc
    sqlite_full = sqlite3.OperationalError("database or disk is full")
    assert disk_full(RuntimeError("(sqlite3.OperationalError) database or disk is full")) is not None
    assert disk_full(sqlite_full) is sqlite_full


def test_other_errors_are_not_a_full_disk() -> None:
    assert disk_full(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full(ValueError("no space in this name")) is None
    loop = RuntimeError("a")
    loop.__context__ = RuntimeError("b")
    loop.__context__.__context__ = loop  # a cycle ends the walk
    assert disk_full(loop) is None


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 bytes"),
        (999, "999 bytes"),
        (1_800, "1.8 kB"),
        (1_800_000, "1.8 MB"),
        (37.5e9, "37.5 GB"),
        (2e12, "2.0 TB"),
    ],
)
def test_byte_sizes_read_as_people_write_them(n: float, text: str) -> None:
    assert byte_size(n) == text
