"""Data fingerprints are keyed with a per-store secret (privacy/fingerprint.py): HMACs of a file's
bytes, and keyed digests of its parsed rows that neither the file's format, compression, text
encoding, line endings nor row order change."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from privflow.core.errors import DataError
from privflow.data.schema import Schema
from privflow.privacy.fingerprint import (
    digests_blob,
    digests_from_blob,
    found_in,
    keyed_fingerprint,
    row_digests,
    store_key,
    table_fingerprint,
    table_rows,
)


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


# -- keyed row digests --------------------------------------------------------------------------

ROWS = 200


@pytest.fixture(scope="module")
def adult_rows(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """200 Adult rows as a CSV file, the demo schema, a store key and the CSV's row digests."""
    tmp = tmp_path_factory.mktemp("rows")
    frame = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=ROWS)
    csv = tmp / "adult.csv"
    frame.write_csv(csv)
    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    key = store_key(tmp / "store")
    return {"tmp": tmp, "frame": frame, "csv": csv, "schema": schema, "key": key,
            "digests": row_digests(table_rows(csv, schema), key)}  # fmt: skip


def _gzip(r: dict, out: Path) -> None:
    out.write_bytes(gzip.compress(r["csv"].read_bytes()))


def _utf16(r: dict, out: Path) -> None:
    out.write_bytes(r["csv"].read_text().encode("utf-16"))  # with its byte-order mark


def _crlf(r: dict, out: Path) -> None:
    out.write_bytes(r["csv"].read_bytes().replace(b"\n", b"\r\n"))


def _reordered(r: dict, out: Path) -> None:
    r["frame"].sample(fraction=1.0, shuffle=True, seed=7).write_csv(out)


def _parquet_text(r: dict, out: Path) -> None:
    r["frame"].write_parquet(out)


def _parquet_typed(r: dict, out: Path) -> None:  # numbers as Int64 / Float64 columns, not text
    frame = r["frame"].with_columns(pl.col("age").cast(pl.Int64), pl.col("hours-per-week").cast(pl.Float64))
    frame.reverse().write_parquet(out)


@pytest.mark.parametrize(
    ("name", "write"),
    [
        ("adult.csv.gz", _gzip),
        ("adult-utf16.csv", _utf16),
        ("adult-crlf.csv", _crlf),
        ("adult-reordered.csv", _reordered),
        ("adult.parquet", _parquet_text),
        ("adult-typed.parquet", _parquet_typed),
    ],
)
def test_the_same_rows_give_the_same_digests_whatever_the_file(
    adult_rows: dict, name: str, write: Callable[[dict, Path], None]
) -> None:
    out = adult_rows["tmp"] / name
    write(adult_rows, out)
    assert out.read_bytes() != adult_rows["csv"].read_bytes()
    digests = row_digests(table_rows(out, adult_rows["schema"]), adult_rows["key"])
    assert len(digests) == ROWS
    assert sorted(digests.tolist()) == sorted(adult_rows["digests"].tolist())  # the same multiset
    key = adult_rows["key"]
    assert table_fingerprint(digests, key) == table_fingerprint(adult_rows["digests"], key)
    assert keyed_fingerprint(out, key) != keyed_fingerprint(adult_rows["csv"], key)  # the bytes' HMAC differs


def test_row_digests_are_keyed_and_tell_rows_apart(adult_rows: dict) -> None:
    typed = table_rows(adult_rows["csv"], adult_rows["schema"])
    digests, key = adult_rows["digests"], adult_rows["key"]
    assert digests.dtype == np.dtype("<u8") and len(set(digests.tolist())) == typed.unique().height
    other = row_digests(typed, store_key(adult_rows["tmp"] / "other-store"))
    assert not found_in(other, digests).any()  # another store's key: nothing in common
    changed = typed.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(41).otherwise(pl.col("age")).alias("age"))
    moved = row_digests(changed, key)
    assert typed["age"][0] != 41 and moved[0] != digests[0] and (moved[1:] == digests[1:]).all()
    assert table_fingerprint(moved, key) != table_fingerprint(digests, key)
    assert table_fingerprint(digests, key).startswith("blake2b-rows:")
    assert (digests_from_blob(digests_blob(digests)) == np.sort(digests)).all()  # stored sorted: no row order


def test_a_whole_number_is_one_value_as_an_integer_or_a_float() -> None:
    key = b"k" * 32
    as_int = pl.DataFrame({"a": [39, 0, None], "b": ["x", "y", "z"]})
    as_float = pl.DataFrame({"a": [39.0, -0.0, None], "b": ["x", "y", "z"]})
    assert (row_digests(as_int, key) == row_digests(as_float, key)).all()
    fraction = pl.DataFrame({"a": [39.5, 0.0, None], "b": ["x", "y", "z"]})
    assert (row_digests(fraction, key) != row_digests(as_float, key)).tolist() == [True, False, False]
    # a missing value is not the text of one, and a value does not run into the next column
    assert (
        row_digests(pl.DataFrame({"a": [None], "b": ["x"]}), key)[0]
        != row_digests(pl.DataFrame({"a": [""], "b": ["x"]}), key)[0]
    )
    assert (
        row_digests(pl.DataFrame({"a": ["x,"], "b": ["y"]}), key)[0]
        != row_digests(pl.DataFrame({"a": ["x"], "b": [",y"]}), key)[0]
    )


def test_charged_share_reads_whole_records_and_keyed_samples_alike() -> None:
    """A table whose first 60% of rows were charged: found 60% against the whole record, about 60%
    against a streamed run's keyed sample of it, and not at all where those rows are skipped."""
    from privflow.privacy.fingerprint import charged_share, sampled

    rng = np.random.default_rng(1)
    digests = rng.integers(0, np.iinfo(np.uint64).max, 100_000, dtype=np.uint64, endpoint=True)
    charged = digests[:60_000]
    empty = np.zeros(0, dtype="<u8")
    assert charged_share(digests, charged, empty) == pytest.approx(0.6)
    assert charged_share(digests, empty, sampled(charged)) == pytest.approx(0.6, abs=0.03)
    assert charged_share(digests, charged, empty, skip=np.arange(digests.size) < 60_000) == 0.0
    assert charged_share(digests[:10], empty, sampled(charged)) == 0.0  # too few of its rows in the sample
