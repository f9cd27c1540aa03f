"""Privacy rule 2 and 8 for `privflow schema draft --epsilon`: no drafted field is decided by one
row outside a mechanism.

Each field kind (type, decimals, a date's day/month order, a datetime's granularity, boolean
against categorical, nullable, ignore against integer for an identifier) is a function of noisy
counts only. With the noise set to zero (the samplers monkeypatched to the identity, the
exponential mechanism to its argmax), the draft of D and of D plus one adversarial row must be the
same: one row moves each level of the kind histogram by at most 1 (L1 sensitivity
KIND_SENSITIVITY), and the public thresholds are far from a knife edge on these tables. The same
tables at the real noise and a moderate epsilon then agree with a probability the test states.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from privflow.data import draft as dd
from privflow.data.schema import Budget
from privflow.tasks import draft as td

ROWS = 1200
ADVERSARIAL = ["35.5", "maybe", "not a date", "2020-01-01 10:17", "2020-01-01 10:00:05", "01/25/2020", "", "x" * 300]


def _table(rows: int = ROWS, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    days = rng.integers(0, 28, rows) + 1
    months = rng.integers(0, 12, rows) + 1
    return pl.DataFrame(
        {
            "count": [str(v) for v in rng.integers(0, 500, rows)],
            "price": [f"{v:.2f}" for v in rng.lognormal(3, 1, rows)],
            "flag": rng.choice(["yes", "no"], rows).tolist(),
            "day": [f"{d:02d}/{m:02d}/2021" for d, m in zip(days, months, strict=True)],
            "seen": [f"2022-03-{1 + i % 28:02d} {i % 24:02d}:00" for i in range(rows)],
            "color": rng.choice(["red", "green", "blue"], rows, p=[0.5, 0.3, 0.2]).tolist(),
            "customer_id": [str(100000 + i) for i in rng.permutation(rows)],
        }
    )


def _plan(columns: tuple[str, ...], epsilon: float) -> td.DraftPlan:
    return td.DraftPlan(
        Path("t.csv"), Path("t.yaml"), "t", Budget(epsilon=10.0, delta=1e-5), columns, False, epsilon, 1e-6
    )


def _fields(frame: pl.DataFrame, epsilon: float) -> dict[str, tuple]:
    """Every drafted field the rule is about, per column (bounds, lists and counts aside)."""
    frame = dd.normalised(frame, dd.MISSING_TOKENS)
    filled = td._fill(_plan(tuple(frame.columns), epsilon), frame, [])
    out: dict[str, tuple] = {}
    for sug in filled.suggestions:
        entries = {e.key: e.value for e in filled.columns[sug.name]}
        out[sug.name] = (sug.type, sug.format, sug.granularity, sug.labels, sug.decimals, entries.get("nullable"))
    return out


def _with(frame: pl.DataFrame, value: str | None, column: str | None = None) -> pl.DataFrame:
    """`frame` plus one row: `value` in `column` (every column when None), missing elsewhere."""
    row = {c: (value if column in (None, c) else None) for c in frame.columns}
    return pl.concat([frame, pl.DataFrame([row], schema=frame.schema)])


def test_the_draft_reads_what_the_table_holds(no_noise: None) -> None:
    got = _fields(_table(), 1.0)
    # 1,200 rows: the noise cannot rule out 1% of values with decimals, so the whole numbers are a
    # numeric column written with 0 decimals (no row fails), not an integer one
    assert got["count"][0] == "numeric" and got["count"][4] == 0
    assert got["price"][:1] == ("numeric",) and got["price"][4] == 2
    assert got["flag"][0] == "boolean" and got["flag"][3] == ("yes", "no")
    assert got["day"][:2] == ("date", "%d/%m/%Y")
    assert got["seen"][:3] == ("datetime", "%Y-%m-%d %H:%M", "hour")
    assert got["color"][0] == "categorical" and got["customer_id"][0] == "ignore"
    assert all(v[5] is True for k, v in got.items() if k != "customer_id")  # the missing count is never sure to be 0


@pytest.mark.parametrize("share,drafted", [(0.0, ("integer", None)), (0.008, ("numeric", 0)), (0.03, ("numeric", 1))])
def test_integer_only_when_the_noise_rules_out_decimals(no_noise: None, share: float, drafted: tuple) -> None:
    """Integer fails each row written with decimals: on 40,000 rows it is drafted only over whole
    numbers; a few decimals (0.8%) make a numeric column written with 0 decimals, more a finer one."""
    rows = 40_000
    values = np.random.default_rng(1).integers(0, 500, rows).astype(float)
    values[: int(share * rows)] += 0.5
    frame = pl.DataFrame({"count": [f"{v:g}" for v in values], "color": ["red", "blue"] * (rows // 2)})
    got = _fields(frame, 1.0)["count"]
    assert (got[0], got[4]) == drafted


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_one_adversarial_row_changes_no_field_without_noise(no_noise: None, value: str) -> None:
    base = _table()
    assert _fields(_with(base, value), 1.0) == _fields(base, 1.0)


def test_one_duplicate_id_leaves_the_identifier_ignored(no_noise: None) -> None:
    base = _table()
    dup = _with(base, base["customer_id"][0], "customer_id")
    assert _fields(dup, 1.0)["customer_id"][0] == _fields(base, 1.0)["customer_id"][0] == "ignore"


@pytest.mark.parametrize("value", [*ADVERSARIAL, None, "2020-13-45", "-0.000001", "1e300", "TRUE", "NaN"])
def test_one_row_moves_the_kind_histogram_by_at_most_its_sensitivity(value: str | None) -> None:
    base = _table(300)
    for name in base.columns:
        a = dd.kind_counts(dd.normalised(base, dd.MISSING_TOKENS).get_column(name))
        b = dd.kind_counts(dd.normalised(_with(base, value, name), dd.MISSING_TOKENS).get_column(name))
        assert np.abs(b - a).sum() <= dd.KIND_SENSITIVITY, (name, value)
        assert a.sum() <= len(base) * dd.KIND_SENSITIVITY


def test_the_decisions_are_functions_of_the_noisy_counts_only() -> None:
    """decide_kind sees counts and public settings: two columns with the same counts get the same type."""
    a = dd.kind_counts(pl.Series(["5", "2", "3", None]))
    b = dd.kind_counts(pl.Series(["7", None, "9", "4"]))
    assert np.array_equal(a, b)
    assert dd.decide_kind("x", a, 4.0, 0.0, 0.0) == dd.decide_kind("x", b, 4.0, 0.0, 0.0)


def test_a_zero_inflated_heavy_tailed_column_keeps_99_percent_inside(no_noise: None) -> None:
    rng = np.random.default_rng(5)
    x = np.where(rng.random(4000) < 0.75, 0.0, np.round(rng.lognormal(7, 1.6, 4000), 2))
    frame = dd.normalised(pl.DataFrame({"amount": [f"{v:.2f}" if v else "0" for v in x]}), ())
    filled = td._fill(_plan(("amount",), 1.0), frame, [])
    entries = {e.key: e.value for e in filled.columns["amount"]}
    low, high = entries["bounds"]
    assert entries["atoms"] == [0.0] and low == 0
    assert np.mean((x >= low) & (x <= high)) >= 0.99
    assert high <= 100 * x.max()  # not a bound far past the data


def test_a_heavy_tailed_column_at_real_noise_keeps_99_percent_inside() -> None:
    """At epsilon 50 on one column the exponential mechanism's pick is the argmax but with probability
    below 1e-6 (its noise scale is 2/epsilon_end ~ 0.05 rows against utility steps of rows)."""
    rng = np.random.default_rng(6)
    x = np.round(rng.lognormal(5, 1.2, 3000), 1)
    frame = dd.normalised(pl.DataFrame({"v": [f"{v:.1f}" for v in x]}), ())
    filled = td._fill(_plan(("v",), 50.0), frame, [])
    low, high = next(e.value for e in filled.columns["v"] if e.key == "bounds")
    assert np.mean((x >= low) & (x <= high)) >= 0.99


def test_categories_holding_five_percent_are_listed_and_the_rest_read_as_other(no_noise: None) -> None:
    rng = np.random.default_rng(7)
    shares = {"a": 0.55, "b": 0.25, "c": 0.12, "other": 0.06, "e": 0.01, "f": 0.005, "d": 0.005}
    values = rng.choice(list(shares), 5000, p=list(shares.values())).tolist()
    target = rng.choice(["p", "n", "rare"], 5000, p=[0.5, 0.497, 0.003]).tolist()
    frame = dd.normalised(pl.DataFrame({"k": values, "y": target}), ())
    plan = td.DraftPlan(
        Path("t.csv"), Path("t.yaml"), "t", Budget(epsilon=10.0, delta=1e-5), ("k", "y"), False, 20.0, 1e-6, "y", "p"
    )
    filled = td._fill(plan, frame, [])
    k = {e.key: e.value for e in filled.columns["k"]}
    assert k["categories"] == ["a", "b", "c", "other", "(other)"] and k["other"] == "(other)"  # 'other' is listed
    y = {e.key: e.value for e in filled.columns["y"]}
    assert y["categories"][:3] == ["n", "p", "rare"]  # a target keeps its rare class (0.3% >= 0.2%)
    assert [(e.key, e.value) for e in filled.top] == [("target", "y"), ("target_positive", "p")]


def test_a_column_spread_over_two_decades_still_has_a_scale() -> None:
    """1,600 values in [1, 10) and 1,600 in [10, 100), each under 5 noise sd of a kind cell (sd
    495): their sum places the bounds' window at 100, the upper edge of the two decades."""
    counts = dict.fromkeys(dd.KIND_CELLS, 0.0)
    counts.update({"int+": 3200.0, "group:number": 3200.0, "mag:0": 1600.0, "mag:1": 1600.0})
    kind = dd.decide_kind("x", [counts[k] for k in dd.KIND_CELLS], 3200.0, 495.0, 10.0)
    assert kind.suggestion.type in ("integer", "numeric") and kind.decade == 1
    counts.update({"mag:0": 900.0, "mag:1": 900.0})  # under DECADE_Z noise sd together: no scale
    kind = dd.decide_kind("x", [counts[k] for k in dd.KIND_CELLS], 3200.0, 495.0, 10.0)
    assert kind.decade is None


def _noisy_kinds(values: list[str], shift_sd: float, cell_sd: float) -> np.ndarray:
    """The exact kind counts with every decimal cell moved by `shift_sd` noise sd: one plausible draw
    of the noise, the same for every cell, so the rule is tested against a known worst case."""
    counts = dd.kind_counts(pl.Series(values))
    for i, cell in enumerate(dd.KIND_CELLS):
        if cell.startswith("dec"):
            counts[i] += shift_sd * cell_sd
    return counts


@pytest.mark.parametrize("shift", [-0.5, 0.0, 0.5])
def test_decimals_follow_the_values_where_each_cell_carries_noise(shift: float) -> None:
    """At a small epsilon every decimal cell carries noise of a tenth of the rows: whole numbers stay
    whole (half an sd up in each of the 14 decimal cells once drafted them with decimals) and
    values written with one or two decimals keep them."""
    rows, sd = 4000, 400.0
    rng = np.random.default_rng(3)
    whole = [str(v) for v in rng.integers(0, 60, rows)]
    tenths = [f"{v:.1f}" for v in rng.uniform(10, 60, rows)]
    cents = [f"{v:.2f}" for v in rng.uniform(100, 900, rows)]
    for values, want in ((whole, 0), (tenths, 1), (cents, 2)):
        got = dd.decide_kind("x", _noisy_kinds(values, shift, sd), float(rows), sd, sd)
        assert got.suggestion.type == "numeric" and got.suggestion.decimals == want, (want, shift, got.suggestion)


def test_columns_missing_together_are_drafted_as_a_rule(no_noise: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two measurements missing in the same 40% of rows, a third missing at random: the draft
    declares the pair `missing_together` from the DP pair counts, not the third; one adversarial
    row changes nothing; where the counts' noise is too large to tell, no rule is drafted."""
    rng = np.random.default_rng(8)
    rows = 4000
    gone = rng.random(rows) < 0.4
    other = rng.random(rows) < 0.3
    frame = pl.DataFrame(
        {
            "size_a": [None if g else f"{v:.1f}" for g, v in zip(gone, rng.uniform(1, 9, rows), strict=True)],
            "size_b": [None if g else str(v) for g, v in zip(gone, rng.integers(5, 50, rows), strict=True)],
            "gust": [None if o else str(v) for o, v in zip(other, rng.integers(10, 60, rows), strict=True)],
            "kind": rng.choice(["a", "b"], rows).tolist(),
        }
    )

    def rules(f: pl.DataFrame, epsilon: float = 4.0) -> tuple[list, list[str]]:
        filled = td._fill(_plan(tuple(f.columns), epsilon), dd.normalised(f, ()), [])
        return [e.value for e in filled.top if e.key == "rules"], filled.notes

    assert rules(frame)[0] == [[{"kind": "missing_together", "columns": ["size_a", "size_b"]}]]
    assert rules(_with(frame, "3.5", "size_a"))[0] == rules(frame)[0]  # one row with only size_a present
    # at a small epsilon the pair counts' noise could not tell the pairs apart: nothing is released
    # for them (their share stays with the columns), no rule, and a note says so
    monkeypatch.setattr(td, "_missing_together", lambda *a: pytest.fail("released pair counts without power"))
    few, notes = rules(frame, 0.3)
    assert few == [] and any("missing together were not drafted" in n for n in notes)
