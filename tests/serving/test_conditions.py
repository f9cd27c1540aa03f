"""Conditional sampling: `privflow generate --where COL=VALUE` (and `COL>=V`, `COL!=V`,
`COL=LOW..HIGH` on integer, numeric, date and datetime columns) and `Synthesizer.sample(n,
where=...)`. Exactly n rows, every one meeting every condition (AND), drawn from the model's
conditional law (the target through its head, everything else by rejection); the seed reproduces
them; bad conditions and conditions too rare to reach n are one paragraph, exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.errors import ConfigError
from privflow.serving import conditions as cond
from privflow.serving.conditions import Conditions, conditions_for, parse_where

MODEL = "privflow-adult"  # the shared trained store's model (tests/stores.py); its target is income


@pytest.fixture(scope="module")
def store(trained_store: dict, tmp_path_factory) -> Path:
    """A copy of the session's shared trained store (generate opens its MLflow database)."""
    from tests import stores

    return stores.copy_store(trained_store["store"], tmp_path_factory.mktemp("conditional") / "store")


@pytest.fixture(scope="module")
def synth(store: Path):
    from privflow.api import Synthesizer

    return Synthesizer.load(MODEL, "champion", store)


def _generate(store: Path, out: Path, n: int, *extra: str, seed: int = 3):
    args = ["generate", "--model", f"{MODEL}@champion", "-n", str(n), "-o", str(out), "--seed", str(seed)]
    return CliRunner().invoke(app, [*args, *extra, "--store", str(store)])


def _one_paragraph_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "Traceback" not in result.output and "\n\n" not in result.output.strip()
    for needle in needles:
        assert needle in text, text
    return text


def _tv(a: pl.Series, b: pl.Series) -> float:
    """Total variation distance between two columns' category shares."""
    pa, pb = a.cast(pl.String).value_counts(normalize=True), b.cast(pl.String).value_counts(normalize=True)
    j = pa.join(pb, on=a.name, how="full", coalesce=True).fill_null(0.0)
    return 0.5 * float(np.abs(j["proportion"] - j["proportion_right"]).sum())


# -- the target: through the head ----------------------------------------------------------------


def test_a_target_condition_gives_n_rows_of_that_class_and_shifts_the_other_columns(synth) -> None:
    """The flow is not conditional on the target: the other columns must follow p(x | t = v),
    i.e. the flow's rows weighted by the head's p(v | x). So rows conditioned on '>50K' carry a
    higher head probability of '>50K' than unconditional rows (E[p^2]/E[p] >= E[p])."""
    from privflow.data.target_head import TargetCodec

    assert isinstance(synth.codec, TargetCodec)
    rows = synth.sample(1000, seed=11, where={"income": ">50K"})
    assert rows.height == 1000 and rows["income"].cast(pl.String).unique().to_list() == [">50K"]
    assert rows.columns == synth.schema.names
    free = synth.sample(1000, seed=12)
    p_cond = np.exp(synth.codec.head_log_probs(rows.drop("income"))[:, 1]).mean()
    p_free = np.exp(synth.codec.head_log_probs(free.drop("income"))[:, 1]).mean()
    assert p_cond > p_free + 0.03, (p_cond, p_free)


# -- any other categorical column: rejection -----------------------------------------------------


def test_a_non_target_condition_keeps_matching_rows_from_the_conditional(synth) -> None:
    married = {"marital-status": "Married-civ-spouse"}
    rows = synth.sample(800, seed=21, where=married)
    assert rows.height == 800 and (rows["marital-status"].cast(pl.String) == "Married-civ-spouse").all()
    free = synth.sample(3000, seed=22)
    kept = free.filter(pl.col("marital-status").cast(pl.String) == "Married-civ-spouse")
    # the same law as the matching rows of an unconditional table (a subset-like distribution) ...
    for col in ("relationship", "sex", "income"):
        assert _tv(rows[col], kept[col]) < 0.1, col
    # ... which differs from the unconditional one where the model ties the columns (the head:
    # income given marital status)
    share = (rows["income"].cast(pl.String) == ">50K").mean()
    assert share > (free["income"].cast(pl.String) == ">50K").mean() + 0.03


def test_conditions_combine_with_and_through_the_cli(store: Path, synth, tmp_path: Path) -> None:
    out = tmp_path / "both.csv"
    res = _generate(store, out, 150, "--where", "sex=Female", "--where", "income=>50K", seed=31)
    assert res.exit_code == 0, res.output
    assert "wrote 150 rows where sex=Female AND income=>50K" in " ".join(res.output.split())
    table = pl.read_csv(out, infer_schema=False)
    assert table.height == 150
    assert (table["sex"] == "Female").all() and (table["income"] == ">50K").all()
    # the file holds the rows the API draws for the same seed and conditions
    api = synth.sample(150, seed=31, where={"sex": "Female", "income": ">50K"})
    for name in api.columns:
        assert table[name].fill_null("").to_list() == api[name].cast(pl.String).fill_null("").to_list(), name


def test_the_seed_reproduces_and_workers_do_not_matter(synth) -> None:
    from privflow.serving.sampler import sample_rows

    where = {"sex": "Female", "income": ">50K"}
    a = synth.sample(120, seed=41, where=where)
    assert a.equals(synth.sample(120, seed=41, where=where))
    assert not a.equals(synth.sample(120, seed=42, where=where))
    flows, codec = synth.flows, synth.codec
    one = sample_rows([*flows, *flows], codec, 300, seed=7, batch=256, workers=1, where=where)
    three = sample_rows([*flows, *flows], codec, 300, seed=7, batch=256, workers=3, where=where)
    assert one.equals(three) and one.height == 300
    assert sample_rows(flows, codec, 50, seed=7).height == 50  # unconditional sampling as before


# -- too rare ------------------------------------------------------------------------------------


def test_a_condition_too_rare_to_reach_n_exits_2_with_the_draws_and_rate(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cond, "MIN_DRAW_CAP", 3000)
    monkeypatch.setattr(cond, "DRAWS_PER_ROW", 1)
    out = tmp_path / "rare.csv"
    res = _generate(store, out, 200, "--where", "native-country=Puerto-Rico")
    _one_paragraph_error(
        res,
        "native-country=Puerto-Rico is too rare",
        "rows drawn from the model",
        "accepted",
        "rate of",
        "cap",
        "widen a condition",
    )
    assert not out.exists() and not list(tmp_path.iterdir())


def test_none_matched_within_the_cap_is_refused() -> None:
    """The bookkeeping alone: rounds that keep nothing stop at the cap (or before it, once the
    projected draws exceed it), naming the draws tried and the rate seen."""
    c = Conditions({"sex": "Female"})
    empty = pl.DataFrame({"sex": pl.Series([], dtype=pl.String)})
    endless = ((empty, 0.0, 50_000) for _ in range(10_000))
    with pytest.raises(ConfigError) as err:
        list(c.collect(endless, 10, 1, np.random.default_rng(0)))
    text = str(err.value)
    assert "none of the" in text and "rows drawn" in text and "(0% accepted; an estimated rate of 0)" in text
    assert f"of the {c.tally.drawn:,} rows drawn" in text and c.tally.kept == 0  # the tally follows the draws
    assert f"{cond.draw_cap(10):,}" in text
    assert cond.draw_cap(10) == cond.MIN_DRAW_CAP and cond.draw_cap(10**6) == cond.DRAWS_PER_ROW * 10**6


def test_the_last_round_gives_exactly_n_rows() -> None:
    c = Conditions({"sex": "Female"})
    part = pl.DataFrame({"sex": ["Female"] * 30, "i": list(range(30))})
    got = list(c.collect(iter([(part, 30.0, 60), (part, 30.0, 60)]), 45, 1, np.random.default_rng(0)))
    table = pl.concat(got)
    assert table.height == 45 and table["i"].head(30).to_list() == list(range(30))
    assert table["i"].tail(15).is_sorted()


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "needles"),
    [
        (["sex"], ["--where 'sex' is not a condition", "COLUMN=VALUE"]),
        (["=Female"], ["is not a condition"]),
        (["sex="], ["is not a condition"]),
        (["sex=Female", "sex=Male"], ["two values", "'Female' and 'Male'"]),
        (["age=40", "age=41"], ["two values", "'40' and '41'"]),
        (["age>"], ["is not a condition", "COLUMN>=VALUE", "COLUMN=LOW..HIGH"]),
        (["!=3"], ["is not a condition"]),
    ],
)
def test_a_malformed_where_exits_2_before_the_store_is_opened(tmp_path: Path, where, needles) -> None:
    """The form is checked before anything is loaded: even a store that is not there is not
    the first complaint."""
    args = [a for w in where for a in ("--where", w)]
    res = _generate(tmp_path / "no-store", tmp_path / "o.csv", 10, *args)
    _one_paragraph_error(res, *needles)
    assert "no model registry" not in res.output


@pytest.mark.parametrize(
    ("where", "needles"),
    [
        ("sexx=Female", ["has no column 'sexx'", "Did you mean 'sex'?", "categorical columns are"]),
        ("sex>Female", ["column 'sex' is categorical", "takes COLUMN=LABEL only"]),
        ("income<=50K", ["takes COLUMN=LABEL only", "Did you mean --where 'income=<=50K'"]),
        ("sex=female", ["'female' is not a category of column 'sex'", "'Female', 'Male'", "Did you mean 'Female'?"]),
        ("education=Bachelor", ["not a category of column 'education'", "Did you mean 'Bachelors'?"]),
    ],
)
def test_a_where_the_schema_refuses_exits_2_before_sampling(store: Path, tmp_path: Path, where, needles) -> None:
    out = tmp_path / "o.csv"
    _one_paragraph_error(_generate(store, out, 10, "--where", where), *needles)
    assert not out.exists()


def test_the_api_checks_where_against_the_schema(synth) -> None:
    with pytest.raises(ConfigError, match="not a whole number"):
        synth.sample(5, where={"hours-per-week": "40.5"})
    with pytest.raises(ConfigError, match="wholly outside the public bounds"):
        synth.sample(5, where={"age": (120, 130)})
    with pytest.raises(ConfigError, match="must be a mapping"):
        synth.sample(5, where="sex=Female")
    with pytest.raises(ConfigError, match="must be a category label"):
        synth.sample(5, where={"sex": None})
    assert synth.sample(5, seed=1, where={}).height == 5  # no condition: plain sampling


def test_parse_where_splits_at_the_first_operator() -> None:
    got = [(c.column, c.op, c.value) for c in parse_where(["a = x=y ", "b=c", "income=>50K"])]
    assert got == [("a", "=", "x=y"), ("b", "=", "c"), ("income", "=", ">50K")]
    assert parse_where(None) == () and len(parse_where(["b=c", "b=c"])) == 1


def test_a_boolean_column_is_conditionable_on_its_labels(demo_dir: Path) -> None:
    """A column whose modelled form is categorical (a boolean: its two labels) takes conditions."""
    from privflow.data.schema import Schema

    try:
        schema = Schema.model_validate(
            {
                "dataset": {"name": "toy"},
                "columns": [
                    {"name": "smoker", "type": "boolean", "labels": ["yes", "no"]},
                    {"name": "age", "type": "integer", "bounds": [0, 100]},
                ],
            }
        )
    except Exception:  # noqa: BLE001 - a schema without the boolean type yet
        pytest.skip("the schema has no boolean column type")
    assert conditions_for(schema, {"smoker": "yes"}).values == {"smoker": "yes"}
    with pytest.raises(ConfigError, match="'yes', 'no'"):
        conditions_for(schema, {"smoker": "true"})


# -- numbers, dates and datetimes ----------------------------------------------------------------

TYPES = """
dataset: {name: types, expected_rows: 1000}
columns:
  - {name: admitted, type: date, bounds: ['2015-01-01', '2024-12-31'], format: '%d/%m/%Y', nullable: true}
  - {name: seen_at, type: datetime, bounds: ['2020-01-01T00:00:00', '2020-12-31T23:59:59'], granularity: minute}
  - {name: smoker, type: boolean, labels: ['yes', 'no']}
  - {name: patient_id, type: id}
  - {name: weight, type: numeric, bounds: [-30, 200], decimals: 2, nullable: true}
  - {name: ratio, type: numeric, bounds: [0, 1], atoms: [0]}
  - {name: visits, type: integer, bounds: [0, 20]}
"""


@pytest.fixture(scope="module")
def types_synth():
    """A release of every bounded type (a one-block MAF at its seeded initial weights: sampling
    only, no training), as `Synthesizer(schema, flows)` holds it."""
    import torch
    import yaml

    from privflow.api import Synthesizer
    from privflow.data.schema import Schema
    from privflow.data.target_head import release_codec
    from privflow.models import build_flow

    schema = Schema.validated(yaml.safe_load(TYPES))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        flow = build_flow("maf", release_codec(schema, None).cardinalities, blocks=1, hidden=8).eval()
    return Synthesizer(schema, [flow])


def _bounds(c) -> tuple:
    return (c.low, c.high, c.low_open, c.high_open, c.not_equal)


@pytest.mark.parametrize(
    ("item", "want"),
    [
        ("age>=40", ("age", ">=", "40")),
        (" age > 40 ", ("age", ">", "40")),
        ("age<=40", ("age", "<=", "40")),
        ("age<40", ("age", "<", "40")),
        ("x==3", ("x", "==", "3")),
        ("x!=-3", ("x", "!=", "-3")),
        ("age=30..50", ("age", "=", "30..50")),
        ("when=01/02/2020 .. 05/02/2020", ("when", "=", "01/02/2020 .. 05/02/2020")),
        ("income=>50K", ("income", "=", ">50K")),
        ("a!b=c", ("a!b", "=", "c")),
    ],
)
def test_parse_where_reads_every_form(item: str, want: tuple) -> None:
    (clause,) = parse_where([item])
    assert (clause.column, clause.op, clause.value) == want and clause.text == item.strip()


def test_every_numeric_form_is_checked_against_the_public_schema(types_synth) -> None:
    from datetime import date, datetime

    from privflow.data.schema import time_number

    schema = types_synth.schema
    day = time_number(date(2020, 2, 1), "date")
    noon = time_number(datetime(2020, 6, 1, 12, 30), "datetime")
    cases = {
        "visits>=4": (4, None, False, False, None),
        "visits>4": (4, None, True, False, None),
        "visits<=4": (None, 4, False, False, None),
        "visits<4": (None, 4, False, True, None),
        "visits==4": (4, 4, False, False, None),
        "visits=4": (4, 4, False, False, None),
        "visits!=4": (None, None, False, False, 4),
        "visits=2..6": (2, 6, False, False, None),
        "visits=6..6": (6, 6, False, False, None),
        "weight=-5.5..10.25": (-5.5, 10.25, False, False, None),
        "weight==3.1": (3.1, 3.1, False, False, None),
        "ratio<0.5": (None, 0.5, False, True, None),
        "ratio==0": (0, 0, False, False, None),  # an atom: a point mass, so equality can hold
        "admitted=01/02/2020..05/02/2020": (day, day + 4, False, False, None),
        "seen_at>=2020-06-01T12:30:00": (noon, None, False, False, None),
        "seen_at=>2020-06-01T12:30:00": (noon, None, True, False, None),  # an operator after '='
    }
    for item, want in cases.items():
        got = conditions_for(schema, [item])
        assert got is not None and _bounds(got.numeric[0]) == want, item
    both = conditions_for(schema, ["visits>=4", "smoker=no", "visits<9"])
    assert both.describe() == "visits>=4 AND smoker=no AND visits<9" and both.values == {"smoker": "no"}
    # the API's mapping: a number, a (low, high) pair, a condition's text, a date or datetime
    mapped = {
        "visits": ((2, 6), (2, 6, False, False, None)),
        "weight": (">=1.5", (1.5, None, False, False, None)),
        "ratio": ("!=0", (None, None, False, False, 0)),
        "admitted": (date(2020, 2, 1), (day, day, False, False, None)),
        "seen_at": (datetime(2020, 6, 1, 12, 30), (noon, noon, False, False, None)),
    }
    got = conditions_for(schema, {k: v for k, (v, _) in mapped.items()}, "where")
    assert [_bounds(c) for c in got.numeric] == [w for _, w in mapped.values()]
    assert got.describe() == (
        "visits=2..6 AND weight>=1.5 AND ratio!=0 AND admitted=01/02/2020 AND seen_at=2020-06-01T12:30:00"
    )


@pytest.mark.parametrize(
    ("where", "needles"),
    [
        (["visits>=four"], ["'four' is not a number", "column 'visits' is integer"]),
        (["visits>=4.5"], ["'4.5' is not a whole number"]),
        (["admitted>=2020-02-01"], ["not a date written in the format of column 'admitted', '%d/%m/%Y'", "01/01/2015"]),
        (["seen_at>=tomorrow"], ["'tomorrow' is not a datetime", "'%Y-%m-%dT%H:%M:%S'"]),
        (["visits=6..2"], ["the range is empty", "low end 6 is above its high end 2"]),
        (["visits=30..40"], ["lies wholly outside the public bounds of column 'visits', [0, 20]"]),
        (["visits>20"], ["wholly outside the public bounds"]),
        (["visits<0"], ["wholly outside the public bounds"]),
        (["admitted=01/01/2030..31/12/2030"], ["wholly outside", "[01/01/2015, 31/12/2024]"]),
        (["visits=2.."], ["a range is written COLUMN=LOW..HIGH with both ends"]),
        (["visits>=2..6"], ["a range is written COLUMN=LOW..HIGH"]),
        (["ratio==0.5"], ["numeric without `decimals`", "give a range"]),
        (["weight==3.125"], ["written with 2 decimal(s)"]),
        (["seen_at==2020-06-01T12:30:30"], ["holds whole minutes"]),
        (["seen_at=2020-06-01T12:30:10..2020-06-01T12:30:50"], ["holds only whole minutes, and none meets it"]),
        (["visits>10", "visits<5"], ["visits>10 AND visits<5: no value of column 'visits' meets all of these"]),
        (["visits=3..3", "visits!=3"], ["meets all of these together"]),
        (["smoker>yes"], ["column 'smoker' is boolean", "takes COLUMN=LABEL only"]),
        (["patient_id=3"], ["column 'patient_id' is ignore", "no condition applies"]),
        (["visitz>3"], ["has no column 'visitz'", "Did you mean 'visits'?", "datetime columns are 'admitted'"]),
        ({"visits": None}, ["must be a category label (text), a number or date"]),
        ({"visits": (1, 2, 3)}, ["a (low, high) pair for a range"]),
    ],
)
def test_a_numeric_condition_the_schema_refuses_is_one_paragraph(types_synth, where, needles) -> None:
    with pytest.raises(ConfigError) as err:
        conditions_for(types_synth.schema, where)
    text = str(err.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text


def test_values_are_compared_as_the_table_writes_them(types_synth) -> None:
    """Rounded to the column's decimals (49.996 is written 50.00), a datetime's minutes and a
    date's days as decoded; a missing value meets no condition, `!=` included."""
    from datetime import date, datetime

    from privflow.data.schema import time_number

    schema = types_synth.schema
    (below,) = conditions_for(schema, ["weight<50"]).numeric
    assert below.mask(pl.Series("weight", [49.996, 49.994, None, -3.0])).tolist() == [False, True, False, True]
    seen, other = conditions_for(schema, ["seen_at>=2020-06-01T12:30:00", "admitted!=01/02/2020"]).numeric
    minute = time_number(datetime(2020, 6, 1, 12, 30), "datetime") // 60
    assert seen.mask(pl.Series("seen_at", [minute - 1, minute, None])).tolist() == [False, True, False]
    day = time_number(date(2020, 2, 1), "date")
    assert other.mask(pl.Series("admitted", [day, day + 1, None])).tolist() == [False, True, False]


def test_rows_meet_integer_numeric_date_and_datetime_conditions(types_synth) -> None:
    from datetime import date, datetime

    where = {
        "visits": (4, 12),
        "weight": "<100",
        "admitted": "01/06/2016..31/12/2018",
        "seen_at": ">=2020-03-01T00:00:00",
        "smoker": "no",
        "ratio": "!=0",
    }
    rows = types_synth.sample(300, seed=5, where=where)
    assert rows.height == 300 and rows.null_count().sum_horizontal().item() == 0
    assert rows["visits"].is_between(4, 12).all() and (rows["weight"] < 100).all()
    admitted = rows["admitted"].str.strptime(pl.Date, "%d/%m/%Y")
    assert admitted.is_between(date(2016, 6, 1), date(2018, 12, 31)).all()
    assert (rows["seen_at"].str.strptime(pl.Datetime, "%Y-%m-%dT%H:%M:%S") >= datetime(2020, 3, 1)).all()
    assert (rows["smoker"] == "no").all() and (rows["ratio"] != 0).all()
    assert rows.equals(types_synth.sample(300, seed=5, where=where))  # the seed reproduces them


def test_write_samples_shows_and_counts_the_draws(types_synth, tmp_path: Path) -> None:
    from privflow.serving.sampler import _drawn_column, write_samples

    assert _drawn_column(cond.Tally(drawn=12345)).render(None).plain == "12,345 drawn"
    assert cond.percent(cond.Tally(drawn=2000, kept=73).share) == "3.65%"
    schema, codec = types_synth.schema, types_synth.codec
    where = conditions_for(schema, ["visits>=15", "ratio<0.5"])
    out = write_samples(
        types_synth.flows, codec, 80, tmp_path / "s.csv", seed=2, progress=True, schema=schema, where=where
    )
    table = pl.read_csv(out)
    assert table.height == 80 and (table["visits"] >= 15).all() and (table["ratio"] < 0.5).all()
    assert where.tally.drawn >= 80 and 80 <= where.tally.kept <= where.tally.drawn


def test_a_column_whose_name_holds_an_operator_keeps_its_label_condition() -> None:
    from privflow.data.schema import Schema

    schema = Schema.model_validate(
        {
            "dataset": {"name": "toy"},
            "columns": [
                {"name": "a<b", "type": "categorical", "categories": ["x", "y"]},
                {"name": "n", "type": "integer", "bounds": [0, 9]},
            ],
        }
    )
    got = conditions_for(schema, ["a<b=x", "n>=3"])
    assert got.values == {"a<b": "x"} and got.describe() == "a<b=x AND n>=3"


# -- numbers on the shared trained store ---------------------------------------------------------


def test_numeric_and_categorical_conditions_combine_through_the_cli(store: Path, synth, tmp_path: Path) -> None:
    out = tmp_path / "older_women.csv"
    where = ["age>=40", "sex=Female", "hours-per-week=20..45"]
    res = _generate(store, out, 120, *[a for w in where for a in ("--where", w)], seed=51)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "wrote 120 rows where age>=40 AND sex=Female AND hours-per-week=20..45 to" in text
    assert "rows drawn from the model to find them" in text and "met the conditions)" in text
    table = pl.read_csv(out, infer_schema_length=None)
    assert table.height == 120 and (table["age"] >= 40).all() and (table["sex"] == "Female").all()
    assert table["hours-per-week"].is_between(20, 45).all()
    api = synth.sample(120, seed=51, where=where)  # the API takes the CLI's texts: the same rows
    for name in ("age", "hours-per-week", "education"):
        assert table[name].cast(pl.String).to_list() == api[name].cast(pl.String).to_list(), name


def test_a_target_through_its_head_combines_with_numeric_conditions(synth) -> None:
    rows = synth.sample(200, seed=61, where={"income": ">50K", "age": (30, 50), "education-num": ">=10"})
    assert rows.height == 200 and (rows["income"].cast(pl.String) == ">50K").all()
    assert rows["age"].is_between(30, 50).all() and (rows["education-num"] >= 10).all()


@pytest.mark.parametrize(
    ("where", "needles"),
    [
        (["age=120..130"], ["lies wholly outside the public bounds of column 'age', [17, 100]"]),
        (["age=50..30"], ["the range is empty"]),
        (["age>=forty"], ["'forty' is not a number"]),
        (["age>60", "age<30"], ["age>60 AND age<30: no value of column 'age' meets all of these together"]),
        (["agee>30"], ["has no column 'agee'", "Did you mean 'age'?"]),
    ],
)
def test_a_numeric_where_the_schema_refuses_exits_2_before_sampling(store: Path, tmp_path: Path, where, needles):
    out = tmp_path / "o.csv"
    _one_paragraph_error(_generate(store, out, 10, *[a for w in where for a in ("--where", w)]), *needles)
    assert not out.exists()
