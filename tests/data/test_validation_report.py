"""privflow.data.validation.report: what a report and its message say (a column, a check and a
count, never a value)."""

from __future__ import annotations

import json

import pytest

from privflow.data.validation import NOT_DP_LABEL
from tests.data.validation_tables import fails, set_cells, toy

pytestmark = pytest.mark.usefixtures("gx_imported")


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
