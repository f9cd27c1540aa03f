"""privflow.data.validation.quarantine: the rows set aside, as given, with their position and the
checks they fail."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from privflow.data.validation import validate
from tests.data.validation_tables import SMALL, fails, set_cells, toy

pytestmark = pytest.mark.usefixtures("gx_imported")


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
