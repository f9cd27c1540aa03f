"""privflow.data.validation.coerce: text trimmed, missing-value tokens, numbers parsed per row,
a column's storage refused only by its dtype."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from privflow.core.errors import ValidationFailed
from privflow.data.schema import Schema
from privflow.data.validation import validate
from tests.data.validation_tables import SMALL, fails, set_cells, toy

pytestmark = pytest.mark.usefixtures("gx_imported")


def with_missing_values(*tokens: str) -> Schema:
    doc = SMALL.model_dump(mode="json")
    doc["dataset"]["missing_values"] = list(tokens)
    return Schema.model_validate(doc)


def test_declared_missing_values_are_missing_in_every_text_column() -> None:
    """'?' and 'NA' (declared) read as missing: allowed where nullable, a not-null failure elsewhere."""
    schema = with_missing_values("?", "NA")
    df = set_cells(set_cells(toy(), "income", [1, 2], "NA"), "size", [3], "?")
    typed, report = validate(df, schema)
    assert typed["income"].null_count() == toy()["income"].null_count() + 2 and typed["size"][3] is None
    assert report.failing_rows == 0
    err = fails(set_cells(toy(), "color", [4], "?"), schema)  # color is not nullable
    assert [(f.column, f.check, f.failing_rows) for f in err.report.failures] == [("color", "not_null", 1)]
    fails(set_cells(toy(), "income", [1], "NA"))  # undeclared, 'NA' is a word in a numeric column


def test_missing_values_are_text_as_written() -> None:
    assert with_missing_values("-999", "?").dataset.missing_values == ("-999", "?")
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
        with_missing_values("?", "red")


def test_whitespace_and_float_spelling_of_integers_are_accepted() -> None:
    df = toy(3).with_columns(pl.Series("age", [" 20", "21.0", "2.2e1"]))
    out, rep = validate(df, SMALL)
    assert rep.passed and out["age"].to_list() == [20, 21, 22]


def test_spaces_around_categories_and_missing_tokens_are_removed() -> None:
    """UCI's original files separate fields by ", ": a category and a missing-value token with a
    space before them read as the declared ones, as numbers with spaces around them already did
    (fuzzing round 6: every such row failed the charged gate as an undeclared category)."""
    schema = with_missing_values("?")
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


def test_non_numeric_dtype_in_numeric_column_is_fatal() -> None:
    df = toy(3).with_columns(pl.Series("age", [[1], [2], [3]]))
    err = fails(df)
    assert err.report.failures[0].check == "type" and err.report.failures[0].level == "schema"  # type: ignore[attr-defined]


def test_nan_in_typed_float_column_counts_as_missing() -> None:
    df = toy(4).with_columns(pl.Series("age", [20.0, float("nan"), 22.0, 23.0]))
    err = fails(df)
    assert [(f.column, f.check, f.failing_rows) for f in err.report.failures] == [("age", "not_null", 1)]  # type: ignore[attr-defined]


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
