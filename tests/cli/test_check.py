"""`privflow check`: the curator-only dry run of validation names the failing columns, counts, values
and a fix for each; it exits 0 / 3 / 2 and records nothing (no ledger, no MLflow, no store)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.errors import ValidationFailed
from privflow.data.schema import Schema
from privflow.data.validation import CHECK_ADVICE, validate

runner = CliRunner()

SCHEMA = {
    "dataset": {"name": "toy"},
    "columns": [
        {"name": "age", "type": "integer", "bounds": [18, 90]},
        {"name": "income", "type": "numeric", "bounds": [0, 1e6], "nullable": True},
        {"name": "cond", "type": "categorical", "categories": ["Good", "Very Good", "Fair"]},
        {"name": "score", "type": "numeric", "bounds": [0, 10]},
    ],
}


def rows(n: int = 40) -> list[dict[str, str]]:
    """n rows that pass SCHEMA, as CSV text fields; income has no value that holds 5% of the rows."""
    return [
        {
            "age": str(20 + i % 50),
            "income": f"{1000.5 * i + 3.25}",
            "cond": ["Good", "Very Good", "Fair"][i % 3],
            "score": f"{(i * 0.237) % 10:.3f}",
        }
        for i in range(n)
    ]


def write(tmp_path: Path, table: list[dict[str, str]], schema: dict | None = None) -> tuple[Path, Path]:
    data, spec = tmp_path / "data.csv", tmp_path / "schema.yaml"
    pl.DataFrame(table, schema={c: pl.String for c in table[0]}).write_csv(data)
    spec.write_text(yaml.safe_dump(schema or SCHEMA), encoding="utf-8")
    return data, spec


def check(data: Path, spec: Path, *extra: str):
    result = runner.invoke(app, ["check", "--data", str(data), "--schema", str(spec), *extra])
    assert "Traceback" not in result.output
    return result


def text(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture(autouse=True)
def _state(cli_process_state: None) -> None:
    """The command sets logging and environment variables in process: restored after each test."""


def test_clean_table_exits_0_and_says_curator_only_first(tmp_path: Path) -> None:
    result = check(*write(tmp_path, rows()))
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert "CURATOR-ONLY" in first and "not for publication" in first
    assert "40 rows read, 40 pass, 0 fail" in text(result)
    assert "Every row passes" in result.output


def test_category_typo_named_with_column_count_and_did_you_mean(tmp_path: Path) -> None:
    table = rows()
    for i in (1, 4, 7):
        table[i]["cond"] = "Very good"
    result = check(*write(tmp_path, table))
    assert result.exit_code == 3, result.output
    out = text(result)
    assert "37 pass, 3 fail" in out
    assert "column 'cond' [category]: 3 rows" in out
    assert "'Very good' (3)" in out
    assert "did you mean 'Very Good'? or add 'Very good' to categories" in out


def test_an_unknown_category_with_many_rows_is_to_be_added(tmp_path: Path) -> None:
    table = rows()
    for i in range(0, 40, 4):
        table[i]["cond"] = "Excellent"
    out = text(check(*write(tmp_path, table)))
    assert "'Excellent' holds 10 rows: add it to 'cond' categories" in out


def test_missing_value_token_in_a_numeric_column(tmp_path: Path) -> None:
    table = rows()
    for i in (2, 5, 11):
        table[i]["score"] = "NA"
    table[3]["score"] = "?"
    result = check(*write(tmp_path, table))
    assert result.exit_code == 3
    out = text(result)
    assert "column 'score' [type]: 4 rows" in out
    assert "'NA' (3), '?' (1)" in out  # distinct values, most frequent first
    assert "'NA' (3 rows) looks like a missing-value marker: declare it in `dataset.missing_values`" in out
    assert "`nullable: true` on 'score'" in out  # not nullable: a declared token would fail not_null next


def test_nulls_in_a_non_nullable_column(tmp_path: Path) -> None:
    table = rows()
    table[6]["age"] = ""
    table[9]["age"] = ""
    result = check(*write(tmp_path, table))
    assert result.exit_code == 3
    out = text(result)
    assert "column 'age' [not_null]: 2 rows" in out and "(empty) (2)" in out
    assert "declare `nullable: true` on 'age'" in out


def test_out_of_bounds_gives_the_range_seen_and_the_declared_bounds(tmp_path: Path) -> None:
    table = rows()
    table[0]["age"] = "150"
    table[1]["age"] = "7"
    result = check(*write(tmp_path, table))
    assert result.exit_code == 3
    out = text(result)
    assert "column 'age' [bounds]: 2 rows outside the public bounds [18, 90]" in out
    assert "values seen span [7, 150], the declared bounds are [18, 90]" in out


def test_clamped_values_and_values_sent_to_other_are_counted_per_column(tmp_path: Path) -> None:
    table = rows()
    table[0]["age"], table[1]["age"], table[2]["score"] = "95", "12", "11.5"  # clamped (rows 0, 1, 2)
    table[2]["cond"], table[5]["cond"] = "Excellent", "Poor"  # read as 'Fair' (rows 2, 5)
    table[9]["income"] = "-3"  # income fails (a column that says `fail`)
    spec = {
        "dataset": {"name": "toy", "on_out_of_bounds": "clamp"},
        "columns": [
            SCHEMA["columns"][0],
            {**SCHEMA["columns"][1], "on_out_of_bounds": "fail"},
            {**SCHEMA["columns"][2], "other": "Fair"},
            SCHEMA["columns"][3],
        ],
    }
    result = check(*write(tmp_path, table, spec))
    assert result.exit_code == 3, result.output
    out = text(result)
    # rows 0, 1, 2 hold a clamped value, rows 2 and 5 one read as 'other' (row 2 both); row 9 fails
    assert "39 pass (3 with a value clamped to a bound, 2 with a category read as 'other'), 1 fail" in out
    assert "column 'income' [bounds]: 1 row outside the public bounds" in out
    assert "column 'age' [clamped, kept]: 2 values outside the public bounds [18, 90], clamped" in out
    assert "column 'cond' [other, kept]: 2 values not in the declared list of 3, read as 'Fair'" in out
    assert "column 'score' [clamped, kept]: 1 value outside the public bounds [0, 10]" in out
    table[9]["income"] = "3"
    clean = text(check(*write(tmp_path, table, spec)))
    assert "40 pass (3 with a value clamped to a bound, 2 with a category read as 'other'), 0 fail" in clean


def test_a_point_mass_suggests_atoms(tmp_path: Path) -> None:
    table = rows()
    for i in range(0, 40, 5):
        table[i]["income"] = "0"
    result = check(*write(tmp_path, table))
    assert result.exit_code == 0, result.output  # advice only: every row passes
    out = text(result)
    assert "column 'income': 0 holds 20% of the passing rows but is not a declared atom" in out
    assert "`atoms: [0]`" in out
    declared = {**SCHEMA, "columns": [{**c, "atoms": [0]} if c["name"] == "income" else c for c in SCHEMA["columns"]]}
    assert "atoms" not in text(check(*write(tmp_path, table, declared)))


def test_examples_are_limited(tmp_path: Path) -> None:
    table = rows()
    for i, word in enumerate(("Alpha", "Beta", "Gamma")):
        table[i]["cond"] = word
    out = text(check(*write(tmp_path, table), "--examples", "1"))
    assert "'Alpha' (1) and 2 more distinct" in out


@pytest.mark.parametrize("which", ["schema", "data"])
def test_a_bad_path_exits_2_with_one_paragraph(tmp_path: Path, which: str) -> None:
    data, spec = write(tmp_path, rows())
    if which == "schema":
        spec = tmp_path / "missing.yaml"
    else:
        data = tmp_path / "missing.csv"
    result = check(data, spec)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "does not exist" in lines[0]


def test_a_header_that_does_not_match_exits_2(tmp_path: Path) -> None:
    table = [{**r, "extra": "1"} for r in rows()]
    result = check(*write(tmp_path, table))
    assert result.exit_code == 2
    assert "does not declare" in text(result)


def test_an_unreadable_line_is_a_failing_row_with_its_reason(tmp_path: Path) -> None:
    data, spec = write(tmp_path, rows())
    data.write_text(data.read_text(encoding="utf-8") + "1,2\n", encoding="utf-8")
    result = check(data, spec)
    assert result.exit_code == 3
    out = text(result)
    assert "rows [unreadable]: 1 row" in out and "line 42 has 2 fields where the header has 4" in out


def test_nothing_is_created_in_the_cwd_or_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = rows()
    table[3]["cond"] = "Very good"
    data, spec = write(tmp_path, table)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    scratch = set(Path(tempfile.gettempdir()).glob("privflow-check-*"))
    assert check(data, spec).exit_code == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no .privflow, ledger.db, mlruns or quarantine
    assert set(Path(tempfile.gettempdir()).glob("privflow-check-*")) <= scratch  # its scratch folder is gone


def test_the_strict_policy_message_points_to_check() -> None:
    schema = Schema.model_validate(SCHEMA)
    table = rows()
    table[0]["cond"] = "Very good"
    with pytest.raises(ValidationFailed) as exc:
        validate(pl.DataFrame(table), schema, "strict")
    assert CHECK_ADVICE in str(exc.value) and "privflow check --data FILE --schema S" in CHECK_ADVICE


def test_help() -> None:
    result = runner.invoke(app, ["check", "--help"])
    assert result.exit_code == 0 and "Curator-only" in result.output and "--examples" in result.output
