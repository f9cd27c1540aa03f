"""privflow.data.validation.expectations: the Great Expectations suites, run in chunks of rows
and set up once per schema and columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from privflow.data.validation import validate
from tests.data.validation_tables import SMALL, fails, set_cells, toy

pytestmark = pytest.mark.usefixtures("gx_imported")


def test_great_expectations_runs_in_chunks_with_the_same_counts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Large tables are validated in chunks of rows (a bounded pandas copy for GX): the counts, the
    quarantined rows and the clean frame are exactly those of one whole-table batch."""
    from privflow.data.validation import expectations

    df = toy(40)
    for rows, col, val in (([3, 7, 38], "age", "150"), ([7, 21], "color", "mauve"), ([39], "color", None)):
        df = set_cells(df, col, rows, val)
    whole, whole_rep = validate(df, SMALL, policy="quarantine", quarantine_path=tmp_path / "a.csv")
    monkeypatch.setattr(expectations, "GX_CHUNK_ROWS", 7)  # 6 chunks, the last one short
    chunked, chunked_rep = validate(df, SMALL, policy="quarantine", quarantine_path=tmp_path / "b.csv")
    assert chunked.equals(whole)
    assert chunked_rep.to_dict() == {**whole_rep.to_dict(), "quarantine_path": str(tmp_path / "b.csv")}
    assert {(f.column, f.check): f.failing_rows for f in chunked_rep.failures} == {
        ("age", "bounds"): 3,
        ("color", "category"): 2,
        ("color", "not_null"): 1,
    }
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


def test_great_expectations_is_set_up_once_per_schema_and_columns() -> None:
    """A table read in chunks is validated chunk after chunk: the GX context and suites are built
    once, not per call (a context per call kept about 2.5 MB each for good)."""
    from privflow.data.validation import expectations

    df = toy(12)
    validate(df, SMALL)
    before = len(expectations._GX_SETUPS)
    for _ in range(3):
        validate(df, SMALL)
        validate(df.slice(0, 5), SMALL)
    assert len(expectations._GX_SETUPS) == before
    fails(df.drop("size"))  # other columns: another setup, built once
    fails(df.drop("size"))
    assert len(expectations._GX_SETUPS) == before + 1
