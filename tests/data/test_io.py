"""privflow.data.io: reading CSV/Parquet as the validator expects it, writing, fingerprinting."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privflow.core.errors import DataError
from privflow.data.io import UNREADABLE, count_rows, read_header, read_table, sniff, write_table

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_adult_csv_is_read_as_strings_with_missing_as_null() -> None:
    df = read_table(DEMO / "adult_train.csv")
    assert df.shape == (32561, 15)
    assert all(dtype == pl.String for dtype in df.schema.values())
    # the publisher's '?' markers, written as empty fields in the demo file
    nulls = df.null_count().row(0, named=True)
    assert (nulls["workclass"], nulls["occupation"], nulls["native-country"]) == (1836, 1843, 583)
    assert nulls["age"] == 0
    assert df["age"][0] == "39" and df["income"][1] == "<=50K"


def test_empty_and_quoted_empty_fields_are_null(tmp_path: Path) -> None:
    p = _write(tmp_path / "t.csv", 'a,b,c\n1,,x\n"",2,""\n')
    df = read_table(p)
    assert df.to_dicts() == [{"a": "1", "b": None, "c": "x"}, {"a": None, "b": "2", "c": None}]


def test_numbers_stay_text_so_validation_sees_them(tmp_path: Path) -> None:
    df = read_table(_write(tmp_path / "t.csv", "a,b\n007,1.50\nabc,2\n"))
    assert df["a"].to_list() == ["007", "abc"] and df["b"].to_list() == ["1.50", "2"]


def test_blank_lines_are_not_rows_and_bom_is_ignored(tmp_path: Path) -> None:
    p = _write(tmp_path / "t.csv", b"\xef\xbb\xbfa,b\r\n1,2\r\n\r\n3,4\r\n\r\n")
    df = read_table(p)
    assert df.columns == ["a", "b"]
    assert df.to_dicts() == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]


def test_quoted_commas_survive_and_a_row_is_a_line(tmp_path: Path) -> None:
    df = read_table(_write(tmp_path / "t.csv", 'a,b\n"x, y","q""r"\n'))
    assert df.to_dicts() == [{"a": "x, y", "b": 'q"r'}]
    # a quoted line break would let one row reach into the next: each part is a failing line
    df = read_table(_write(tmp_path / "n.csv", 'a,b\n"x","line1\nline2"\n1,2\n'))
    assert df.height == 3 and df.get_column(UNREADABLE).is_not_null().to_list() == [True, True, False]
    assert df.row(2)[:2] == ("1", "2")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_refused(tmp_path: Path, content: str) -> None:
    p = _write(tmp_path / "empty.csv", content)
    with pytest.raises(DataError, match="empty") as exc:
        read_table(p)
    assert str(p) in str(exc.value)


@pytest.mark.parametrize("content", ["a,b\n", "a,b\n\n", "a,b\r\n  \r\n"])
def test_a_header_without_rows_is_an_empty_table(tmp_path: Path, content: str) -> None:
    """How many rows a file has is the validation gate's DP decision, not the reader's."""
    df = read_table(_write(tmp_path / "h.csv", content))
    assert df.columns == ["a", "b"] and df.height == 0


@pytest.mark.parametrize("name", ["data.txt", "data", "data.json", "data.xlsx"])
def test_format_is_decided_by_content_not_suffix(tmp_path: Path, name: str) -> None:
    p = _write(tmp_path / name, "a,b\n1,2\n")
    assert read_table(p).to_dicts() == [{"a": "1", "b": "2"}]


def test_missing_file_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        read_table(tmp_path / "nope.csv")
    for read in (read_table, read_header, sniff, count_rows):
        with pytest.raises(DataError, match="is a directory.*holds no Parquet file"):
            read(tmp_path)


# ----------------------------------------------------------------------------- a folder of Parquet files


def _text_column(values: list[bytes | None]) -> pa.Array:
    """A string column holding exactly these bytes (pyarrow does not check them when writing)."""
    data = b"".join(v or b"" for v in values)
    offsets = np.cumsum([0] + [len(v or b"") for v in values]).astype(np.int32)
    validity = pa.array([v is not None for v in values]).buffers()[1]
    return pa.Array.from_buffers(
        pa.string(), len(values), [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    )


def _part(path: Path, start: int, rows: int, bad: int | None = None, score: pa.DataType | None = None) -> None:
    """Rows start..start+rows-1 (id, score, note) in row groups of 64; `bad`: that row's note is not UTF-8."""
    notes: list[bytes | None] = [f"n{i}".encode() if i % 5 else None for i in range(start, start + rows)]
    if bad is not None:
        notes[bad - start] = b"bad \xff"
    table = pa.table(
        {
            "id": pa.array(range(start, start + rows), pa.int64()),
            "score": pa.array([i + 0.5 for i in range(start, start + rows)], score or pa.float64()),
            "note": _text_column(notes),
        }
    )
    pq.write_table(table, path, row_group_size=64)


def test_a_folder_of_parquet_files_is_one_table_and_a_bad_value_fails_its_own_row(tmp_path: Path) -> None:
    from privflow.data.chunked import parquet_chunks, parquet_rows

    folder = tmp_path / "t"
    folder.mkdir()
    _part(folder / "part-0.parquet", 0, 200)
    _part(folder / "part-1.pq", 200, 150, bad=260)
    _part(folder / "part-2.parquet", 350, 100)
    (folder / "_SUCCESS").write_bytes(b"")  # writers' markers are skipped
    (folder / ".part-0.parquet.crc").write_bytes(b"x")

    fmt, header, dtypes = read_header(folder)
    assert (fmt.kind, fmt.files, header) == ("parquet", 3, ["id", "score", "note"])
    assert sniff(folder).describe() == "Parquet, a folder of 3 files" and count_rows(folder) == 450
    df = read_table(folder)
    assert df.height == 450 and df.columns == ["id", "score", "note", UNREADABLE]
    reasons = df.get_column(UNREADABLE)
    assert reasons.null_count() == 449
    assert df.row(260) == (
        None,
        None,
        None,
        "file 'part-1.pq': row 61 holds a value in column 'note' that is not valid UTF-8 text",
    )
    assert df.get_column("id").to_list()[:260] == list(range(260)) and df.get_column("id")[449] == 449
    assert df.row(261)[:3] == (261, 261.5, "n261") and df.get_column("note")[5] is None
    # streamed: the same rows, the same reasons, chunks never spanning two files
    assert parquet_rows(folder) == 450
    chunks = list(parquet_chunks(folder, rows=128))
    assert [c.height for c in chunks] == [128, 72, 128, 22, 100]
    assert pl.concat(chunks, how="diagonal").equals(df)
    # the line cap applies per row, as for one file
    capped = read_table(folder, max_line_bytes=3)
    passing = [i for i in range(450) if (i % 5 == 0 or i < 100) and i != 260]  # at most 3 bytes of text
    assert capped.get_column(UNREADABLE).is_null().arg_true().to_list() == passing


def test_a_folders_files_must_agree_on_columns_before_any_row_is_read(tmp_path: Path, monkeypatch) -> None:
    import privflow.data.io as io_module
    from privflow.data.chunked import parquet_chunks

    folder = tmp_path / "t"
    folder.mkdir()
    _part(folder / "a.parquet", 0, 10)
    pq.write_table(
        pa.table({"id": pa.array([1]), "score": pa.array([0.5]), "memo": pa.array(["x"])}), folder / "b.parquet"
    )

    def no_rows(*_a: object, **_k: object) -> None:
        raise AssertionError("a row was read")

    monkeypatch.setattr(io_module, "_read_parquet", no_rows)
    monkeypatch.setattr(io_module, "parquet_frame", no_rows)
    for read in (read_header, read_table, lambda p: list(parquet_chunks(p))):
        with pytest.raises(DataError, match=r"columns disagree: 'b.parquet' lacks column\(s\) \['note'\] and has"):
            read(folder)


def test_a_folders_column_types_take_their_common_type(tmp_path: Path) -> None:
    from privflow.data.chunked import parquet_chunks

    folder = tmp_path / "t"
    folder.mkdir()
    _part(folder / "a.parquet", 0, 10, score=pa.float32())
    pq.write_table(
        pa.table({"note": pa.array(["z"]), "id": pa.array([10], pa.int32()), "score": pa.array([3], pa.int64())}),
        folder / "b.parquet",
    )
    _, header, dtypes = read_header(folder)
    assert header == ["id", "score", "note"] and dtypes == {"id": pl.Int64, "score": pl.Float64, "note": pl.String}
    df = read_table(folder)
    assert df.schema == dtypes and df.row(10) == (10, 3.0, "z")
    assert pl.concat(list(parquet_chunks(folder, rows=4))).equals(df)


@pytest.mark.parametrize("extra", ["data.csv", "sub/"])
def test_a_folder_with_other_files_or_subfolders_is_refused(tmp_path: Path, extra: str) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    _part(folder / "a.parquet", 0, 10)
    if extra.endswith("/"):
        (folder / extra).mkdir()
        _part(folder / extra / "b.parquet", 10, 10)
    else:
        (folder / extra).write_text("id,score,note\n")
    with pytest.raises(DataError, match="is a directory.*(subfolder|not Parquet)") as err:
        read_table(folder)
    assert extra.rstrip("/") in str(err.value)
    # a file named .parquet must be Parquet
    if not extra.endswith("/"):
        (folder / extra).rename(folder / "c.parquet")
        with pytest.raises(DataError, match="'c.parquet', which is utf-8 CSV"):
            sniff(folder)


def test_parquet_bytes_with_csv_suffix_are_read_as_parquet(tmp_path: Path) -> None:
    pq = tmp_path / "real.parquet"
    pl.DataFrame({"a": [1, 2]}).write_parquet(pq)
    fake = _write(tmp_path / "fake.csv", pq.read_bytes())
    assert read_table(fake)["a"].to_list() == [1, 2]
    assert sniff(fake).kind == "parquet"


def test_binary_and_office_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="NUL bytes") as exc:
        read_table(_write(tmp_path / "bin.csv", bytes(range(256)) * 4))
    assert "bin.csv" in str(exc.value)
    with pytest.raises(DataError, match="ZIP archive"):
        read_table(_write(tmp_path / "t.xlsx", b"PK\x03\x04rest"))


def test_text_with_parquet_suffix_is_read_as_csv(tmp_path: Path) -> None:
    p = _write(tmp_path / "fake.parquet", "a,b\n1,2\n")
    assert read_table(p).to_dicts() == [{"a": "1", "b": "2"}]


@pytest.mark.parametrize(("sep", "name"), [(";", "semicolon"), ("\t", "tab"), ("|", "pipe"), (",", "comma")])
def test_delimiter_is_sniffed(tmp_path: Path, sep: str, name: str) -> None:
    p = _write(
        tmp_path / "t.csv",
        f"a{sep}b{sep}c\n1{sep}2,5{sep}x\n3{sep}4{sep}y\n" if sep != "," else "a,b,c\n1,2,x\n3,4,y\n",
    )
    fmt = sniff(p)
    assert fmt.delimiter == sep and name in fmt.describe()
    df = read_table(p)
    assert df.columns == ["a", "b", "c"] and df.height == 2


def test_encodings_and_gzip(tmp_path: Path) -> None:
    text = "a,b\nPrivé,2\nx,3\n"
    expected = [{"a": "Privé", "b": "2"}, {"a": "x", "b": "3"}]
    assert read_table(_write(tmp_path / "bom.csv", b"\xef\xbb\xbf" + text.encode())).to_dicts() == expected
    assert read_table(_write(tmp_path / "u16.csv", text.encode("utf-16"))).to_dicts() == expected
    gz = _write(tmp_path / "t.csv.gz", gzip.compress(text.encode()))
    assert read_table(gz).to_dicts() == expected and sniff(gz).compression == "gzip"
    # a row that is not UTF-8 is a failing row; only the header decides the file's encoding
    latin = read_table(_write(tmp_path / "latin.csv", text.encode("latin-1")))
    assert latin.get_column(UNREADABLE).is_not_null().to_list() == [True, False]
    assert latin.row(1)[:2] == ("x", "3")
    with pytest.raises(DataError, match="Latin-1.*iconv"):
        read_table(_write(tmp_path / "latin-h.csv", "é,b\n1,2\n".encode("latin-1")))
    with pytest.raises(DataError, match="UTF-16 text without a byte-order mark"):
        read_table(_write(tmp_path / "u16le.csv", text.encode("utf-16-le")))


def test_header_and_row_count_without_parsing_values(tmp_path: Path) -> None:
    fmt, header, dtypes = read_header(DEMO / "adult_train.csv")
    assert header[0] == "age" and dtypes is None and fmt.kind == "csv"
    assert count_rows(DEMO / "adult_train.csv") == 32561
    p = _write(tmp_path / "t.csv", 'a,b\n1,2\n\n"x\ny",3\n\n')
    assert count_rows(p) == 3  # blank lines are not rows; a row is a line, as read_table reads it
    pq = tmp_path / "t.parquet"
    pl.DataFrame({"n": [1, 2, 3]}).write_parquet(pq)
    fmt, header, dtypes = read_header(pq)
    assert header == ["n"] and dtypes == {"n": pl.Int64} and count_rows(pq) == 3


def test_ragged_rows_are_failing_rows_that_say_their_line(tmp_path: Path) -> None:
    p = _write(tmp_path / "r.csv", "a,b,c\n1,2,3\n4,5\n6,7,8,9\n1,2,3\n")
    df = read_table(p)
    assert df.select("a", "b", "c").rows() == [("1", "2", "3"), (None,) * 3, (None,) * 3, ("1", "2", "3")]
    reasons = df.get_column(UNREADABLE).to_list()
    assert reasons[0] is None and reasons[3] is None
    assert reasons[1].startswith("line 3 has 2 fields") and reasons[2].startswith("line 4 has 4 fields")


@pytest.mark.parametrize(
    "line",
    [b'1,"2', b'"1"x,2', b"1,2\x003", b"1,\xff\xfe", b"1\r2,3", b",,,,,,", b"1,2,3", b"9"],
)
def test_any_odd_line_changes_its_own_row_only(tmp_path: Path, line: bytes) -> None:
    """Totality: the table read with one odd line added is the table without it plus one row."""
    base = b"a,b\n1,2\n3,4\n"
    clean = read_table(_write(tmp_path / "c.csv", base + b"5,6\n"))
    odd = read_table(_write(tmp_path / "o.csv", base + line + b"\n5,6\n"))
    assert odd.height == clean.height + 1
    assert odd.select("a", "b").remove(pl.int_range(pl.len()) == 2).rows() == clean.rows()


def test_duplicate_and_blank_headers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="more than once.*'a'"):
        read_table(_write(tmp_path / "d.csv", "a,b,a\n1,2,3\n"))
    with pytest.raises(DataError, match="blank column name"):
        read_table(_write(tmp_path / "b.csv", "a,,c\n1,2,3\n"))


def test_unterminated_quote_fails_its_own_line_only(tmp_path: Path) -> None:
    # strict csv: a stray quote fails its line, and never swallows the lines after it
    df = read_table(_write(tmp_path / "q.csv", 'a,b\n1,"2\n3,4\n'))
    assert df.get_column(UNREADABLE).to_list()[0].startswith("line 2 is not valid CSV")
    assert df.row(1)[:2] == ("3", "4")


def test_parquet_round_trip_keeps_types(tmp_path: Path) -> None:
    df = pl.DataFrame(
        {
            "n": [1, 2, None],
            "x": [0.5, None, 2.0],
            "c": pl.Series(["a", None, "b"], dtype=pl.Enum(["a", "b"])),
            "s": ["u", "", "w"],
        }
    )
    for name in ("t.parquet", "t.pq"):
        p = write_table(df, tmp_path / "sub" / name)
        back = read_table(p)
        assert back["n"].to_list() == [1, 2, None] and back["n"].dtype == pl.Int64
        assert back["x"].to_list() == [0.5, None, 2.0]
        assert back["c"].cast(pl.String).to_list() == ["a", None, "b"]
        assert back["s"].to_list() == ["u", None, "w"]  # empty string means missing in Parquet too


def test_csv_write_then_read(tmp_path: Path) -> None:
    df = pl.DataFrame({"a": [1, None], "b": ["x,y", "z"]})
    back = read_table(write_table(df, tmp_path / "o.csv"))
    assert back.to_dicts() == [{"a": "1", "b": "x,y"}, {"a": None, "b": "z"}]
    with pytest.raises(DataError, match="suffix"):
        write_table(df, tmp_path / "o.xlsx")


def test_a_failed_write_leaves_no_partial_table_and_keeps_the_old_one(tmp_path: Path, monkeypatch) -> None:
    """A write that fails half-way (a full disk) leaves neither a partial table under the name
    nor its temporary file, and an earlier table of that name is untouched."""
    import errno

    target = tmp_path / "o.csv"
    target.write_text("a\n1\n")

    def fills_up(self, file, *args, **kwargs):  # noqa: ANN001
        Path(file).write_text("a\n")  # part of the rows, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_csv", fills_up)
    with pytest.raises(OSError, match="No space"):
        write_table(pl.DataFrame({"a": [2, 3]}), target)
    assert target.read_text() == "a\n1\n" and list(tmp_path.iterdir()) == [target]


# ----------------------------------------------------------------------------- streamed lines


def _reference_lines(data: bytes, newline: bytes, cr: bytes, cap: int) -> list[bytes | None]:
    """What `_split` must give: the whole stream split at once (no final empty line), None past the cap."""
    parts = data.split(newline)
    if parts and parts[-1] == b"":
        parts.pop()
    return [None if len(p) - (len(cr) if p.endswith(cr) else 0) > cap else p for p in parts]


@pytest.mark.parametrize("newline", [b"\n", b"\n\x00", b"\x00\n"])
def test_split_streams_lines_as_the_whole_file_split_at_once(newline: bytes) -> None:
    """However the stream is cut into chunks (a newline or CRLF straddling two), the lines are the
    file's lines, and one past the cap is None."""
    import random

    from privflow.data.io import _split

    cr = b"\r" if len(newline) == 1 else (b"\r\x00" if newline[0] else b"\x00\r")
    rng = random.Random(7)
    alphabet = [b"a", b"\x00", b"\n", b"\r", b"\xff", b"\x0a\x00", b"\x00\x0a", b"xyz"]
    for _ in range(200):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        cap = rng.choice([1, 3, 8, 100])
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randrange(0, 8))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert list(_split(chunks, newline, cr, cap)) == _reference_lines(data, newline, cr, cap), (data, cap)


def test_reading_in_tiny_chunks_gives_the_same_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import privflow.data.io as io_module

    text = "a;b\r\nPrivé,1;\ufffd\r\n\r\n  \r\n3;x\ry\r\n" + "5;" + "z" * 40 + "\r\n7;8"
    files = {
        "u8.csv": text.encode(),
        "bom.csv": b"\xef\xbb\xbf" + text.encode() + b"\n1;\xff\n",
        "u16le.csv": text.encode("utf-16"),
        "u16be.csv": b"\xfe\xff" + text.encode("utf-16-be") + b"\x00\n\x001\x00;\x00",
        "gz.csv.gz": gzip.compress(text.encode("utf-16")),
    }
    for name, data in files.items():
        _write(tmp_path / name, data)
    whole = {name: read_table(tmp_path / name, max_line_bytes=30) for name in files}
    reasons = whole["u8.csv"].get_column(UNREADABLE).to_list()
    assert reasons[0] is None and reasons[1].startswith("line 5 is not valid CSV") and reasons[3] is None
    assert reasons[2] == "line 6 is longer than the cap of 30 bytes (dataset.max_line_bytes)"
    assert whole["bom.csv"].get_column(UNREADABLE).to_list()[-1].startswith("line 8 holds bytes that are not valid")
    for size in (1, 2, 3, 5):
        monkeypatch.setattr(io_module, "_CHUNK_BYTES", size)
        for name in files:
            assert read_table(tmp_path / name, max_line_bytes=30).equals(whole[name]), (name, size)


def test_each_line_is_decoded_on_its_own(tmp_path: Path) -> None:
    """A valid U+FFFD is text like any other; only a line's own undecodable bytes fail it, with a reason."""
    df = read_table(_write(tmp_path / "t.csv", "a,b\n\ufffd,1\n".encode() + b"x,\xe9t\xe9\n" + "\ufffd,2\n".encode()))
    assert df.get_column("a").to_list() == ["\ufffd", None, "\ufffd"]
    assert df.get_column(UNREADABLE).to_list() == [
        None,
        "line 3 holds bytes that are not valid UTF-8 text (invalid continuation byte at byte 3)",
        None,
    ]
    u16 = read_table(_write(tmp_path / "u.csv", "a,b\n\ufffd,1\nx,y\n".encode("utf-16")))
    assert u16.rows() == [("\ufffd", "1"), ("x", "y")]


def test_utf16_row_counts_and_an_odd_last_line(tmp_path: Path) -> None:
    p = _write(tmp_path / "u.csv", codecs_bom_le() + "a,b\r\n1,2\r\n\r\n3,4".encode("utf-16-le") + b"\x00")
    assert count_rows(p) == 2  # the last line has an odd byte count: a failing row, still a row
    df = read_table(p)
    assert df.get_column(UNREADABLE).to_list() == [
        None,
        "line 4 has an odd number of bytes (7), so it is not UTF-16 text",
    ]


def codecs_bom_le() -> bytes:
    import codecs

    return codecs.BOM_UTF16_LE


def test_a_gzip_archive_cut_short_is_refused_as_damaged(tmp_path: Path) -> None:
    data = gzip.compress(("a,b\n" + "1,2\n" * 50_000).encode())
    with pytest.raises(DataError, match="damaged gzip"):
        read_table(_write(tmp_path / "t.csv.gz", data[: len(data) // 2]))


def test_parquet_reads_as_polars_reads_it_with_row_groups_and_nulls(tmp_path: Path) -> None:
    """Parquet is read through pyarrow (which leaves text unchecked, so that a bad value fails its
    own row): every valid file reads exactly as polars reads it."""
    import datetime as dt

    from privflow.data.io import empty_strings_to_null

    n = 1000
    df = pl.DataFrame(
        {
            "i": [None if k % 11 == 0 else k for k in range(n)],
            "x": [k / 3 if k % 13 else None for k in range(n)],
            "e": pl.Series([["a", "b", None][k % 3] for k in range(n)], dtype=pl.Enum(["a", "b"])),
            "c": pl.Series([["p", "q"][k % 2] for k in range(n)], dtype=pl.Categorical),
            "s": [["u", "", None, "\ufffd"][k % 4] for k in range(n)],
            "d": [dt.date(2020, 1, 1) + dt.timedelta(days=k) for k in range(n)],
            "l": [[str(k)] if k % 5 else None for k in range(n)],
            "b": [bytes([k % 256]) for k in range(n)],
        }
    )
    p = tmp_path / "t.parquet"
    df.write_parquet(p, row_group_size=128)
    _write(tmp_path / "t.parquet.gz", gzip.compress(p.read_bytes()))
    want = empty_strings_to_null(pl.read_parquet(p))
    for path in (p, tmp_path / "t.parquet.gz"):
        got = read_table(path)
        assert got.schema == want.schema and got.equals(want)
