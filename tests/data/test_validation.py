"""privflow.data.validation: the GX suite built from the schema, strict and quarantine policies."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from privflow.core.errors import ConfigError, DataError, ValidationFailed
from privflow.data.io import read_table, write_table
from privflow.data.schema import Schema
from privflow.data.validation import NOT_DP_LABEL, ValidationReport, validate

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"

SMALL = Schema.model_validate(
    {
        "dataset": {"name": "toy"},
        "columns": [
            {"name": "age", "type": "integer", "bounds": [18, 90]},
            {"name": "income", "type": "numeric", "bounds": [0, 1e6], "transform": "log1p", "nullable": True},
            {"name": "color", "type": "categorical", "categories": ["red", "green", "blue"]},
            {"name": "size", "type": "categorical", "categories": ["S", "M", "L"], "nullable": True},
        ],
    }
)


def toy(n: int = 10) -> pl.DataFrame:
    """All-string frame, as read_table gives a CSV; every row valid under SMALL."""
    return pl.DataFrame(
        {
            "age": [str(20 + i) for i in range(n)],
            "income": [None if i % 4 == 0 else f"{1000.5 * i}" for i in range(n)],
            "color": [["red", "green", "blue"][i % 3] for i in range(n)],
            "size": [None if i % 5 == 0 else ["S", "M", "L"][i % 3] for i in range(n)],
        }
    )


def set_cells(df: pl.DataFrame, column: str, rows: list[int], value: str | None) -> pl.DataFrame:
    idx = pl.int_range(pl.len())
    return df.with_columns(
        pl.when(idx.is_in(rows)).then(pl.lit(value, dtype=pl.String)).otherwise(pl.col(column)).alias(column)
    )


def fails(df: pl.DataFrame, schema: Schema = SMALL, **kw: object) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as exc:
        validate(df, schema, **kw)  # type: ignore[arg-type]
    assert isinstance(exc.value.report, ValidationReport)  # type: ignore[attr-defined]
    return exc.value


# --------------------------------------------------------------------------- good data


@pytest.fixture(scope="module", autouse=True)
def _gx_imported() -> None:
    """Importing Great Expectations takes seconds; pay it once, outside any single test."""
    import great_expectations  # noqa: F401


@pytest.fixture(scope="module")
def adult_schema() -> Schema:
    return Schema.from_yaml(DEMO / "adult.yaml")


def _with_missing_values(*tokens: str) -> Schema:
    doc = SMALL.model_dump(mode="json")
    doc["dataset"]["missing_values"] = list(tokens)
    return Schema.model_validate(doc)


def test_declared_missing_values_are_missing_in_every_text_column() -> None:
    """'?' and 'NA' (declared) read as missing: allowed where nullable, a not-null failure elsewhere."""
    schema = _with_missing_values("?", "NA")
    df = set_cells(set_cells(toy(), "income", [1, 2], "NA"), "size", [3], "?")
    typed, report = validate(df, schema)
    assert typed["income"].null_count() == toy()["income"].null_count() + 2 and typed["size"][3] is None
    assert report.failing_rows == 0
    err = fails(set_cells(toy(), "color", [4], "?"), schema)  # color is not nullable
    assert [(f.column, f.check, f.failing_rows) for f in err.report.failures] == [("color", "not_null", 1)]
    fails(set_cells(toy(), "income", [1], "NA"))  # undeclared, 'NA' is a word in a numeric column


def test_missing_values_are_text_as_written() -> None:
    assert _with_missing_values("-999", "?").dataset.missing_values == ("-999", "?")
    doc = SMALL.model_dump(mode="json")
    doc["dataset"]["missing_values"] = [-999, "?"]  # YAML's number: its text
    assert Schema.model_validate(doc).dataset.missing_values == ("-999", "?")
    doc["dataset"]["missing_values"] = [None]  # YAML's `~`
    with pytest.raises(ValueError, match="quote each one"):
        Schema.model_validate(doc)
    doc["dataset"]["missing_values"] = [["?"]]  # a nested list is not a token
    with pytest.raises(ValueError, match="flat list"):
        Schema.model_validate(doc)


def test_a_missing_value_token_that_is_also_a_category_is_refused() -> None:
    """'red' cannot mean both a color and no value: refused with the schema, not discovered by the gate."""
    with pytest.raises(ValueError, match="both a declared category and a dataset.missing_values"):
        _with_missing_values("?", "red")


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


def test_whitespace_and_float_spelling_of_integers_are_accepted() -> None:
    df = toy(3).with_columns(pl.Series("age", [" 20", "21.0", "2.2e1"]))
    out, rep = validate(df, SMALL)
    assert rep.passed and out["age"].to_list() == [20, 21, 22]


def test_spaces_around_categories_and_missing_tokens_are_removed() -> None:
    """UCI's original files separate fields by ", ": a category and a missing-value token with a
    space before them read as the declared ones, as numbers with spaces around them already did
    (fuzzing round 6: every such row failed the charged gate as an undeclared category)."""
    schema = _with_missing_values("?")
    df = toy(6).with_columns(
        pl.Series("color", [" red", "green ", "\tblue", " red ", "green", "blue"]),
        pl.Series("size", [" S", " ?", "M", None, " L", "S"]),
    )
    out, rep = validate(df, schema)
    assert rep.passed, rep.to_dict()
    assert out["color"].cast(pl.String).to_list() == ["red", "green", "blue", "red", "green", "blue"]
    assert out["size"].cast(pl.String).to_list() == ["S", None, "M", None, "L", "S"]
    err = fails(set_cells(toy(), "color", [2], " purple "))  # still undeclared once trimmed
    assert [(f.column, f.check, f.failing_rows) for f in err.report.failures] == [("color", "category", 1)]
    doc = SMALL.model_dump(mode="json")
    doc["columns"][2]["categories"] = [" red", "green", "blue"]
    with pytest.raises(ValueError, match="spaces around them"):
        Schema.model_validate(doc)
    doc["columns"][2]["categories"] = ["  ", "green", "blue"]
    with pytest.raises(ValueError, match="empty text"):
        Schema.model_validate(doc)
    doc["columns"][2]["categories"] = ["red", "green", "blue"]
    doc["dataset"]["missing_values"] = [" NA"]  # would match 'NA' after trimming: refused, not silently widened
    with pytest.raises(ValueError, match="missing_values"):
        Schema.model_validate(doc)
    # a list whose only item failed is not also reported as too short
    one = {"dataset": {"name": "t"}, "columns": [{"name": "w", "type": "categorical", "categories": [" a"]}]}
    with pytest.raises(Exception) as info:
        Schema.validated(one)
    assert "spaces around them" in str(info.value) and "at least 1 item" not in str(info.value)


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


@pytest.mark.parametrize("policy", ["strict", "quarantine"])
def test_whole_column_of_text_fails_row_by_row(tmp_path: Path, policy: str) -> None:
    """No verdict on a whole column from its values: with one row more or less, a column of text
    would flip between 'every row fails' and 'the column has the wrong type' (privacy rule 8)."""
    df = toy().with_columns(pl.lit("forty").alias("age"))
    err = fails(df, policy="strict")
    f = err.report.failures[0]  # type: ignore[attr-defined]
    assert (f.column, f.check, f.level, f.failing_rows) == ("age", "type", "row", 10)
    seen: list[tuple[int, int]] = []
    with pytest.raises(ValidationFailed):
        validate(df, SMALL, policy, tmp_path / "q.csv", gate=lambda f, p: seen.append((f, p)) or True)
    assert seen == [(10, 0)]


def test_unreadable_lines_are_failing_rows_listed_in_the_quarantine(tmp_path: Path) -> None:
    from privflow.data.io import UNREADABLE

    df = toy(4).with_columns(pl.Series(UNREADABLE, [None, "line 3 holds a NUL byte", None, None]))
    df = df.with_columns([pl.when(pl.col(UNREADABLE).is_null()).then(pl.col(c)).alias(c) for c in toy(1).columns])
    seen: list[tuple[int, int]] = []
    q = tmp_path / "q.csv"
    clean, report = validate(df, SMALL, "quarantine", q, gate=lambda f, p: seen.append((f, p)) or False)
    assert seen == [(1, 3)] and clean.height == 3
    assert [(f.column, f.check, f.failing_rows) for f in report.failures] == [("(row)", "unreadable", 1)]
    q = pl.read_csv(tmp_path / "q.csv")
    assert q["_privflow_row"].to_list() == [1] and q[UNREADABLE].to_list() == ["line 3 holds a NUL byte"]


def test_non_numeric_dtype_in_numeric_column_is_fatal() -> None:
    df = toy(3).with_columns(pl.Series("age", [[1], [2], [3]]))
    err = fails(df)
    assert err.report.failures[0].check == "type" and err.report.failures[0].level == "schema"  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- row-level errors (strict)


@pytest.mark.parametrize(
    ("column", "rows", "value", "check", "words"),
    [
        ("age", [1, 4], "forty", "type", "2 rows with a value that is not a number"),
        ("age", [2], "nan", "type", "1 row with a value that is not a number"),
        ("age", [0, 3, 7], "200", "bounds", "3 rows outside the public bounds [18, 90]"),
        ("age", [5], "17", "bounds", "1 row outside the public bounds [18, 90]"),
        ("age", [6], "33.5", "integer", "1 row with a number that is not a whole number"),
        ("income", [1], "-5", "bounds", "1 row outside the public bounds [0, 1000000]"),
        ("income", [2], "inf", "bounds", "1 row outside"),
        ("color", [2, 3], "purple", "category", "2 rows with a category not in the declared list of 3"),
        ("color", [1], "Red", "category", "1 row with a category"),
        ("color", [8], None, "not_null", "1 row missing a value, but the column is not nullable"),
        ("age", [8, 9], None, "not_null", "2 rows missing a value"),
        ("color", [8], "", "not_null", "1 row missing a value"),
    ],
)
def test_strict_names_column_check_and_count(
    column: str, rows: list[int], value: str | None, check: str, words: str
) -> None:
    err = fails(set_cells(toy(), column, rows, value))
    msg = str(err)
    assert f"column '{column}': {words}" in msg
    assert f"{len(rows)} of 10 rows fail" in msg
    rep = err.report  # type: ignore[attr-defined]
    assert [(f.column, f.check, f.failing_rows, f.level) for f in rep.failures] == [(column, check, len(rows), "row")]
    assert rep.failing_rows == len(rows) and not rep.passed


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


def test_nan_in_typed_float_column_counts_as_missing() -> None:
    df = toy(4).with_columns(pl.Series("age", [20.0, float("nan"), 22.0, 23.0]))
    err = fails(df)
    assert [(f.column, f.check, f.failing_rows) for f in err.report.failures] == [("age", "not_null", 1)]  # type: ignore[attr-defined]


def test_report_and_message_hold_counts_never_values() -> None:
    secret = "Zzyzx-Secret-Category"
    df = set_cells(set_cells(toy(), "color", [3], secret), "age", [4], "987654")
    err = fails(df)
    rep = err.report  # type: ignore[attr-defined]
    blob = json.dumps(rep.to_dict()) + str(err)
    assert secret not in blob and "987654" not in blob
    d = rep.to_dict()
    assert d["label"] == NOT_DP_LABEL and "NOT differentially private" in d["label"]
    assert d["columns"]["color"][0]["failing_rows"] == 1 and d["passed"] is False


# --------------------------------------------------------------------------- quarantine


def test_quarantine_writes_exactly_the_failing_rows_and_keeps_the_rest(tmp_path: Path) -> None:
    src = toy(40)
    bad = {3: ("age", "150"), 7: ("color", "mauve"), 11: ("age", "x"), 19: ("color", None), 30: ("age", "31.5")}
    df = src
    for row, (col, val) in bad.items():
        df = set_cells(df, col, [row], val)
    df = set_cells(df, "color", [7], "mauve")
    df = set_cells(df, "age", [7], "250")  # row 7 fails two checks
    qpath = tmp_path / "q" / "quarantine.csv"

    out, rep = validate(df, SMALL, policy="quarantine", quarantine_path=qpath)

    assert rep.quarantined_rows == rep.failing_rows == 5 and rep.total_rows == 40
    assert rep.quarantine_path == str(qpath) and not rep.passed
    q = pl.read_csv(qpath, infer_schema=False)
    assert q["_privflow_row"].cast(pl.Int64).to_list() == sorted(bad)
    # the quarantined rows are the input rows, value for value
    assert q.drop(["_privflow_row", "_privflow_failed_checks"]).equals(df[sorted(bad)])
    assert q["_privflow_failed_checks"].to_list() == [
        "age:bounds",
        "age:bounds;color:category",
        "age:type",
        "color:not_null",
        "age:integer",
    ]
    # the rest is returned, typed, in order: exactly the clean rows of the strict path
    keep = [i for i in range(40) if i not in bad]
    expected, _ = validate(df[keep], SMALL)
    assert out.equals(expected)
    assert out.height + rep.quarantined_rows == rep.total_rows  # nothing dropped silently


def test_quarantine_with_no_failures_writes_an_empty_file(tmp_path: Path) -> None:
    qpath = tmp_path / "q.csv"
    qpath.write_text("stale content from an earlier run\n")
    out, rep = validate(toy(), SMALL, policy="quarantine", quarantine_path=qpath)
    assert rep.passed and out.height == 10 and rep.quarantined_rows == 0
    assert pl.read_csv(qpath).height == 0


def test_quarantine_of_every_row_is_refused(tmp_path: Path) -> None:
    df = toy(5).with_columns(pl.lit("violet").alias("color"))
    err = fails(df, policy="quarantine", quarantine_path=tmp_path / "q.csv")
    assert "nothing is left to train on" in str(err)
    assert pl.read_csv(tmp_path / "q.csv").height == 5


def test_policy_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="quarantine_path"):
        validate(toy(), SMALL, policy="quarantine")
    with pytest.raises(ConfigError, match="strict"):
        validate(toy(), SMALL, policy="lenient")  # type: ignore[arg-type]
    with pytest.raises(ValidationFailed, match="no rows"):
        validate(toy().head(0), SMALL)


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


def test_gx_count_is_checked_against_the_polars_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """GX's unexpected_count is the count of record: a quarantine mask that disagrees is a bug."""
    import privflow.data.validation as v

    real = v._value_masks

    def off_by_one(*args: object) -> dict:
        masks = real(*args)  # type: ignore[arg-type]
        key = ("color", "category")
        masks[key] = masks[key] | (pl.int_range(0, masks[key].len(), eager=True) == 0)
        return masks

    monkeypatch.setattr(v, "_value_masks", off_by_one)
    with pytest.raises(RuntimeError, match=r"GX counts 0 rows failing category on 'color', polars 1"):
        validate(toy(), SMALL)


def test_great_expectations_runs_in_chunks_with_the_same_counts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Large tables are validated in chunks of rows (a bounded pandas copy for GX): the counts, the
    quarantined rows and the clean frame are exactly those of one whole-table batch."""
    import privflow.data.validation as validation

    df = toy(40)
    for rows, col, val in (([3, 7, 38], "age", "150"), ([7, 21], "color", "mauve"), ([39], "color", None)):
        df = set_cells(df, col, rows, val)
    whole, whole_rep = validate(df, SMALL, policy="quarantine", quarantine_path=tmp_path / "a.csv")
    monkeypatch.setattr(validation, "GX_CHUNK_ROWS", 7)  # 6 chunks, the last one short
    chunked, chunked_rep = validate(df, SMALL, policy="quarantine", quarantine_path=tmp_path / "b.csv")
    assert chunked.equals(whole)
    assert chunked_rep.to_dict() == {**whole_rep.to_dict(), "quarantine_path": str(tmp_path / "b.csv")}
    assert {(f.column, f.check): f.failing_rows for f in chunked_rep.failures} == {
        ("age", "bounds"): 3,
        ("color", "category"): 2,
        ("color", "not_null"): 1,
    }
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


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
    from privflow.data.validation import validate_chunks

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
    from privflow.data.validation import validate_chunks

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


def test_great_expectations_is_set_up_once_per_schema_and_columns() -> None:
    """A table read in chunks is validated chunk after chunk: the GX context and suites are built
    once, not per call (a context per call kept about 2.5 MB each for good)."""
    from privflow.data import validation

    df = toy(12)
    validate(df, SMALL)
    before = len(validation._GX_SETUPS)
    for _ in range(3):
        validate(df, SMALL)
        validate(df.slice(0, 5), SMALL)
    assert len(validation._GX_SETUPS) == before
    fails(df.drop("size"))  # other columns: another setup, built once
    fails(df.drop("size"))
    assert len(validation._GX_SETUPS) == before + 1


def test_every_numeric_storage_pre_flight_accepts_is_read_as_numbers() -> None:
    """Parquet decimals (and 128-bit integers) pass pre-flight's type check, so validation must
    read them: it used to fail every row of a Decimal column, a charged gate stop."""
    from decimal import Decimal

    from privflow.preflight.files import _type_fits

    n = 6
    df = toy(n).with_columns(
        pl.Series("age", [Decimal(20 + i) for i in range(n)], dtype=pl.Decimal(10, 2)),
        pl.Series("income", [1000 * i for i in range(n)], dtype=pl.Int128),
    )
    assert _type_fits(SMALL.columns[0], df["age"].dtype) and _type_fits(SMALL.columns[1], df["income"].dtype)
    clean, report = validate(df, SMALL, "strict")
    assert clean.height == n and report.failing_rows == 0
    assert clean["age"].to_list() == [20 + i for i in range(n)] and clean["income"][5] == 5000.0


def test_numeric_labels_stored_as_floats_take_their_declared_label() -> None:
    """A Parquet column of 0.0 / 1.0 for categories '0' / '1' (pre-flight accepts it) is read as
    those labels; it used to read '0.0' and fail every row at the charged gate."""
    from privflow.preflight.files import _type_fits

    schema = Schema.model_validate(
        {
            "dataset": {"name": "flags"},
            "columns": [{"name": "flag", "type": "categorical", "categories": ["0", "1", "2.5"]}],
        }
    )
    df = pl.DataFrame({"flag": [0.0, 1.0, 2.5, 1.0]})
    assert _type_fits(schema.columns[0], df["flag"].dtype)
    clean, report = validate(df, schema, "strict")
    assert clean["flag"].cast(pl.String).to_list() == ["0", "1", "2.5", "1"] and report.failing_rows == 0
    with pytest.raises(ValidationFailed, match="category not in the declared list"):
        validate(pl.DataFrame({"flag": [0.0, 3.0]}), schema, "strict")
