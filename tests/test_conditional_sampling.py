"""Conditional sampling: `privflow generate --where COL=VALUE` and
`Synthesizer.sample(n, where=...)`. Exactly n rows, every one meeting every condition (AND), drawn
from the model's conditional law (the target through its head, other columns by rejection); the
seed reproduces them; bad conditions and conditions too rare to reach n are one paragraph, exit 2."""

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
    _one_paragraph_error(res, "native-country=Puerto-Rico is too rare", "rows drawn from the model", "rate of", "cap")
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
    assert "none of the" in text and "rows drawn" in text and "estimated rate of 0" in text
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
        ("age=30", ["column 'age' is integer", "only categorical conditions are supported"]),
        ("sex=female", ["'female' is not a category of column 'sex'", "'Female', 'Male'", "Did you mean 'Female'?"]),
        ("education=Bachelor", ["not a category of column 'education'", "Did you mean 'Bachelors'?"]),
    ],
)
def test_a_where_the_schema_refuses_exits_2_before_sampling(store: Path, tmp_path: Path, where, needles) -> None:
    out = tmp_path / "o.csv"
    _one_paragraph_error(_generate(store, out, 10, "--where", where), *needles)
    assert not out.exists()


def test_the_api_checks_where_against_the_schema(synth) -> None:
    with pytest.raises(ConfigError, match="only categorical conditions"):
        synth.sample(5, where={"hours-per-week": "40"})
    with pytest.raises(ConfigError, match="must be a mapping"):
        synth.sample(5, where="sex=Female")
    with pytest.raises(ConfigError, match="must be a category label"):
        synth.sample(5, where={"sex": None})
    assert synth.sample(5, seed=1, where={}).height == 5  # no condition: plain sampling


def test_parse_where_splits_at_the_first_equals_sign() -> None:
    assert parse_where(["a = x=y ", "b=c"]) == {"a": "x=y", "b": "c"}
    assert parse_where(None) == {} and parse_where(["b=c", "b=c"]) == {"b": "c"}


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
