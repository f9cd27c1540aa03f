"""privflow.data.validation (table.py): `validate` and `validate_chunks` end to end, the GX suite
built from the schema, the strict and quarantine policies; the steps have their own files
(tests/data/test_validation_coerce.py, _expectations, _report, _quarantine; clamp and `other`:
tests/data/test_clamp_other.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from privflow.core.errors import ConfigError, DataError, ValidationFailed
from privflow.data.io import read_table, write_table
from privflow.data.schema import Schema
from privflow.data.validation import ValidationReport, validate, validate_chunks
from tests.data.validation_tables import DEMO, SMALL, fails, set_cells, toy

pytestmark = pytest.mark.usefixtures("gx_imported")


# --------------------------------------------------------------------------- good data


def test_valid_toy_is_typed_in_schema_order() -> None:
    df = toy().select(["size", "color", "income", "age"])  # column order in the file does not matter
    out, rep = validate(df, SMALL)
    assert rep.passed and rep.failing_rows == 0 and rep.total_rows == 10 and rep.quarantined_rows == 0
    assert out.columns == SMALL.names
    assert out.schema["age"] == pl.Int64 and out.schema["income"] == pl.Float64
    assert out.schema["color"] == pl.Enum(["red", "green", "blue"])
    assert out["age"].to_list() == list(range(20, 30))
    assert out["income"].to_list()[:3] == [None, 1000.5, 2001.0]
    assert out["size"].null_count() == 2  # nullable: nulls pass
    assert rep.expectations > 0


@pytest.mark.parametrize("name", ["adult_train.csv", "adult_test.csv"])
def test_real_adult_passes_strict(adult_schema: Schema, name: str) -> None:
    df = read_table(DEMO / name)
    # how long this takes is a benchmark (benchmarks/bench_test_bounds.py), not asserted here
    out, rep = validate(df, adult_schema, policy="strict")
    assert rep.passed, rep.to_dict()
    assert out.height == df.height == {"adult_train.csv": 32561, "adult_test.csv": 16281}[name]
    assert out.columns == adult_schema.names
    assert out["workclass"].null_count() == df["workclass"].null_count() > 0
    assert out["age"].to_list() == [int(v) for v in df["age"].to_list()]


def test_typed_parquet_input_validates(tmp_path: Path, adult_schema: Schema) -> None:
    typed, _ = validate(read_table(DEMO / "adult_test.csv").head(500), adult_schema)
    p = write_table(typed, tmp_path / "adult.parquet")
    again, rep = validate(read_table(p), adult_schema)
    assert rep.passed
    assert again.equals(typed)


def test_decoded_random_codes_pass_the_suite(adult_schema: Schema) -> None:
    """What the codec decodes from any array is valid under the schema, by GX's judgement too."""
    import numpy as np

    from privflow.data.codec import Codec

    codec = Codec.from_schema(adult_schema)
    rng = np.random.default_rng(3)
    a = rng.normal(0.5, 3.0, size=(3000, codec.dim)) * rng.choice([1.0, 40.0], size=(3000, codec.dim))
    decoded = codec.decode(a)
    out, rep = validate(decoded, adult_schema)
    assert rep.passed and out.equals(decoded)


# --------------------------------------------------------------------------- schema-level errors


@pytest.mark.parametrize("policy", ["strict", "quarantine"])
def test_missing_column_is_fatal(tmp_path: Path, policy: str) -> None:
    err = fails(toy().drop("color"), policy=policy, quarantine_path=tmp_path / "q.csv")
    msg = str(err)
    assert "'color'" in msg and "missing" in msg
    f = err.report.failures  # type: ignore[attr-defined]
    assert [(x.column, x.check, x.level) for x in f] == [("color", "missing_column", "schema")]
    assert not (tmp_path / "q.csv").exists()


@pytest.mark.parametrize("policy", ["strict", "quarantine"])
def test_extra_column_is_fatal(tmp_path: Path, policy: str) -> None:
    df = toy().with_columns(pl.lit("1").alias("ssn"))
    err = fails(df, policy=policy, quarantine_path=tmp_path / "q.csv")
    assert "'ssn'" in str(err) and "not declared" in str(err)
    assert [(x.column, x.check) for x in err.report.failures] == [("ssn", "extra_column")]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- row-level errors and the policies


def test_several_failures_count_rows_once() -> None:
    df = set_cells(set_cells(set_cells(toy(), "age", [0, 1], "200"), "color", [1, 2], "pink"), "size", [3], "XL")
    err = fails(df)
    rep = err.report  # type: ignore[attr-defined]
    assert {(f.column, f.check): f.failing_rows for f in rep.failures} == {
        ("age", "bounds"): 2,
        ("color", "category"): 2,
        ("size", "category"): 1,
    }
    assert rep.failing_rows == 4  # row 1 fails two checks
    assert "4 of 10 rows fail" in str(err)


def test_policy_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="quarantine_path"):
        validate(toy(), SMALL, policy="quarantine")
    with pytest.raises(ConfigError, match="strict"):
        validate(toy(), SMALL, policy="lenient")  # type: ignore[arg-type]
    with pytest.raises(ValidationFailed, match="no rows"):
        validate(toy().head(0), SMALL)


def test_gx_count_is_checked_against_the_polars_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """GX's unexpected_count is the count of record: a quarantine mask that disagrees is a bug."""
    from privflow.data.validation import table

    real = table.value_masks

    def off_by_one(*args: object) -> dict:
        masks = real(*args)  # type: ignore[arg-type]
        key = ("color", "category")
        masks[key] = masks[key] | (pl.int_range(0, masks[key].len(), eager=True) == 0)
        return masks

    monkeypatch.setattr(table, "value_masks", off_by_one)
    with pytest.raises(RuntimeError, match=r"GX counts 0 rows failing category on 'color', polars 1"):
        validate(toy(), SMALL)


# --------------------------------------------------------------------------- files end to end


def load(path: Path, schema: Schema) -> tuple[pl.DataFrame, ValidationReport]:
    return validate(read_table(path), schema)


def test_bad_files_give_data_errors(tmp_path: Path, adult_schema: Schema) -> None:
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        load(tmp_path / "empty.csv", adult_schema)
    # the format is read from the content (privflow/data/io.py): a workbook is refused by its bytes
    (tmp_path / "adult.xlsx").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(DataError, match="ZIP archive"):
        load(tmp_path / "adult.xlsx", adult_schema)
    (tmp_path / "garbage.csv").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(DataError, match="garbage.csv"):
        load(tmp_path / "garbage.csv", adult_schema)
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="does not parse as Parquet"):
        load(tmp_path / "garbage.parquet", adult_schema)


def test_csv_file_with_bad_rows_end_to_end(tmp_path: Path, adult_schema: Schema) -> None:
    lines = (DEMO / "adult_test.csv").read_text().splitlines()[:101]
    header = lines[0].split(",")
    for line_no, column, value in ((5, "workclass", "Pirate"), (9, "age", "old")):
        row = lines[line_no].split(",")
        row[header.index(column)] = value
        lines[line_no] = ",".join(row)
    p = tmp_path / "adult_bad.csv"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValidationFailed) as exc:
        load(p, adult_schema)
    msg = str(exc.value)
    assert "column 'age': 1 row with a value that is not a number" in msg
    assert "column 'workclass': 1 row with a category not in the declared list of 8" in msg
    assert "2 of 100 rows fail" in msg


def test_german_credit_demo_passes_strict() -> None:
    schema = Schema.from_yaml(DEMO / "german.yaml")
    out, rep = validate(read_table(DEMO / "german.csv"), schema)
    assert rep.passed and out.height == 1000 and out.columns == schema.names


# --------------------------------------------------------------------------- in chunks


def _bad_toy(n: int = 40) -> pl.DataFrame:
    df = set_cells(toy(n), "age", [3, 17, 25], "7")  # bounds
    df = set_cells(df, "color", [17, 30, 39], "purple")  # category (row 17 fails twice)
    return set_cells(df, "income", [8], "lots")  # type


@pytest.mark.parametrize("policy", ["strict", "quarantine"])
def test_validating_in_chunks_equals_validating_the_whole_table(tmp_path: Path, policy: str) -> None:
    """A streamed run validates its table chunk by chunk: the clean rows, the report and the
    quarantine file (positions in the whole table) are those of one call on the whole table,
    and the gate decides once, on the total."""
    df = _bad_toy()
    q_whole, q_chunks = tmp_path / "whole.csv", tmp_path / "chunks.csv"
    clean, report = validate(df, SMALL, policy, q_whole, gate=lambda _f, _p: False)  # type: ignore[arg-type]
    seen: list[tuple[int, int]] = []
    kept: list[pl.DataFrame] = []

    def gate(failing: int, passing: int) -> bool:
        seen.append((failing, passing))
        return False

    chunks = [df.slice(s, 9) for s in range(0, df.height, 9)]
    merged = validate_chunks(chunks, SMALL, policy, q_chunks, gate, kept.append)  # type: ignore[arg-type]
    assert seen == [(6, 34)]  # rows 3, 8, 17, 25, 30, 39 fail: one decision on the totals
    assert pl.concat(kept).equals(clean)
    assert merged.to_dict() | {"quarantine_path": None} == report.to_dict() | {"quarantine_path": None}
    if policy == "quarantine":
        assert q_chunks.read_text() == q_whole.read_text()
        assert pl.read_csv(q_chunks)["_privflow_row"].to_list() == [3, 8, 17, 25, 30, 39]


def test_a_gate_that_stops_a_chunked_validation_gets_the_total_and_the_merged_report() -> None:
    df = _bad_toy()
    chunks = [df.slice(s, 15) for s in range(0, df.height, 15)]
    with pytest.raises(ValidationFailed) as exc:
        validate_chunks(chunks, SMALL, "strict", None, lambda failing, _passing: failing >= 6, lambda _: None)
    report = exc.value.report  # type: ignore[attr-defined]
    assert (report.total_rows, report.failing_rows) == (40, 6)
    assert {(f.column, f.check, f.failing_rows) for f in report.failures} == {
        ("age", "bounds", 3),
        ("income", "type", 1),
        ("color", "category", 3),
    }
    # no row at all is the gate's decision too (its DP count of passing rows), never a refusal on an exact count
    seen: list[tuple[int, int]] = []
    validate_chunks([df.head(0)], SMALL, "strict", None, lambda f, p: seen.append((f, p)) or False, lambda _: None)
    assert seen == [(0, 0)]
