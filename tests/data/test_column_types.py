"""Date, datetime, boolean and ignore (id) columns, and numeric `decimals` (privflow/data/lowering.py):
the schema's checks of each new field, lowering to the modelled types, the round trip through
validation, the codec and the output conversion, an unparseable date failing its row (never the
file), and one small real run whose `privflow generate` writes dates in the input's format."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from privflow.core.errors import SchemaError, ValidationFailed
from privflow.data.codec import Codec
from privflow.data.io import read_table, write_table
from privflow.data.lowering import lower, output_names, read_values, to_surface
from privflow.data.schema import Schema
from privflow.data.validation import validate

SCHEMA_YAML = """
dataset: {name: types, expected_rows: 1000}
columns:
  - {name: admitted, type: date, bounds: ['2015-01-01', '2024-12-31'], format: '%d/%m/%Y', nullable: true}
  - {name: seen_at, type: datetime, bounds: ['2020-01-01T00:00:00', '2020-12-31T23:59:59'],
     format: '%Y-%m-%dT%H:%M:%S', granularity: minute}
  - {name: smoker, type: boolean, labels: ['yes', 'no']}
  - {name: patient_id, type: id}
  - {name: weight, type: numeric, bounds: [30, 200], decimals: 1}
  - {name: ward, type: categorical, categories: [a, b, c]}
"""


def schema() -> Schema:
    return Schema.validated(yaml.safe_load(SCHEMA_YAML))


def table(n: int = 200, seed: int = 0) -> pl.DataFrame:
    """A table as a CSV holds it: every value text, in the schema's formats."""
    rng = np.random.default_rng(seed)
    days = rng.integers(0, (date(2024, 12, 31) - date(2015, 1, 1)).days + 1, n)
    minutes = rng.integers(0, 366 * 24 * 60, n)
    return pl.DataFrame(
        {
            "admitted": [(date(2015, 1, 1) + timedelta(days=int(d))).strftime("%d/%m/%Y") for d in days],
            "seen_at": [
                (datetime(2020, 1, 1) + timedelta(minutes=int(m))).strftime("%Y-%m-%dT%H:%M:%S") for m in minutes
            ],
            "smoker": [["yes", "No", " YES ", "no"][i % 4] for i in range(n)],
            "patient_id": [f"P{i:05d}" for i in range(n)],
            "weight": [f"{w:.4f}" for w in rng.uniform(30, 200, n)],
            "ward": [["a", "b", "c"][i % 3] for i in range(n)],
        }
    )


def column(**fields: Any) -> Schema:
    """A schema of one column (`fields`) beside a plain integer column."""
    return Schema.validated(
        {"dataset": {"name": "t"}, "columns": [fields, {"name": "x", "type": "integer", "bounds": [0, 3]}]}
    )


# ---------------------------------------------------------------------------------------------
# the schema's checks


def test_the_documented_spelling_parses_and_survives_a_yaml_round_trip() -> None:
    s = schema()
    assert [c.type for c in s.columns] == ["date", "datetime", "boolean", "ignore", "numeric", "categorical"]
    admitted, seen = s.column("admitted"), s.column("seen_at")
    assert admitted.bound_texts == ["2015-01-01", "2024-12-31"]
    assert seen.bound_texts == ["2020-01-01T00:00:00", "2020-12-31T23:59:59"]
    assert s.column("smoker").true_false == ("yes", "no")
    dumped = yaml.safe_load(s.to_yaml())
    assert dumped["columns"][0]["bounds"] == ["2015-01-01", "2024-12-31"]  # ISO text, as written
    assert Schema.validated(dumped) == s
    assert Schema.model_validate(s.model_dump(mode="json")) == s  # how a release stores it


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "date", "bounds": [date(2015, 1, 1), date(2024, 12, 31)]},  # YAML's unquoted dates
        {"type": "date", "bounds": ["2015-01-01", "2024-12-31"], "atoms": ["2020-02-29"], "nullable": True},
        {"type": "datetime", "bounds": ["2020-01-01", "2020-12-31T23:59:59"]},  # default format and granularity
        {"type": "datetime", "bounds": [datetime(2020, 1, 1), datetime(2021, 1, 1)], "granularity": "hour"},
        {"type": "datetime", "bounds": ["2020-01-01", "2021-01-01"], "granularity": "day", "format": "%d.%m.%Y %H"},
        {"type": "boolean"},
        {"type": "boolean", "labels": ["Y", "N"], "nullable": True},
        {"type": "ignore"},
        {"type": "id"},
        {"type": "numeric", "bounds": [30, 200], "decimals": 0},
        {"type": "numeric", "bounds": [30, 200], "decimals": 15},
    ],
)
def test_good_columns_are_accepted(fields: dict) -> None:
    col = column(name="c", **fields).column("c")
    assert col.type == ("ignore" if fields["type"] == "id" else fields["type"])


def test_unquoted_yaml_dates_are_read_as_dates() -> None:
    doc = yaml.safe_load("{name: d, type: date, bounds: [2015-01-01, 2024-12-31]}")
    assert isinstance(doc["bounds"][0], date)
    assert column(**doc).column("d").bound_texts == ["2015-01-01", "2024-12-31"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": "date"}, "column 'c' is date and needs public bounds"),
        (
            {"type": "date", "bounds": ["2015-13-01", "2016-01-01"]},
            "column 'c' is date; its bounds and atoms are dates",
        ),
        ({"type": "date", "bounds": [1, 2]}, "written as ISO text"),
        ({"type": "date", "bounds": ["2016-01-01", "2015-01-01"]}, "column 'c': bounds must be [low, high]"),
        ({"type": "date", "bounds": ["2015-01-01", "2016-01-15"], "format": "%Y-%m"}, "does not write and read back"),
        ({"type": "date", "bounds": ["2015-01-01", "2016-01-01"], "format": "%Y-%m-%d%z"}, "has a time zone"),
        ({"type": "date", "bounds": ["2015-01-01", "2016-01-01"], "format": 5}, "column 'c': format must be"),
        ({"type": "date", "bounds": ["2015-01-01", "2016-01-01"], "granularity": "day"}, "'granularity' applies to"),
        ({"type": "date", "bounds": ["2015-01-01", "2016-01-01"], "transform": "log1p"}, "'transform' does not apply"),
        ({"type": "date", "bounds": ["2015-01-01", "2016-01-01"], "atoms": ["2017-01-01"]}, "lie outside its bounds"),
        ({"type": "datetime", "bounds": ["2020-01-01", "2021-01-01"], "granularity": "week"}, "granularity must be"),
        (
            {"type": "datetime", "bounds": ["2020-01-01T00:00:00", "2020-01-01T00:00:30"], "granularity": "minute"},
            "more than one minute",
        ),
        (
            {"type": "datetime", "bounds": ["2020-01-01", "2020-01-02T10:00:00"], "format": "%Y-%m-%d"},
            "does not write and read back",
        ),
        ({"type": "datetime", "bounds": ["2020-01-01T00:00:00+01:00", "2021-01-01"]}, "has a time zone"),
        (
            {
                "type": "datetime",
                "bounds": ["2020-01-01", "2021-01-01"],
                "granularity": "hour",
                "atoms": ["2020-05-01T10:30:00"],
            },
            "are not whole hours",
        ),
        ({"type": "boolean", "labels": [True, False]}, "quote each one"),
        ({"type": "boolean", "labels": ["yes"]}, "'labels' must be two texts"),
        ({"type": "boolean", "labels": "yes"}, "labels must be a list"),
        ({"type": "boolean", "labels": ["Yes", "yes"]}, "are the same text"),
        ({"type": "boolean", "labels": [" yes", "no"]}, "have spaces around them"),
        ({"type": "boolean", "categories": ["a", "b"]}, "column 'c' is boolean; 'categories' does not apply"),
        ({"type": "ignore", "bounds": [0, 1]}, "column 'c' is ignore; 'bounds' does not apply"),
        ({"type": "idx"}, "column 'c': type 'idx' is not one of"),
        ({"type": "numeric", "bounds": [0, 1], "decimals": 16}, "decimals must be a whole number from 0 to 15"),
        ({"type": "numeric", "bounds": [0, 1], "decimals": 1.5}, "decimals must be a whole number"),
        ({"type": "numeric", "bounds": [0, 1], "decimals": True}, "decimals must be a whole number"),
        ({"type": "numeric", "bounds": [0.01, 0.04], "decimals": 1}, "no value with 1 decimal(s)"),
        ({"type": "integer", "bounds": [0, 9], "decimals": 1}, "column 'c' is integer; 'decimals' applies to numeric"),
        ({"type": "categorical", "categories": ["a"], "labels": ["a", "b"]}, "'labels' applies to boolean"),
    ],
)
def test_bad_columns_are_one_schema_error_naming_the_column(fields: dict, message: str) -> None:
    with pytest.raises(SchemaError) as err:
        column(name="c", **fields)
    text = str(err.value)
    assert message in text
    assert "'c'" in text
    assert text.count("Value error") + text.count("Input should") == 1  # one problem, one sentence


@pytest.mark.parametrize(
    ("columns", "extra", "message"),
    [
        ([{"name": "i", "type": "id"}], {}, "at least one column must be modelled"),
        ([{"name": "i", "type": "id"}, {"name": "b", "type": "boolean"}], {"target": "i"}, "cannot be the target"),
        (
            [{"name": "d", "type": "date", "bounds": ["2015-01-01", "2016-01-01"]}, {"name": "b", "type": "boolean"}],
            {"target": "d"},
            "must be categorical (or boolean)",
        ),
    ],
)
def test_schema_level_rules(columns: list, extra: dict, message: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(message)):
        Schema.validated({"dataset": {"name": "t"}, "columns": columns, **extra})


def test_a_boolean_label_may_not_be_a_missing_value_token() -> None:
    with pytest.raises(SchemaError, match="both a boolean label and a dataset.missing_values token"):
        Schema.validated(
            {
                "dataset": {"name": "t", "missing_values": ["NA"]},
                "columns": [{"name": "b", "type": "boolean", "labels": ["yes", "na"]}],
            }
        )


def test_a_boolean_target_is_a_categorical_target_once_lowered() -> None:
    s = Schema.validated(
        {
            "dataset": {"name": "t"},
            "columns": [{"name": "b", "type": "boolean"}, {"name": "x", "type": "integer", "bounds": [0, 3]}],
            "target": "b",
        }
    )
    assert lower(s).column("b").categories == ("true", "false")
    assert lower(s).target == "b"


# ---------------------------------------------------------------------------------------------
# lowering


def test_lowering_maps_each_type_to_a_modelled_one() -> None:
    low = lower(schema())
    assert low.names == ["admitted", "seen_at", "smoker", "weight", "ward"]  # the id column is dropped
    admitted, seen, smoker = low.column("admitted"), low.column("seen_at"), low.column("smoker")
    assert (admitted.type, admitted.bounds, admitted.nullable) == ("integer", (16436.0, 20088.0), True)
    epoch = datetime(1970, 1, 1)
    minutes = (
        (datetime(2020, 1, 1) - epoch) // timedelta(minutes=1),
        (datetime(2020, 12, 31, 23, 59) - epoch) // timedelta(minutes=1),
    )
    assert (seen.type, seen.bounds) == ("integer", (float(minutes[0]), float(minutes[1])))
    assert (smoker.type, smoker.categories) == ("categorical", ("yes", "no"))
    assert low.column("weight") == schema().column("weight")
    assert lower(low) is low  # lowering twice is lowering once


def test_a_schema_of_modelled_types_lowers_to_itself(demo_dir: Path) -> None:
    adult = Schema.from_yaml(demo_dir / "adult.yaml")
    lower.cache_clear()  # else an equal schema lowered by an earlier test in this process comes back
    assert lower(adult) is adult


# ---------------------------------------------------------------------------------------------
# input conversion, validation and the round trip


def test_round_trip_validate_encode_decode_and_output_has_the_inputs_format() -> None:
    s, raw = schema(), table()
    typed, report = validate(raw, s, "strict")
    assert report.passed
    assert typed.columns == lower(s).names and "patient_id" not in typed.columns
    assert typed.schema["admitted"] == pl.Int64 and typed.schema["seen_at"] == pl.Int64
    assert set(typed.get_column("smoker").cast(pl.String)) == {"yes", "no"}  # matched case-blind, spaces removed

    codec = Codec.from_schema(lower(s))
    decoded = codec.decode(codec.encode(typed))
    out = to_surface(decoded, s)
    assert out.columns == output_names(s) == ["admitted", "seen_at", "smoker", "weight", "ward"]
    assert out.get_column("admitted").to_list() == raw.get_column("admitted").to_list()  # the same text back
    # a minute's granularity: the seconds go, the format stays
    seen_in = [t[:-2] + "00" for t in raw.get_column("seen_at").to_list()]
    assert out.get_column("seen_at").to_list() == seen_in
    assert out.get_column("smoker").to_list() == [["yes", "no"][i % 2] for i in range(raw.height)]
    weights = out.get_column("weight").to_list()
    assert weights == [round(float(w), 1) for w in raw.get_column("weight").to_list()]
    assert out.get_column("ward").cast(pl.String).to_list() == raw.get_column("ward").to_list()

    again, rep = validate(out.with_columns(pl.lit("x").alias("patient_id")), s, "strict")  # reads back
    assert rep.passed and again.equals(validate(raw, s, "strict")[0].with_columns(pl.col("weight").round(1)))


def test_synthetic_decimals_stay_inside_the_bounds() -> None:
    s = column(name="w", type="numeric", bounds=[0.05, 0.96], decimals=1)
    decoded = pl.DataFrame({"w": [0.05, 0.5, 0.96, 0.123456], "x": [0, 1, 2, 3]})
    assert to_surface(decoded, s).get_column("w").to_list() == [0.1, 0.5, 0.9, 0.1]


def test_an_unparseable_date_fails_its_row_and_not_the_file(tmp_path: Path) -> None:
    s, raw = schema(), table(20)
    bad = raw.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("2019-13-45")).otherwise(pl.col("admitted")).alias("admitted"),
        pl.when(pl.int_range(pl.len()) == 7).then(pl.lit("soon")).otherwise(pl.col("seen_at")).alias("seen_at"),
    )
    path = write_table(bad, tmp_path / "t.csv")
    clean, report = validate(read_table(path), s, "quarantine", tmp_path / "q.csv")
    assert clean.height == 18 and report.failing_rows == 2 and not report.schema_level
    by = report.by_column()
    assert [(f.check, f.failing_rows) for f in by["admitted"]] == [("type", 1)]
    assert "not a date in the format '%d/%m/%Y'" in by["admitted"][0].detail
    assert [(f.check, f.failing_rows) for f in by["seen_at"]] == [("type", 1)]
    quarantined = pl.read_csv(tmp_path / "q.csv", infer_schema=False)
    assert quarantined.get_column("_privflow_row").to_list() == ["3", "7"]

    stopped: list[tuple[int, int]] = []
    clean, report = validate(read_table(path), s, "strict", gate=lambda f, p: bool(stopped.append((f, p))))
    assert stopped == [(2, 18)] and clean.height == 18  # the DP gate gets the count; the file is read
    with pytest.raises(ValidationFailed, match="not a date in the format"):
        validate(read_table(path), s, "strict")  # without a gate (score, the API): the rows are named, counted


def test_dates_outside_bounds_and_unknown_booleans_are_row_failures() -> None:
    s, raw = schema(), table(6)
    bad = raw.with_columns(
        pl.Series("admitted", ["01/01/2014", None, *raw.get_column("admitted").to_list()[2:]]),
        pl.Series("smoker", ["maybe", *raw.get_column("smoker").to_list()[1:]]),
    )
    clean, report = validate(bad, s, "quarantine", Path("/dev/null"))
    by = {c: [(f.check, f.failing_rows, f.detail) for f in fs] for c, fs in report.by_column().items()}
    assert by["admitted"] == [("bounds", 1, "1 row outside the public bounds [2015-01-01, 2024-12-31]")]
    assert by["smoker"] == [("category", 1, "1 row with a value that is neither 'yes' nor 'no'")]
    assert clean.height == 5  # row 0 fails both; the null date is allowed (nullable)


def test_dates_and_datetimes_clamp_in_their_units() -> None:
    """Under `on_out_of_bounds: clamp` a date is clamped to the nearest bound in days, a datetime in
    units of its granularity (minutes here), as the bounds are checked; booleans take no `other`."""
    doc = yaml.safe_load(SCHEMA_YAML)
    doc["dataset"]["on_out_of_bounds"] = "clamp"
    s, raw = Schema.validated(doc), table(4)
    bad = raw.with_columns(
        pl.Series("admitted", ["01/01/2014", "31/12/2030", *raw.get_column("admitted").to_list()[2:]]),
        pl.Series("seen_at", ["2019-12-31T23:59:59", "2021-06-01T10:30:00", *raw.get_column("seen_at").to_list()[2:]]),
    )
    clean, report = validate(bad, s, "strict")
    assert report.passed and clean.height == 4
    model = lower(s)
    assert clean["admitted"].to_list()[:2] == [int(b) for b in model.column("admitted").bounds or ()]
    assert clean["seen_at"].to_list()[:2] == [int(b) for b in model.column("seen_at").bounds or ()]
    assert [(a.column, a.change, a.values) for a in report.adjustments] == [
        ("admitted", "clamped", 2),
        ("seen_at", "clamped", 2),
    ]
    assert "[2015-01-01, 2024-12-31]" in report.adjustments[0].detail
    with pytest.raises(SchemaError, match="'other' applies to categorical columns only"):
        Schema.validated({**doc, "columns": [{"name": "b", "type": "boolean", "other": "yes"}]})


def test_an_ignored_column_is_never_read() -> None:
    """Nulls, numbers or garbage in an id column fail nothing, and none of it reaches the typed frame."""
    s, raw = schema(), table(10)
    odd = raw.with_columns(pl.Series("patient_id", [None, "", "\x00", "999999999999999999999", *["x"] * 6]))
    clean, report = validate(odd, s, "strict")
    assert report.passed and clean.height == 10 and "patient_id" not in clean.columns


def test_parquet_dates_datetimes_and_booleans_are_read_as_stored(tmp_path: Path) -> None:
    from privflow.preflight import check_table

    s, raw = schema(), table(30)
    typed_text, _ = validate(raw, s, "strict")
    native = raw.with_columns(
        pl.col("admitted").str.strptime(pl.Date, "%d/%m/%Y"),
        pl.col("seen_at").str.strptime(pl.Datetime("us"), "%Y-%m-%dT%H:%M:%S"),
        pl.col("smoker").str.strip_chars().str.to_lowercase().eq("yes").alias("smoker"),
        pl.col("patient_id").str.slice(1).cast(pl.Int64),
        pl.col("weight").cast(pl.Float64),
    )
    path = write_table(native, tmp_path / "t.parquet")
    check_table(path, s)  # pre-flight admits the stored types
    typed, report = validate(read_table(path), s, "strict")
    assert report.passed and typed.equals(typed_text)

    with pytest.raises(Exception, match="admitted"):  # a float column cannot hold dates: refused for free
        check_table(write_table(native.with_columns(pl.lit(1.5).alias("admitted")), tmp_path / "f.parquet"), s)


def test_read_values_never_raises_on_row_content() -> None:
    col = schema().column("admitted")
    s = pl.Series("admitted", ["31/12/2024", "29/02/2021", "00/00/0000", "01/01/99999", "é", "1" * 500, None])
    units, bad = read_values(s, col)
    assert units.to_list()[0] == (date(2024, 12, 31) - date(1970, 1, 1)).days
    assert bad.to_list() == [False, True, True, True, True, True, False]


def test_the_pyfunc_signature_lists_the_synthetic_columns() -> None:
    from privflow.tasks.mlflow_store import signature_for

    outputs = signature_for(schema()).outputs.to_dict()
    assert [c["name"] for c in outputs] == output_names(schema())
    assert {c["name"]: c["type"] for c in outputs}["admitted"] == "string"


# ---------------------------------------------------------------------------------------------
# end to end: a real (tiny) run, then `privflow generate`


def test_a_run_and_generate_write_dates_in_the_inputs_format(
    tmp_path: Path, cli_process_state: None, new_store: Path
) -> None:
    from typer.testing import CliRunner

    from privflow.cli import app
    from privflow.flows.pipeline import train_in_process
    from tests.data_slices import small_config

    data = write_table(table(1000, seed=1), tmp_path / "types.csv")
    schema_path = tmp_path / "types.yaml"
    schema_path.write_text(SCHEMA_YAML)
    store = new_store
    config = small_config(data, schema_path, store, "privflow-types", 2.0, evaluate={"synthetic_rows": 100})
    summary = train_in_process(config, show_progress=False)

    out = tmp_path / "generated.csv"
    res = CliRunner().invoke(
        app, ["generate", "--model", "privflow-types@champion", "-n", "60", "-o", str(out), "--store", str(store)]
    )
    assert res.exit_code == 0, res.output
    for path in (Path(summary.synthetic_path), out):
        rows = pl.read_csv(path, infer_schema=False)
        assert rows.columns == ["admitted", "seen_at", "smoker", "weight", "ward"]  # no patient_id
        assert all(re.fullmatch(r"\d\d/\d\d/\d{4}", d) for d in rows.get_column("admitted").drop_nulls())
        assert all(re.fullmatch(r"2020-\d\d-\d\dT\d\d:\d\d:00", t) for t in rows.get_column("seen_at"))
        assert set(rows.get_column("smoker")) <= {"yes", "no"}
        assert all(re.fullmatch(r"\d+\.\d", w) for w in rows.get_column("weight"))
        _, report = validate(rows.with_columns(pl.lit("P").alias("patient_id")), schema(), "strict")
        assert report.passed  # what privflow writes reads back under the same schema


def test_an_iso_utc_datetime_is_drafted_read_and_written_back_with_its_z() -> None:
    """'2013-01-01T06:00:00Z' (ISO 8601 in UTC, as exports write it) is a datetime to the draft's
    kind counts, not text, and a column with that format reads and writes the same text."""
    from privflow.data import draft as dd

    texts = [f"2013-01-{1 + i // 24:02d}T{i % 24:02d}:00:00Z" for i in range(240)]
    kind = dd.decide_kind("time_hour", dd.kind_counts(pl.Series(texts)), 240.0, 1.0, 1.0).suggestion
    assert (kind.type, kind.format, kind.granularity) == ("datetime", "%Y-%m-%dT%H:%M:%SZ", "hour")
    col = {"name": "time_hour", "type": "datetime", "format": kind.format, "granularity": "hour"}
    col["bounds"] = ["2013-01-01T00:00:00", "2013-12-31T23:00:00"]
    s = Schema.model_validate({"dataset": {"name": "weather"}, "columns": [col]})
    typed, report = validate(pl.DataFrame({"time_hour": texts}), s, "strict")
    assert report.passed
    assert to_surface(typed, s).get_column("time_hour").to_list() == texts
