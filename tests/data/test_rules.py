"""Rules between columns (privflow/data/rules.py, issue 44): the schema's `rules:` list (inequality,
combinations, conditional, missing_together) parsed and checked when the schema loads, each schema
error naming the rule; the one evaluation on frames with missing values (SDV's semantics: a missing
value breaks only missing_together); the sampler never releasing a row that breaks a rule, with or
without --where and through the target head, counting the draws it rejected and refusing a rule
the model almost never meets; and `privflow check` counting the real rows that break each rule
without failing them. No training: the sampler's tests draw from a seeded untrained flow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from privflow.core.errors import ConfigError, SchemaError
from privflow.data.lowering import lower
from privflow.data.rules import broken, counts, curator_lines, reflected
from privflow.data.schema import Schema, time_number
from privflow.serving import conditions as cond
from privflow.serving.conditions import Conditions, conditions_for, with_rules

COLUMNS = """
dataset: {name: storms, expected_rows: 1000}
columns:
  - {name: status, type: categorical, categories: [HU, TS, TD]}
  - {name: wind, type: integer, bounds: [0, 200]}
  - {name: low, type: numeric, bounds: [0, 100], decimals: 1}
  - {name: high, type: numeric, bounds: [0, 100], decimals: 1}
  - {name: country, type: categorical, categories: [US, FR, DE]}
  - {name: currency, type: categorical, categories: [USD, EUR]}
  - {name: start, type: date, bounds: ['2020-01-01', '2020-12-31'], nullable: true}
  - {name: end, type: date, bounds: ['2020-01-01', '2020-12-31'], nullable: true}
  - {name: seen, type: datetime, bounds: ['2020-01-01T00:00:00', '2020-12-31T23:59:00'], granularity: minute}
  - {name: reason, type: categorical, categories: [a, b], nullable: true}
  - {name: smoker, type: boolean, labels: ['yes', 'no']}
  - {name: patient_id, type: id}
"""

RULES = """
rules:
  - {kind: inequality, low: low, high: high, strict: true}
  - {kind: inequality, low: start, high: end}
  - kind: combinations
    columns: [country, currency]
    allowed: [[US, USD], [FR, EUR], [DE, EUR]]
  - kind: conditional
    when: {column: status, one_of: [HU]}
    then: {column: wind, op: '>=', value: 64}
  - kind: conditional
    name: smokers are seen from June
    when: {column: smoker, one_of: ['yes']}
    then: {column: seen, op: '>=', value: 2020-06-01T00:00:00}
  - {kind: missing_together, columns: [end, reason]}
"""

LABELS = [
    "low < high",
    "start <= end",
    "combinations of country, currency",
    "if status = HU then wind >= 64",
    "smokers are seen from June",
    "end, reason missing together",
]


def schema(rules: str = RULES) -> Schema:
    return Schema.validated(yaml.safe_load(COLUMNS + rules))


def with_one(rule: dict) -> Schema:
    doc = yaml.safe_load(COLUMNS)
    doc["rules"] = [rule]
    return Schema.validated(doc)


# -- parsing --------------------------------------------------------------------------------------


def test_every_kind_parses_with_its_label_and_round_trips() -> None:
    s = schema()
    assert [r.kind for r in s.rules] == [
        "inequality",
        "inequality",
        "combinations",
        "conditional",
        "conditional",
        "missing_together",
    ]
    assert [r.label for r in s.rules] == LABELS
    assert s.rules[2].allowed == (("US", "USD"), ("FR", "EUR"), ("DE", "EUR"))
    # YAML's unquoted datetime is kept as ISO text, as a temporal column's bounds are written
    assert s.rules[4].then.value == "2020-06-01T00:00:00"
    assert Schema.model_validate(s.model_dump(mode="json")) == s  # as a release stores it
    dumped = s.to_yaml()
    assert Schema.validated(yaml.safe_load(dumped)) == s
    assert "null" not in dumped.split("rules:")[1]  # a rule is written without its unset fields
    # a schema without rules is written as before: no `rules` key
    plain = schema("")
    assert plain.rules == () and "rules" not in plain.model_dump() and "rules" not in plain.to_yaml()


def test_numbers_in_labels_become_text_and_one_value_is_a_list_of_one() -> None:
    doc = yaml.safe_load(COLUMNS)
    doc["columns"][4]["categories"] = ["1", "2", "3"]
    doc["rules"] = [
        {"kind": "combinations", "columns": ["country", "currency"], "allowed": [[1, "USD"], [2, "EUR"]]},
        {
            "kind": "conditional",
            "when": {"column": "status", "one_of": "HU"},
            "then": {"column": "country", "one_of": 3},
        },
    ]
    s = Schema.validated(doc)
    assert s.rules[0].allowed == (("1", "USD"), ("2", "EUR"))
    assert s.rules[1].when.one_of == ("HU",) and s.rules[1].then.one_of == ("3",)
    assert s.rules[1].label == "if status = HU then country = 3"


def test_an_integer_and_a_numeric_column_compare() -> None:
    rule = with_one({"kind": "inequality", "low": "wind", "high": "low", "strict": True}).rules[0]
    assert rule.label == "wind < low" and rule.columns == ("wind", "low")


def test_lowering_keeps_the_rules_and_their_labels_in_modelled_units() -> None:
    """The modelled schema (what the codec and the sampler hold) carries the rules; a datetime
    value becomes units of the column's granularity, a date's days stay days."""
    from datetime import datetime

    s = schema()
    model = lower(s)
    assert [r.label for r in model.rules] == LABELS
    minutes = time_number(datetime(2020, 6, 1), "datetime") // 60
    assert model.rules[4].then.value == minutes
    assert model.rules[:4] == s.rules[:4] and model.rules[5] == s.rules[5]
    assert lower(model) is model  # lowering twice is lowering once


def test_the_target_s_schema_without_it_drops_the_rules() -> None:
    """The flow's codec beside a target head is the schema without the target: it holds no rule
    (the rules are read on whole rows, the target included)."""
    assert schema().without("status").rules == ()


# -- schema errors: each names the rule -----------------------------------------------------------

INEQ = {"kind": "inequality", "low": "low", "high": "high"}
COND = {"kind": "conditional", "when": {"column": "status", "one_of": ["HU"]}}


@pytest.mark.parametrize(
    ("rule", "needles"),
    [
        ({"low": "low", "high": "high"}, ["rule 1 needs a `kind`", "inequality, combinations, conditional"]),
        ({"kind": "range", "low": "low"}, ["rule 1 needs a `kind`", "got 'range'"]),
        ({**INEQ, "hihg": "x"}, ["rule 1 (inequality).hihg", "Extra inputs are not permitted"]),
        ({"kind": "inequality", "low": "low"}, ["rule 1 (inequality).high", "Field required"]),
        ({**INEQ, "low": "lwo"}, ["rule 1 (lwo <= high): column 'lwo' is not declared", "did you mean 'low'?"]),
        ({**INEQ, "low": "patient_id"}, ["rule 1 (patient_id <= high): column 'patient_id' is ignore (id)"]),
        ({**INEQ, "low": "high"}, ["rule 1 (high <= high): names column 'high' twice"]),
        ({**INEQ, "low": "status"}, ["an inequality compares two numeric or integer", "'status' is categorical"]),
        ({**INEQ, "low": "start", "high": "seen"}, ["'start' is date and 'seen' is datetime"]),
        ({**INEQ, "low": "wind", "high": "start"}, ["'wind' is integer and 'start' is date"]),
        (
            {"kind": "combinations", "columns": ["country", "wind"], "allowed": [["US", "1"]]},
            ["rule 1 (combinations of country, wind): combinations are categorical", "'wind' is integer"],
        ),
        (
            {"kind": "combinations", "columns": ["country", "currency"], "allowed": [["US"]]},
            ["allowed combination ['US'] has 1 value(s) for the 2 columns (country, currency)"],
        ),
        (
            {"kind": "combinations", "columns": ["country", "currency"], "allowed": [["US", "usd"]]},
            ["'usd' is not a value of column 'currency'", "'USD', 'EUR'", "did you mean 'USD'?"],
        ),
        (
            {"kind": "combinations", "columns": ["country", "currency"], "allowed": [["US", "USD"], ["US", "USD"]]},
            ["allowed combination ['US', 'USD'] is listed twice"],
        ),
        (
            {"kind": "combinations", "columns": ["country", "currency"], "allowed": ["US"]},
            ["each allowed combination is a list of values, one per column"],
        ),
        (
            {"kind": "combinations", "columns": ["smoker", "country"], "allowed": [[True, "US"]]},
            ["not text: YAML reads unquoted yes, no"],
        ),
        ({"kind": "combinations", "columns": ["country"], "allowed": [["US"]]}, ["rule 1 (combinations).columns"]),
        (
            {
                "kind": "conditional",
                "when": {"column": "wind", "one_of": ["3"]},
                "then": {"column": "status", "one_of": ["HU"]},
            },
            ["rule 1 (if wind = 3 then status = HU): `when` takes categorical (or boolean) columns", "is integer"],
        ),
        (
            {
                **COND,
                "then": {"column": "wind", "op": ">=", "value": 64},
                "when": {"column": "status", "one_of": ["Hu"]},
            },
            ["'Hu' is not a value of column 'status'", "did you mean 'HU'?"],
        ),
        ({**COND, "then": {"column": "status", "one_of": ["TS"]}}, ["names column 'status' twice"]),
        (
            {**COND, "then": {"column": "wind", "op": ">=", "value": 64, "one_of": ["1"]}},
            ["rule 1 (conditional).then", "gives both `one_of` and `op`/`value`"],
        ),
        ({**COND, "then": {"column": "wind", "op": ">="}}, ["needs `one_of: [...]`", "or both `op`"]),
        ({**COND, "then": {"column": "wind", "op": "=>", "value": 64}}, ["rule 1 (conditional).then.op"]),
        (
            {**COND, "then": {"column": "wind", "one_of": ["64"]}},
            ["`then.one_of` takes categorical (or boolean) columns", "'wind' is integer", "give `then.op`"],
        ),
        (
            {**COND, "then": {"column": "country", "op": "==", "value": "US"}},
            ["`then.op` and `then.value` compare a numeric", "'country' is categorical", "give `then.one_of`"],
        ),
        (
            {**COND, "then": {"column": "wind", "op": ">=", "value": "64"}},
            ["'wind' is integer, so `then.value` is a number"],
        ),
        ({**COND, "then": {"column": "wind", "op": ">=", "value": True}}, ["then.value must be a number", "booleans"]),
        (
            {**COND, "then": {"column": "start", "op": ">=", "value": "01/03/2020"}},
            ["'start' is date, so `then.value` is a date as ISO text", "'2020-01-01'"],
        ),
        (
            {**COND, "then": {"column": "seen", "op": ">=", "value": "2020-06-01T12:30:30"}},
            ["2020-06-01T12:30:30 is not a whole minute (the granularity of column 'seen')"],
        ),
        (
            {**COND, "then": {"column": "wind", "op": ">", "value": 200}},
            ["no value of column 'wind' within its public bounds [0, 200] meets wind > 200", "status = HU"],
        ),
        (
            {**COND, "then": {"column": "wind", "op": "==", "value": 6.5}},
            ["no value of column 'wind' within its public bounds"],
        ),
        (
            {**COND, "then": {"column": "start", "op": "<", "value": "2020-01-01"}},
            ["bounds [2020-01-01, 2020-12-31] meets start < 2020-01-01"],
        ),
        (
            {**COND, "then": {"column": "low", "op": "==", "value": 3.25}},
            ["no value of column 'low' within its public bounds"],  # decimals: 1
        ),
        (
            {"kind": "missing_together", "columns": ["end", "wind"]},
            ["rule 1 (end, wind missing together): column 'wind' is not nullable"],
        ),
        (
            {"kind": "inequality", "low": "low", "high": "high", "name": ""},
            ["rule 1 (inequality).name", "at least 1 character"],
        ),
    ],
)
def test_a_rule_that_cannot_hold_is_a_schema_error_naming_it(rule: dict, needles: list[str]) -> None:
    with pytest.raises(SchemaError) as err:
        with_one(rule)
    text = str(err.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize(
    ("cols", "rule", "needles"),
    [
        (
            {"a": {"type": "numeric", "bounds": [10, 20]}, "b": {"type": "numeric", "bounds": [0, 5]}},
            {"kind": "inequality", "low": "a", "high": "b"},
            ["rule 1 (a <= b): no values within the columns' public bounds meet it", "'a' is at least 10"],
        ),
        (
            {"a": {"type": "integer", "bounds": [5, 9]}, "b": {"type": "integer", "bounds": [0, 5]}},
            {"kind": "inequality", "low": "a", "high": "b", "strict": True},
            ["rule 1 (a < b): no values within"],
        ),
        (
            {
                "a": {"type": "datetime", "bounds": ["2020-01-01T00:00:00", "2021-01-01T00:00:00"]},
                "b": {
                    "type": "datetime",
                    "bounds": ["2020-01-01T00:00:00", "2021-01-01T00:00:00"],
                    "granularity": "hour",
                },
            },
            {"kind": "inequality", "low": "a", "high": "b"},
            ["'a' (seconds) and 'b' (hours) have different granularities"],
        ),
        (
            {"a": {"type": "numeric", "bounds": [0, 1]}, "b": {"type": "categorical", "categories": ["x"]}},
            {
                "kind": "conditional",
                "when": {"column": "b", "one_of": ["x"]},
                "then": {"column": "a", "op": "==", "value": 0.5},
            },
            ["'a' is numeric without `decimals`", "almost never equal 0.5", "compare with <= or >="],
        ),
    ],
)
def test_the_bounds_and_grids_must_leave_room_for_the_rule(cols: dict, rule: dict, needles: list[str]) -> None:
    doc = {"dataset": {"name": "t"}, "columns": [{"name": k, **v} for k, v in cols.items()], "rules": [rule]}
    with pytest.raises(SchemaError) as err:
        Schema.validated(doc)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_a_rule_given_twice_or_two_rules_of_one_name_are_refused() -> None:
    doc = yaml.safe_load(COLUMNS)
    doc["rules"] = [INEQ, {"kind": "missing_together", "columns": ["end", "reason"]}, INEQ]
    with pytest.raises(SchemaError, match=r"rule 3 \(low <= high\) repeats rule 1"):
        Schema.validated(doc)
    doc["rules"] = [
        {**INEQ, "name": "same"},
        {"kind": "missing_together", "columns": ["end", "reason"], "name": "same"},
    ]
    with pytest.raises(SchemaError, match=r"rule 2 \(same\) has the same name as rule 1"):
        Schema.validated(doc)


def test_a_schema_file_with_a_bad_rule_says_so_in_one_paragraph(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(COLUMNS + "rules:\n  - {kind: inequality, low: wind, high: status}\n")
    with pytest.raises(SchemaError) as err:
        Schema.from_yaml(path)
    text = str(err.value)
    assert text.startswith(f"Schema file '{path}' is invalid") and "rule 1 (wind <= status)" in text


# -- evaluation: one function, per kind, missing values included ----------------------------------


def _days(*iso: str | None) -> list[int | None]:
    from datetime import date

    return [None if d is None else time_number(date.fromisoformat(d), "date") for d in iso]


def test_an_inequality_ignores_a_missing_side_and_compares_values_as_written() -> None:
    """SDV's Inequality: a row with a null on either side is valid. Values as the table writes
    them: 1.04 and 1.01 are written 1.0 both, so `low < high` is broken (strict) though low <= high
    holds; dates by the day."""
    s = schema(
        "rules:\n  - {kind: inequality, low: low, high: high, strict: true}\n"
        "  - {kind: inequality, low: start, high: end}\n"
    )
    frame = pl.DataFrame(
        {
            "low": [1.0, 2.0, None, 5.0, 1.01, 3.0],
            "high": [2.0, 1.0, 4.0, None, 1.04, 3.0],
            "start": _days("2020-01-01", "2020-03-01", None, "2020-05-01", "2020-05-01", "2020-05-02"),
            "end": _days("2020-01-02", "2020-02-01", "2020-01-01", None, "2020-05-01", "2020-05-01"),
        }
    )
    table = broken(s, frame)
    assert table.columns == ["low < high", "start <= end"]
    assert table["low < high"].to_list() == [False, True, False, False, True, True]
    assert table["start <= end"].to_list() == [False, True, False, False, False, True]
    assert table.null_count().sum_horizontal().item() == 0
    assert counts(s, frame) == [("low < high", 3), ("start <= end", 2)]


def test_a_broken_inequality_is_mended_by_swapping_where_the_values_fit() -> None:
    """`reflected`: a row with low > high gets the two values swapped; a row that meets the rule,
    a missing side, a strict rule's equal values, and a value the other column's bounds do not
    hold are left for the redraw; other columns are untouched; the rule holds on every mended row."""
    doc = yaml.safe_load(COLUMNS)
    doc["columns"][3]["bounds"] = [0, 50]  # high: a narrower range than low's
    doc["rules"] = [{"kind": "inequality", "low": "low", "high": "high", "strict": True}]
    s = Schema.validated(doc)
    frame = pl.DataFrame(
        {
            "low": [1.0, 9.0, None, 4.0, 70.0, 30.0],
            "high": [2.0, 3.0, 5.0, 4.0, 10.0, 20.0],
            "wind": [1, 2, 3, 4, 5, 6],
        }
    )
    out = reflected(s, frame)
    assert out.get_column("low").to_list() == [1.0, 3.0, None, 4.0, 70.0, 20.0]
    assert out.get_column("high").to_list() == [2.0, 9.0, 5.0, 4.0, 10.0, 30.0]  # 70 does not fit high's [0, 50]
    assert out.get_column("wind").to_list() == [1, 2, 3, 4, 5, 6]
    assert broken(s, out)["low < high"].to_list() == [False, False, False, True, True, False]
    dates = schema("rules:\n  - {kind: inequality, low: start, high: end}\n")
    days = pl.DataFrame({"start": _days("2020-03-01", "2020-01-01"), "end": _days("2020-02-01", "2020-01-05")})
    assert reflected(dates, days).to_dict(as_series=False) == {
        "start": _days("2020-02-01", "2020-01-01"),
        "end": _days("2020-03-01", "2020-01-05"),
    }


def test_combinations_check_present_values_only_and_take_booleans() -> None:
    s = schema(
        "rules:\n  - {kind: combinations, columns: [country, currency], allowed: [[US, USD], [FR, EUR], [DE, EUR]]}\n"
        "  - {kind: combinations, columns: [smoker, status], allowed: [['yes', TD], ['no', HU], ['no', TS]]}\n"
    )
    frame = pl.DataFrame(
        {
            "country": pl.Series(["US", "US", "FR", "DE", None, "DE"]).cast(pl.Enum(["US", "FR", "DE"])),
            "currency": ["USD", "EUR", "EUR", None, "USD", "USD"],
            "smoker": ["yes", "yes", "no", "no", "no", None],
            "status": ["TD", "HU", "HU", "TS", "TD", "HU"],
        }
    )
    table = broken(s, frame)
    assert table[:, 0].to_list() == [False, True, False, False, False, True]
    assert table[:, 1].to_list() == [False, True, False, False, True, False]


def test_a_conditional_needs_its_when_and_a_present_then() -> None:
    """A missing `when` value does not trigger the rule; a missing `then` value does not break it."""
    s = schema(
        "rules:\n"
        "  - {kind: conditional, when: {column: status, one_of: [HU, TS]}, then: {column: wind, op: '>=', value: 64}}\n"
        "  - {kind: conditional, when: {column: smoker, one_of: ['yes']}, then: {column: reason, one_of: [a]}}\n"
        "  - {kind: conditional, when: {column: country, one_of: [US]}, then: {column: start, op: '<', value: "
        "'2020-07-01'}}\n"
    )
    frame = pl.DataFrame(
        {
            "status": ["HU", "HU", "TS", "TD", None, "HU"],
            "wind": [64, 63, 10, 10, 10, None],
            "smoker": ["yes", "yes", "no", "yes", "yes", None],
            "reason": ["a", "b", "b", None, "b", "b"],
            "country": ["US", "US", "FR", "US", None, "US"],
            "start": _days("2020-06-30", "2020-07-01", "2020-12-01", None, "2020-12-01", "2020-01-01"),
        }
    )
    table = broken(s, frame)
    assert table[:, 0].to_list() == [False, True, True, False, False, False]
    assert table[:, 1].to_list() == [False, True, False, False, True, False]
    assert table[:, 2].to_list() == [False, True, False, False, False, False]


def test_a_datetime_conditional_compares_at_its_granularity() -> None:
    from datetime import datetime

    s = schema()
    june = time_number(datetime(2020, 6, 1), "datetime") // 60  # decoded units: minutes
    frame = pl.DataFrame({"smoker": ["yes", "yes", "no"], "seen": [june, june - 1, 0]})
    only = Schema.validated({**yaml.safe_load(COLUMNS), "rules": [s.rules[4].model_dump(mode="json")]})
    assert broken(only, frame)[:, 0].to_list() == [False, True, False]


def test_missing_together_is_all_or_none() -> None:
    s = schema("rules:\n  - {kind: missing_together, columns: [start, end, reason]}\n")
    frame = pl.DataFrame(
        {
            "start": [1, None, 1, None, 1],
            "end": [1, None, None, 1, 1],
            "reason": ["a", None, None, None, None],
        }
    )
    assert broken(s, frame)[:, 0].to_list() == [False, False, True, True, True]


# -- the sampler: no released row breaks a rule ---------------------------------------------------


def _synth(s: Schema, head: bool = False):
    """A release of `s` at a one-block MAF's seeded initial weights (sampling only, no training),
    with a seeded random target head on `status` when `head`."""
    import torch

    from privflow.api import Synthesizer
    from privflow.data.target_head import TargetHead, feature_count, release_codec
    from privflow.models import build_flow

    head_dict = None
    if head:
        rng = np.random.default_rng(3)
        model = lower(s)
        head_dict = TargetHead("status", rng.normal(size=(feature_count(model), 3)), rng.normal(size=3)).to_dict()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        flow = build_flow("maf", release_codec(s, None, head_dict).cardinalities, blocks=1, hidden=8).eval()
    return Synthesizer(s, [flow], head=head_dict)


@pytest.fixture(scope="module")
def ruled():
    return _synth(schema(RULES.replace("rules:", "target: status\nrules:")), head=True)


@pytest.fixture(scope="module")
def free():
    return _synth(schema(""))


def test_the_untrained_flow_breaks_the_rules_the_sampler_enforces(free) -> None:
    """The same flow without the rules draws rows that break each of them often."""
    from privflow.serving.sampler import sample_rows

    rows = sample_rows(free.flows, free.codec, 2000, seed=1)
    found = dict(counts(schema(), rows))
    assert all(found[name] > 50 for name in LABELS), found


def test_no_released_row_breaks_a_rule_and_the_draws_rejected_are_counted(ruled) -> None:
    from privflow.serving.sampler import sample_rows

    where = with_rules(None, ruled.schema)
    assert isinstance(where, Conditions) and where.rules is not None
    rows = sample_rows(ruled.flows, ruled.codec, 500, seed=2, batch=512, where=where)
    assert rows.height == 500 and rows.columns == lower(ruled.schema).names
    assert counts(ruled.schema, rows) == [(name, 0) for name in LABELS]
    tally = where.tally
    assert tally.kept >= 500 and tally.drawn > tally.kept
    assert tally.broke_rules == tally.drawn - tally.kept  # nothing else was asked for
    # the rule on the target (status, drawn by the head) holds by construction: the head draws
    # among the classes the row's wind allows, so no draw is rejected for it; a broken inequality
    # is mended by swapping its values (`start <= end` always; `low < high` but where they are
    # equal as written); the others reject
    on_target, mended = "if status = HU then wind >= 64", ("low < high", "start <= end")
    assert list(tally.by_rule) == LABELS and tally.by_rule[on_target] == tally.by_rule["start <= end"] == 0
    assert all(k > 0 for name, k in tally.by_rule.items() if name not in (on_target, *mended))
    assert max(tally.by_rule.values()) <= tally.broke_rules <= sum(tally.by_rule.values())
    assert 0.3 < tally.rule_share < 1.0
    note = tally.rules_note()
    assert note.startswith(f"{cond.percent(tally.rule_share)} of the draws broke a rule of the schema (most often '")
    # the API's sample: the same rows (the rules are in the release's schema), written as the input is
    table = ruled.sample(500, seed=2)
    assert table.height == 500 and "patient_id" not in table.columns
    again = sample_rows(ruled.flows, ruled.codec, 500, seed=2, batch=512)
    assert again.equals(rows)  # the rules apply without `where`; the tally does not change the rows


def test_rules_combine_with_where_and_through_the_head(ruled) -> None:
    from privflow.serving.sampler import sample_rows

    where = conditions_for(ruled.schema, ["wind<=100", "country=DE"])
    rows = ruled.sample(300, seed=4, where=where)
    assert rows.height == 300 and (rows["wind"] <= 100).all() and (rows["country"] == "DE").all()
    assert (rows["currency"] == "EUR").all()  # the combinations rule: DE pays in EUR
    assert where.tally.broke_rules > 0 and set(where.tally.by_rule) == set(LABELS)
    assert where.tally.kept >= 300 and where.tally.drawn - where.tally.kept >= where.tally.broke_rules
    # the target through its head: the rule on the target holds (read with the target set)
    hu = sample_rows(ruled.flows, ruled.codec, 300, seed=5, where={"status": "HU"})
    assert (hu["status"].cast(pl.String) == "HU").all() and (hu["wind"] >= 64).all()
    assert counts(ruled.schema, hu) == [(name, 0) for name in LABELS]


def test_the_seed_reproduces_rows_under_rules_whatever_the_workers(ruled) -> None:
    from privflow.serving.sampler import sample_rows

    one = sample_rows([*ruled.flows, *ruled.flows], ruled.codec, 300, seed=7, batch=256, workers=1)
    three = sample_rows([*ruled.flows, *ruled.flows], ruled.codec, 300, seed=7, batch=256, workers=3)
    assert one.equals(three) and one.height == 300


def test_write_samples_under_rules_writes_rows_that_read_back_meeting_them(ruled, tmp_path: Path) -> None:
    from privflow.serving.sampler import _drawn_column, write_samples

    where = with_rules(None, ruled.schema)
    out = write_samples(
        ruled.flows, ruled.codec, 200, tmp_path / "s.csv", seed=3, progress=True, schema=ruled.schema, where=where
    )
    from privflow.data.validation import validate

    clean, report = validate(pl.read_csv(out, infer_schema=False), _without_id(ruled.schema))
    assert report.failing_rows == 0 and clean.height == 200
    assert counts(ruled.schema, clean) == [(name, 0) for name in LABELS]
    shown = _drawn_column(where.tally).render(None).plain
    assert shown == f"{where.tally.drawn:,} drawn, {100 * where.tally.rule_share:.3g}% broke a rule"


def _without_id(s: Schema) -> Schema:
    doc = s.model_dump(mode="json")
    doc["columns"] = [c for c in doc["columns"] if c["type"] != "ignore"]
    return Schema.model_validate(doc)


def test_a_rule_the_model_almost_never_meets_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from privflow.serving.sampler import sample_rows

    monkeypatch.setattr(cond, "MIN_DRAW_CAP", 3000)
    monkeypatch.setattr(cond, "DRAWS_PER_ROW", 1)
    s = schema(
        "rules:\n  - {kind: conditional, when: {column: status, one_of: [HU, TS, TD]}, "
        "then: {column: wind, op: '>=', value: 199}}\n"
    )
    synth = _synth(s)
    with pytest.raises(ConfigError) as err:
        sample_rows(synth.flows, synth.codec, 200, seed=1)
    text = str(err.value)
    assert "\n" not in text
    for needle in (
        "The rules of the schema are too rare in this model to sample 200 rows",
        "rows drawn from the model matched",
        "of the draws broke the schema's rule 'if status in [HU, TS, TD] then wind >= 199'",
        "`privflow check` counts the real rows that break each rule",
        "the cap of 3,000 draws",
    ):
        assert needle in text, text


def test_the_cap_s_message_adds_the_rules_to_where_s() -> None:
    """The bookkeeping alone: jobs that keep nothing because every draw broke a rule."""
    s = schema()
    c = with_rules(Conditions({"status": "HU"}, parts=("status=HU",)), s)
    empty = pl.DataFrame({"status": pl.Series([], dtype=pl.String)})
    per_rule = np.array([50_000, 50_000, 0, 0, 0, 0, 10], dtype=np.int64)
    endless = ((empty, 0.0, 50_000, per_rule) for _ in range(10_000))
    with pytest.raises(ConfigError) as err:
        list(c.collect(endless, 10, 1, np.random.default_rng(0)))
    text = str(err.value)
    assert "--where status=HU is too rare" in text and "widen a condition" in text
    assert "100% of the draws broke a rule of the schema (most often 'low < high', 100%)" in text
    assert c.tally.by_rule["end, reason missing together"] == 10 * (c.tally.drawn // 50_000)


# -- privflow check: real rows that break a rule, counted, not failed -----------------------------


def _table(n: int = 12) -> list[dict[str, str]]:
    """Rows that pass the schema; rows 0-2 break 'low < high', rows 3-4 the combinations, row 5
    both the conditional on status and missing_together."""
    out = []
    for i in range(n):
        out.append(
            {
                "status": "HU" if i == 5 else "TS",
                "wind": "30",
                "low": "5.0" if i < 3 else "1.5",
                "high": "2.5",
                "country": "US",
                "currency": "EUR" if i in (3, 4) else "USD",
                "start": "2020-01-01",
                "end": "" if i == 5 else "2020-02-01",
                "seen": "2020-07-01T10:00:00",
                "reason": "a",
                "smoker": "no",
                "patient_id": f"P{i}",
            }
        )
    return out


def test_check_counts_the_rows_that_break_each_rule_and_passes_them(tmp_path: Path) -> None:
    from privflow.cli import app
    from privflow.data.validation import validate

    data, spec = tmp_path / "data.csv", tmp_path / "schema.yaml"
    table = pl.DataFrame(_table(), schema={c: pl.String for c in _table()[0]})
    table.write_csv(data)
    spec.write_text(COLUMNS + RULES)
    clean, report = validate(table, schema())
    assert report.failing_rows == 0 and clean.height == 12  # breaking a rule fails no row
    assert counts(schema(), clean) == [
        ("low < high", 3),
        ("start <= end", 0),
        ("combinations of country, currency", 2),
        ("if status = HU then wind >= 64", 1),
        ("smokers are seen from June", 0),
        ("end, reason missing together", 1),
    ]
    result = CliRunner().invoke(app, ["check", "--data", str(data), "--schema", str(spec)])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "12 pass" in text and "0 fail" in text
    assert "- rule 'low < high' [broken, kept]: 3 passing rows break it" in text
    assert "- rule 'combinations of country, currency' [broken, kept]: 2 passing rows break it" in text
    assert "- rule 'if status = HU then wind >= 64' [broken, kept]: 1 passing row breaks it" in text
    assert "- rule 'end, reason missing together' [broken, kept]: 1 passing row breaks it" in text
    assert "start <= end' [" not in text and "smokers are seen" not in text
    assert "CURATOR-ONLY" in text


def test_check_says_when_every_row_meets_the_rules() -> None:
    from privflow.data.validation import validate

    rows = [dict(r, low="1.5", currency="USD", status="TS", end="2020-02-01") for r in _table(4)]
    clean, _ = validate(pl.DataFrame(rows), schema())
    assert curator_lines(schema(), clean) == ["every passing row meets the schema's 6 rules between columns"]
    assert curator_lines(schema(""), clean) == [] and curator_lines(schema(), clean.head(0)) == []


# -- where the rules are applied: generate without --where, a run's release table ------------------


def test_generate_applies_the_rules_without_where() -> None:
    """`privflow generate`'s conditions hold the schema's rules even when --where is not given."""
    from types import SimpleNamespace

    from privflow.cli.generate import _conditions

    s = schema()
    sampler = SimpleNamespace(schema=s, codec=SimpleNamespace(schema=lower(s)))
    alone = _conditions(sampler, None)
    assert alone is not None and alone.rules is not None and alone.describe() == ""
    both = _conditions(sampler, ["status=HU"])
    assert both.rules is not None and both.describe() == "status=HU"
    plain = schema("")
    assert _conditions(SimpleNamespace(schema=plain, codec=SimpleNamespace(schema=lower(plain))), None) is None


def test_a_release_table_the_rules_make_too_rare_keeps_the_rows_that_meet_them(tmp_path, monkeypatch) -> None:
    """The budget is spent when the run's synthetic table is drawn: a model that almost never meets
    a rule does not fail the run; the table holds the rows of one draw that meet every rule, and
    the note says how many were left out."""
    from types import SimpleNamespace

    import polars as pl

    from privflow.core.config import RunConfig
    from privflow.core.errors import ConfigError
    from privflow.flows import pipeline

    s = with_one({"kind": "inequality", "low": "low", "high": "high", "strict": True})
    drawn = pl.DataFrame({c.name: [None] * 4 for c in lower(s).columns}).with_columns(
        pl.Series("low", [1.0, 5.0, 2.0, 3.0]), pl.Series("high", [2.0, 4.0, 3.0, 3.0])
    )  # the second row is mended by a swap; the last, equal where the rule is strict, cannot be

    def sample(n: int, seed: int | None = None, rules: bool = True) -> pl.DataFrame:
        if rules:
            raise ConfigError("The rules of the schema are too rare in this model")
        return drawn

    monkeypatch.setattr(pipeline, "to_surface", lambda frame, schema: frame.select("low", "high"))
    monkeypatch.setattr(pipeline.store_ml, "log_synthetic", lambda path: None)
    config = RunConfig.build(data=tmp_path / "d.csv", schema_path=tmp_path / "s.yaml", store=tmp_path)
    table, path, note = pipeline._release_table(config, s, SimpleNamespace(sample=sample), tmp_path, "run-1")
    assert table.get_column("low").to_list() == [1.0, 4.0, 2.0]
    assert table.get_column("high").to_list() == [2.0, 5.0, 3.0]
    assert pl.read_csv(path).height == 3
    assert note is not None and "1 of the 4 rows" in note


def test_the_head_draws_only_the_classes_a_rule_on_the_target_allows(ruled) -> None:
    """`rules.allowed_classes` against the rule read row by row: where wind < 64 the class HU is
    closed (probability 0) and the head's other classes share its mass in their own proportions;
    where wind >= 64 the law is the head's."""
    from privflow.data.rules import allowed_classes
    from privflow.serving.sampler import sample_rows

    rows = sample_rows(ruled.flows, ruled.codec, 400, seed=7, batch=512)
    codec = ruled.codec
    labels = list(codec.column.categories)
    hu = labels.index("HU")
    allowed = allowed_classes(ruled.schema, rows)
    low = (rows["wind"] < 64).fill_null(False).to_numpy()
    assert allowed is not None and low.any() and (~low).any()
    assert np.array_equal(allowed[:, hu], ~low) and allowed[:, [k for k in range(len(labels)) if k != hu]].all()
    head, drawn = codec.head_log_probs(rows), codec.sampling_log_probs(rows)
    assert np.all(np.isneginf(drawn[low, hu])) and np.allclose(drawn[~low], head[~low])
    others = [k for k in range(head.shape[1]) if k != hu]
    ratio = drawn[low][:, others] - head[low][:, others]  # one shift per row: the same proportions
    assert np.allclose(ratio, ratio[:, :1]) and np.allclose(np.exp(drawn[low]).sum(axis=1), 1.0)
