"""Neighbouring tables through the reader (privacy rule 8): each line is decoded on its own, a line
has a public size cap, and one Parquet value that is not text fails its own row only. For each
case a table D (2,000 rows, a small schema) and D plus one bad row must give the validation gate
pairs (failing, passing) that differ by one failing row and clean rows that are D's, in CSV, gzip,
UTF-16 and Parquet; `privflow check` names each such row's reason."""

from __future__ import annotations

import codecs
import gzip
import tracemalloc
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from privflow.data.chunked import parquet_chunks
from privflow.data.io import MAX_LINE_BYTES, UNREADABLE, count_rows, read_table
from privflow.data.schema import DatasetInfo, Schema
from privflow.data.validation import validate, validate_chunks

ROWS = 2000
FFFD_ROWS = 600  # rows of D whose ignored `note` holds a valid U+FFFD character
CAP = 4096  # a small line cap for the cap's cases (the default is 1 MiB)
SCHEMA = {
    "dataset": {"name": "reader", "expected_rows": ROWS},
    "columns": [
        {"name": "id", "type": "integer", "bounds": [0, 100_000]},
        {"name": "score", "type": "numeric", "bounds": [0, 100]},
        {"name": "note", "type": "ignore"},
    ],
}


def _schema(cap: int | None = None) -> Schema:
    doc = yaml.safe_load(yaml.safe_dump(SCHEMA))
    if cap is not None:
        doc["dataset"]["max_line_bytes"] = cap
    return Schema.model_validate(doc)


def _notes() -> list[str | None]:
    out: list[str | None] = []
    for i in range(ROWS):
        if i % 3 == 1 and i % 5 == 0:
            out.append(None)  # an empty field: a null
        elif i < 3 * FFFD_ROWS and i % 3 == 0:
            out.append(f"r\ufffd{i}")  # valid UTF-8 (EF BF BD): a character like any other
        else:
            out.append(f"plain {i}")
    assert sum(1 for n in out if n and "\ufffd" in n) == FFFD_ROWS
    return out


def _text_d() -> str:
    lines = ["id,score,note"]
    lines += [f"{i},{i % 100}.5,{note or ''}" for i, note in enumerate(_notes())]
    return "\n".join(lines) + "\n"


def _gate(path: Path, schema: Schema) -> tuple[pl.DataFrame, tuple[int, int], list[str]]:
    """The clean rows, the gate's (failing, passing) and the reader's reasons, as a run has them."""
    seen: list[tuple[int, int]] = []
    df = read_table(path, max_line_bytes=schema.dataset.max_line_bytes)
    reasons = df.get_column(UNREADABLE).drop_nulls().to_list() if UNREADABLE in df.columns else []
    clean, _ = validate(df, schema, "strict", None, gate=lambda f, p: seen.append((f, p)) or False)
    assert len(seen) == 1
    return clean, seen[0], reasons


def _neighbours(d: Path, d_plus: Path, schema: Schema) -> list[str]:
    """D passes whole; D + one bad row is D plus one failing row (the gate's pair moves by one, the
    clean rows are D's). The bad row's reasons."""
    clean_d, pair_d, reasons_d = _gate(d, schema)
    clean, pair, reasons = _gate(d_plus, schema)
    assert pair_d == (0, ROWS) and reasons_d == []
    assert pair == (1, ROWS), reasons[:3]
    assert clean.equals(clean_d)
    assert len(reasons) == 1
    return reasons


def _write(path: Path, data: bytes, gz: bool) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, compresslevel=1)
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- UTF-8: U+FFFD is a character


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_byte_that_is_not_utf8_fails_its_own_line_and_not_the_rows_holding_fffd(tmp_path: Path, gz: bool) -> None:
    d = _text_d().encode()
    bad = b"2000,7.5,bad \xff byte\n"
    reasons = _neighbours(_write(tmp_path / "d.csv", d, gz), _write(tmp_path / "d1.csv", d + bad, gz), _schema())
    assert reasons[0].startswith(f"line {ROWS + 2} holds bytes that are not valid UTF-8 text")


def test_fffd_rows_read_as_they_are_beside_an_undecodable_line(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(_text_d().encode() + b"1,2,\xc3\x28\n")
    df = read_table(p)
    assert df.height == ROWS + 1 and df.get_column(UNREADABLE).null_count() == ROWS
    assert df.get_column("note").str.contains("\ufffd", literal=True).sum() == FFFD_ROWS


# ----------------------------------------------------------------------------- UTF-16: one line per line


def _utf16(text: str, bo: str) -> tuple[bytes, bytes]:
    """UTF-16 bytes of `text` with a byte-order mark, and the encoding's newline."""
    codec = f"utf-16-{bo}"
    bom = codecs.BOM_UTF16_LE if bo == "le" else codecs.BOM_UTF16_BE
    return bom + text.encode(codec), "\n".encode(codec)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("bo", ["le", "be"])
@pytest.mark.parametrize("stray", [b"A", b"\n", b"\x00", b"\x00\x00\x00"], ids=["A", "LF", "NUL", "3NUL"])
def test_a_utf16_line_of_an_odd_byte_count_fails_alone(tmp_path: Path, bo: str, gz: bool, stray: bytes) -> None:
    """A line with an odd number of bytes after 100 rows: it fails, and every later row reads as
    before (at even offsets only, every later line would be read a byte off)."""
    lines = _text_d().split("\n")
    d, newline = _utf16("\n".join(lines), bo)
    odd = "2000,7.5,odd".encode(f"utf-16-{bo}") + stray
    assert len(odd) % 2 == 1 and newline not in odd
    plus, _ = _utf16("\n".join(lines[:101]) + "\n", bo)
    plus += odd + newline + "\n".join(lines[101:]).encode(f"utf-16-{bo}")
    reasons = _neighbours(_write(tmp_path / "d.csv", d, gz), _write(tmp_path / "d1.csv", plus, gz), _schema())
    assert reasons == [f"line 102 has an odd number of bytes ({len(odd)}), so it is not UTF-16 text"]


def test_a_utf16_line_that_does_not_decode_fails_alone(tmp_path: Path) -> None:
    lines = _text_d().split("\n")
    d, newline = _utf16("\n".join(lines), "le")
    plus, _ = _utf16("\n".join(lines[:101]) + "\n", "le")
    plus += "2000,7.5,".encode("utf-16-le") + b"\x00\xdc" + newline + "\n".join(lines[101:]).encode("utf-16-le")
    reasons = _neighbours(_write(tmp_path / "d.csv", d, False), _write(tmp_path / "d1.csv", plus, False), _schema())
    assert reasons[0].startswith("line 102 holds bytes that are not valid UTF-16 text")


def test_utf16_crlf_and_the_documented_split_at_an_odd_offset(tmp_path: Path) -> None:
    """The rule: a line ends at the first newline code unit's bytes at ANY offset. A valid line
    holding them at an odd offset (LE: U+0A95 then U+4E00 is 95 0A 00 4E) is split there into two
    lines of an odd byte count: two failing rows, each decided by its own bytes."""
    p = tmp_path / "t.csv"
    p.write_bytes(codecs.BOM_UTF16_LE + "a,b\r\n1,\u0a95\u4e00\r\n2,ok\r\n".encode("utf-16-le"))
    df = read_table(p)
    assert df.height == 3 and df.row(2)[:2] == ("2", "ok")
    assert [r.split(" has")[0] for r in df.get_column(UNREADABLE).to_list()[:2]] == ["line 2", "line 3"]
    p.write_bytes(codecs.BOM_UTF16_BE + "a,b\r\n1,\u4e00\u0a95x\r\n2,ok\r\n".encode("utf-16-be"))
    assert read_table(p).get_column(UNREADABLE).is_not_null().to_list() == [True, True, False]


# ----------------------------------------------------------------------------- Parquet: a value, a row


def _strings(values: list[bytes | None]) -> pa.Array:
    """A Parquet-bound string column holding exactly these bytes (pyarrow does not check them here)."""
    data = b"".join(v or b"" for v in values)
    offsets = np.cumsum([0] + [len(v or b"") for v in values]).astype(np.int32)
    validity = pa.array([v is not None for v in values]).buffers()[1]
    return pa.Array.from_buffers(
        pa.string(), len(values), [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    )


def _parquet(path: Path, extra: list[tuple[int, float, bytes | None]], gz: bool = False) -> Path:
    notes = [None if n is None else n.encode() for n in _notes()] + [n for _, _, n in extra]
    table = pa.table(
        {
            "id": pa.array(list(range(ROWS)) + [i for i, _, _ in extra], pa.int64()),
            "score": pa.array([i % 100 + 0.5 for i in range(ROWS)] + [s for _, s, _ in extra], pa.float64()),
            "note": _strings(notes),
        }
    )
    pq.write_table(table, path, row_group_size=256)
    if gz:
        gzipped = path.with_name(path.name + ".gz")
        gzipped.write_bytes(gzip.compress(path.read_bytes()))
        return gzipped
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_one_parquet_value_that_is_not_utf8_fails_its_own_row(tmp_path: Path, gz: bool) -> None:
    d = _parquet(tmp_path / "d.parquet", [], gz)
    plus = _parquet(tmp_path / "d1.parquet", [(2000, 7.5, b"bad \xff value")], gz)
    reasons = _neighbours(d, plus, _schema())
    assert reasons == [f"row {ROWS + 1:,} holds a value in column 'note' that is not valid UTF-8 text"]


def test_a_bad_parquet_value_in_the_middle_of_a_row_group_fails_its_row_only(tmp_path: Path) -> None:
    notes: list[bytes | None] = [f"n{i}".encode() if i % 7 else None for i in range(1000)]
    notes[300] = b"\xc3("  # row group 2 of 4 (256 rows each)
    pq.write_table(pa.table({"id": pa.array(range(1000)), "note": _strings(notes)}), tmp_path / "t.pq", 256)
    df = read_table(tmp_path / "t.pq")
    assert df.height == 1000 and df.get_column(UNREADABLE).to_list().count(None) == 999
    assert df.row(300) == (None, None, "row 301 holds a value in column 'note' that is not valid UTF-8 text")
    assert df.get_column("id").to_list()[:300] == list(range(300)) and df.row(302)[:2] == (302, "n302")
    assert df.get_column("note").null_count() == 1 + sum(1 for i in range(1000) if i % 7 == 0)


def test_parquet_chunks_fail_the_same_row_as_read_table(tmp_path: Path) -> None:
    """A streamed run reads Parquet in chunks: the same rows fail, with the same reasons, and the
    gate's totals move by one."""
    schema = _schema(CAP)
    for extra, want in (([], 0), ([(2000, 7.5, b"bad \xff value")], 1), ([(2001, 7.5, b"y" * (CAP + 1))], 1)):
        path = _parquet(tmp_path / f"t{len(extra)}{want}.parquet", extra)
        whole = read_table(path, max_line_bytes=CAP)
        chunks = list(parquet_chunks(path, 300, max_line_bytes=CAP))
        assert sum(c.height for c in chunks) == whole.height
        reasons = [r for c in chunks if UNREADABLE in c.columns for r in c.get_column(UNREADABLE).drop_nulls()]
        assert reasons == (whole.get_column(UNREADABLE).drop_nulls().to_list() if want else [])
        assert _chunked_gate(chunks, schema) == (want, ROWS)


def _chunked_gate(chunks: list[pl.DataFrame], schema: Schema) -> tuple[int, int]:
    seen: list[tuple[int, int]] = []
    report = validate_chunks(chunks, schema, "strict", None, lambda f, p: seen.append((f, p)) or False, lambda _: None)
    assert len(seen) == 1 and report.failing_rows == seen[0][0]
    return seen[0]


def test_a_dictionary_entry_that_is_not_utf8_fails_the_rows_that_use_it(tmp_path: Path) -> None:
    words = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, None, 1, 0], pa.int32()), _strings([b"ok", b"\xff"]))
    pq.write_table(pa.table({"id": pa.array(range(6)), "w": words}), tmp_path / "d.parquet")
    df = read_table(tmp_path / "d.parquet")
    assert df.get_column(UNREADABLE).is_not_null().to_list() == [False, True, False, False, True, False]
    assert df.get_column("w").cast(pl.String).to_list() == ["ok", None, "ok", None, None, "ok"]
    assert df.get_column("id").to_list() == [0, None, 2, 3, None, 5]
    unused = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), _strings([b"ok", b"\xff"]))
    pq.write_table(pa.table({"w": unused}), tmp_path / "u.parquet")
    df = read_table(tmp_path / "u.parquet")  # a bad entry no row uses: nothing fails, polars never sees it
    assert df.columns == ["w"] and df.get_column("w").cast(pl.String).to_list() == ["ok", "ok"]


# ----------------------------------------------------------------------------- the line cap


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_line_longer_than_the_cap_fails_alone(tmp_path: Path, gz: bool) -> None:
    d = _text_d().encode()
    long = b"2000,7.5," + b"x" * (3 * CAP) + b"\n"
    reasons = _neighbours(_write(tmp_path / "d.csv", d, gz), _write(tmp_path / "d1.csv", d + long, gz), _schema(CAP))
    assert reasons == [f"line {ROWS + 2} is longer than the cap of {CAP:,} bytes (dataset.max_line_bytes)"]


def test_the_cap_counts_a_lines_bytes_without_its_line_ending(tmp_path: Path) -> None:
    head = b"a,b\n"
    exact = b"1," + b"x" * (CAP - 2)
    p = tmp_path / "t.csv"
    p.write_bytes(head + exact + b"\r\n" + exact + b"y\n" + exact + b"\n" + exact + b"yy")
    df = read_table(p, max_line_bytes=CAP)
    assert df.get_column(UNREADABLE).is_not_null().to_list() == [False, True, False, True]
    assert df.get_column("b").str.len_bytes().to_list() == [CAP - 2, None, CAP - 2, None]
    assert count_rows(p, max_line_bytes=CAP) == 4
    with pytest.raises(Exception, match="header line that is longer than the cap"):
        read_table(p, max_line_bytes=2)


def test_a_parquet_row_with_more_text_than_the_cap_fails_alone(tmp_path: Path) -> None:
    d = _parquet(tmp_path / "d.parquet", [])
    plus = _parquet(tmp_path / "d1.parquet", [(2000, 7.5, b"y" * (CAP + 1))])
    reasons = _neighbours(d, plus, _schema(CAP))
    assert reasons == [
        f"row 2,001 holds {CAP + 1:,} bytes of text, more than the cap of {CAP:,} bytes (dataset.max_line_bytes)"
    ]


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_an_over_long_line_is_read_in_bounded_memory(tmp_path: Path, gz: bool) -> None:
    """A 64 MB line is streamed past, never held: the reader's peak is a few chunks, not the line."""
    size = 64 << 20
    p = tmp_path / ("big.csv.gz" if gz else "big.csv")
    with gzip.open(p, "wb", compresslevel=1) if gz else p.open("wb") as fh:
        fh.write(b"a,b\n1,2\n3,")
        block = b"x" * (1 << 20)
        for _ in range(size >> 20):
            fh.write(block)
        fh.write(b"\n4,5\n")
    del block
    tracemalloc.start()
    try:
        df = read_table(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert df.get_column(UNREADABLE).to_list() == [
        None,
        f"line 3 is longer than the cap of {MAX_LINE_BYTES:,} bytes (dataset.max_line_bytes)",
        None,
    ]
    assert df.select("a", "b").rows() == [("1", "2"), (None, None), ("4", "5")]
    assert peak < size // 8, peak  # 8 MiB: a few chunks of 1 MiB, never the 64 MiB line


def test_the_cap_is_a_public_schema_field_with_the_readers_default() -> None:
    assert DatasetInfo(name="x").max_line_bytes == MAX_LINE_BYTES == 1_048_576
    assert _schema(CAP).dataset.max_line_bytes == CAP
    with pytest.raises(ValueError, match="max_line_bytes"):
        _schema(0)


# ----------------------------------------------------------------------------- `privflow check` says why


@pytest.mark.usefixtures("cli_process_state")
def test_check_names_each_reason(tmp_path: Path) -> None:
    from privflow.cli import app

    spec = tmp_path / "schema.yaml"
    doc = yaml.safe_load(yaml.safe_dump(SCHEMA))
    doc["dataset"]["max_line_bytes"] = CAP
    spec.write_text(yaml.safe_dump(doc))
    d = _text_d().encode()
    cases = {
        "utf8.csv": (d + b"2000,7.5,bad \xff byte\n", f"line {ROWS + 2} holds bytes that are not valid UTF-8 text"),
        "long.csv": (d + b"2000,7.5," + b"x" * (2 * CAP) + b"\n", f"line {ROWS + 2} is longer than the cap of 4,096"),
        "bad.parquet": (None, "row 2,001 holds a value in column 'note' that is not valid UTF-8 text"),
    }
    for name, (data, reason) in cases.items():
        path = tmp_path / name
        if data is None:
            _parquet(path, [(2000, 7.5, b"bad \xff value")])
        else:
            path.write_bytes(data)
        result = CliRunner().invoke(app, ["check", "--data", str(path), "--schema", str(spec)])
        out = " ".join(result.output.split())
        assert result.exit_code == 3, result.output
        assert f"{ROWS + 1:,} rows read, {ROWS:,} pass, 1 fail" in out, out
        assert "rows [unreadable]: 1 row" in out and reason in out, out
