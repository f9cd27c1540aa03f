"""Data fingerprints are keyed HMACs with a per-store secret (privacy/fingerprint.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from privflow.core.errors import DataError
from privflow.privacy.fingerprint import keyed_fingerprint, store_key


def test_same_file_same_key_same_fingerprint_and_not_a_plain_hash(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a.csv", "b.csv", "c.csv"))
    a.write_text("x,y\n1,2\n")
    b.write_text("x,y\n1,3\n")
    c.write_text("x,y\n1,2\n")
    key = store_key(tmp_path / "store")
    assert keyed_fingerprint(a, key) == keyed_fingerprint(c, key) != keyed_fingerprint(b, key)
    assert hashlib.sha256(a.read_bytes()).hexdigest() not in keyed_fingerprint(a, key)


def test_the_key_is_secret_per_store_and_kept(tmp_path: Path) -> None:
    f = tmp_path / "a.csv"
    f.write_text("x\n1\n")
    k1, k2 = store_key(tmp_path / "s1"), store_key(tmp_path / "s2")
    assert k1 != k2 and len(k1) >= 32
    assert keyed_fingerprint(f, k1) != keyed_fingerprint(f, k2)  # a guess cannot be checked without the key
    assert store_key(tmp_path / "s1") == k1  # the same store keeps its key
    key_file = tmp_path / "s1" / "secret" / "fingerprint.key"
    assert key_file.stat().st_mode & 0o077 == 0


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError):
        keyed_fingerprint(tmp_path / "missing.csv", store_key(tmp_path / "s"))
