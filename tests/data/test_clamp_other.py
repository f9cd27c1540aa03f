"""Nothing lost to a bound or a list: values past a clamping column's bounds are clamped (as
numpy's clip), values not in a categorical's list are read as its `other`, the report counts
them exactly, and the DP gate releases the rows' partition (failing / unchanged / clamped /
other / both) with Laplace noise per cell at the same epsilon."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from scipy import stats

from privflow.core.errors import SchemaError, ValidationFailed
from privflow.data.schema import Schema, time_number
from privflow.data.validation import RowCells, ask_gate, merged_report, validate, validate_chunks
from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.mechanisms import validation_gate
from privflow.privacy.mechanisms.validation_gate import (
    floor,
    gate,
    gate_event,
    laplace_sum_quantile,
    laplace_sum_tail,
    passing_cells,
)

FALSE_FAILURE = 1e-9  # each statistical assertion below fails a correct implementation with at most this probability


def schema(dataset: dict[str, Any] | None = None, **overrides: dict[str, Any]) -> Schema:
    columns = {
        "age": {"name": "age", "type": "integer", "bounds": [18, 90]},
        "amount": {"name": "amount", "type": "numeric", "bounds": [0.0, 100.0]},
        "seen": {"name": "seen", "type": "date", "bounds": ["2020-01-01", "2020-12-31"]},
        "color": {"name": "color", "type": "categorical", "categories": ["red", "green", "other"]},
    }
    for name, fields in overrides.items():
        columns[name] = {**columns[name], **fields}
    return Schema.model_validate({"dataset": {"name": "toy", **(dataset or {})}, "columns": list(columns.values())})


CLAMP = {"on_out_of_bounds": "clamp"}
OTHER = {"other": "other"}


def table(rng: np.random.Generator, n: int) -> pl.DataFrame:
    """Rows with values on both sides of every bound and unlisted colours."""
    age = rng.integers(0, 120, n)
    amount = np.round(rng.uniform(-50, 150, n), 3)
    days = rng.integers(time_number(np.datetime64("2019-06-01").astype(object), "date"), 18_800, n)
    seen = [str(np.datetime64(int(d), "D")) for d in days]
    color = rng.choice(["red", "green", "other", "blue", "teal"], n)
    return pl.DataFrame({"age": age.astype(str), "amount": amount.astype(str), "seen": seen, "color": color})


def cells_of(df: pl.DataFrame, s: Schema) -> RowCells:
    seen: list[RowCells] = []

    def keep(failing: int, passing: int, cells: RowCells | None = None) -> bool:
        assert cells is not None and (cells.failing, cells.passing) == (failing, passing)
        seen.append(cells)
        return False

    validate(df, s, "strict", None, keep)
    assert len(seen) == 1
    return seen[0]


# ----------------------------------------------------------------------------- the schema fields


def test_the_default_is_fail_and_drafts_write_clamp_explicitly() -> None:
    s = schema()
    assert s.dataset.on_out_of_bounds == "fail" and not any(s.clamps(c) for c in s.columns)
    assert s.out_of_bounds(s.column("color")) is None  # no bounds
    both = schema({"on_out_of_bounds": "clamp"}, age={"on_out_of_bounds": "fail"})
    assert [both.clamps(c) for c in both.columns] == [False, True, True, False]
    again = Schema.validated(__import__("yaml").safe_load(both.to_yaml()))
    assert again == both


@pytest.mark.parametrize(
    "columns,match",
    [
        ([{"name": "c", "type": "categorical", "categories": ["a", "b"], "other": "z"}], "other 'z' is not one of"),
        ([{"name": "c", "type": "boolean", "other": "true"}], "'other' applies to categorical columns only"),
        ([{"name": "n", "type": "numeric", "bounds": [0, 1], "other": "x"}], "'other' applies to categorical"),
        ([{"name": "c", "type": "categorical", "categories": ["a"], "on_out_of_bounds": "clamp"}], "on_out_of_bounds"),
        ([{"name": "n", "type": "numeric", "bounds": [0, 1], "on_out_of_bounds": "wrap"}], "on_out_of_bounds"),
    ],
)
def test_bad_tail_fields_are_refused_by_name(columns: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        Schema.validated({"dataset": {"name": "toy"}, "columns": columns})


def test_target_positive_must_be_one_of_the_targets_classes() -> None:
    cols = [{"name": "y", "type": "categorical", "categories": ["no", "yes"]}, {"name": "b", "type": "boolean"}]
    ok = Schema.validated({"dataset": {"name": "t"}, "columns": cols, "target": "y", "target_positive": "yes"})
    assert ok.target_positive == "yes" and ok.without("b").target_positive == "yes"
    assert Schema.validated({"dataset": {"name": "t"}, "columns": cols, "target": "b", "target_positive": "true"})
    with pytest.raises(SchemaError, match="target_positive 'maybe' is not one of target 'y' classes"):
        Schema.validated({"dataset": {"name": "t"}, "columns": cols, "target": "y", "target_positive": "maybe"})
    with pytest.raises(SchemaError, match="no `target`"):
        Schema.validated({"dataset": {"name": "t"}, "columns": cols, "target_positive": "yes"})


# ----------------------------------------------------------------------------- validation


def test_clamped_values_are_numpys_clip_and_other_takes_the_unlisted(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    raw = table(rng, 400)
    s = schema({"on_out_of_bounds": "clamp"}, color=OTHER)
    clean, rep = validate(raw, s, "strict")
    assert clean.height == raw.height and rep.passed and rep.failing_rows == 0

    age = raw["age"].cast(pl.Float64).to_numpy()
    amount = raw["amount"].cast(pl.Float64).to_numpy()
    days = np.array([time_number(np.datetime64(d).astype(object), "date") for d in raw["seen"]])
    lo_day, hi_day = s.column("seen").bounds or (0, 0)
    assert np.array_equal(clean["age"].to_numpy(), np.clip(age, 18, 90).astype(np.int64))
    assert np.array_equal(clean["amount"].to_numpy(), np.clip(amount, 0.0, 100.0))
    assert np.array_equal(clean["seen"].to_numpy(), np.clip(days, lo_day, hi_day).astype(np.int64))
    listed = raw["color"].is_in(["red", "green", "other"]).to_numpy()
    expect = np.where(listed, raw["color"].to_numpy(), "other")
    assert clean["color"].cast(pl.String).to_list() == expect.tolist()

    changed = {(a.column, a.change): a.values for a in rep.adjustments}
    assert changed == {
        ("age", "clamped"): int(((age < 18) | (age > 90)).sum()),
        ("amount", "clamped"): int(((amount < 0) | (amount > 100)).sum()),
        ("seen", "clamped"): int(((days < lo_day) | (days > hi_day)).sum()),
        ("color", "other"): int((~listed).sum()),
    }
    clamped = (age < 18) | (age > 90) | (amount < 0) | (amount > 100) | (days < lo_day) | (days > hi_day)
    assert (rep.rows_clamped, rep.rows_other, rep.rows_both) == (
        int(clamped.sum()),
        int((~listed).sum()),
        int((clamped & ~listed).sum()),
    )
    cells = rep.cells
    assert cells.failing + cells.unchanged + cells.clamped + cells.other + cells.both == raw.height
    assert cells.unchanged == int((~clamped & listed).sum())
    assert "2020-01-01, 2020-12-31" in next(a.detail for a in rep.adjustments if a.column == "seen")
    assert rep.to_dict()["changed_values"]["color"][0]["values"] == int((~listed).sum())


def test_a_hand_written_bound_still_fails_its_row_and_a_column_may_override(tmp_path: Path) -> None:
    raw = pl.DataFrame({"age": ["17", "30"], "amount": ["500", "5"], "seen": ["2020-02-02"] * 2, "color": ["red"] * 2})
    with pytest.raises(ValidationFailed) as err:
        validate(raw, schema(), "strict")
    assert {(f.column, f.check) for f in err.value.report.failures} == {("age", "bounds"), ("amount", "bounds")}  # type: ignore[attr-defined]
    clean, rep = validate(raw, schema(amount=CLAMP), "quarantine", tmp_path / "q.csv")
    assert clean["amount"].to_list() == [5.0] and rep.failing_rows == 1  # the age 17 row fails on age alone
    assert [(f.column, f.check) for f in rep.failures] == [("age", "bounds")]
    assert [(a.column, a.change, a.values) for a in rep.adjustments] == [("amount", "clamped", 1)]
    assert (rep.rows_clamped, rep.rows_other) == (0, 0)  # its only clamped row fails on age


def test_chunks_give_the_same_clamped_rows_report_and_cells(tmp_path: Path) -> None:
    raw = table(np.random.default_rng(9), 300).with_columns(
        pl.when(pl.int_range(0, 300) % 7 == 0).then(pl.lit("x")).otherwise(pl.col("age")).alias("age")
    )  # some rows fail (not a number) beside the clamped ones
    s = schema({"on_out_of_bounds": "clamp"}, color=OTHER)
    whole_seen: list[RowCells] = []
    whole, rep = validate(raw, s, "quarantine", tmp_path / "q1.csv", lambda f, p, cells: whole_seen.append(cells))
    parts: list[pl.DataFrame] = []
    chunk_seen: list[RowCells] = []
    merged = validate_chunks(
        (raw.slice(i, 64) for i in range(0, raw.height, 64)),
        s,
        "quarantine",
        tmp_path / "q2.csv",
        lambda f, p, **kw: chunk_seen.append(kw["cells"]),
        parts.append,
    )
    assert pl.concat(parts).equals(whole)
    assert whole_seen == chunk_seen and rep.cells == merged.cells
    assert merged.adjustments == rep.adjustments and merged.failures == rep.failures
    assert merged_report([merged], s) == merged


def test_old_callbacks_still_get_two_counts_and_the_cells_are_a_partition() -> None:
    raw = table(np.random.default_rng(2), 50)
    s = schema({"on_out_of_bounds": "clamp"}, color=OTHER)
    pairs: list[tuple[int, int]] = []
    validate(raw, s, "strict", None, lambda failing, passing: pairs.append((failing, passing)))
    cells = cells_of(raw, s)
    assert pairs == [(cells.failing, cells.passing)] and cells.passing == 50 and cells.clamp and cells.other_in_effect
    assert ask_gate(lambda f, p: f == 0, cells) is True


def test_one_out_of_bounds_row_moves_one_cell_by_one() -> None:
    """D vs D + one row: exactly one cell changes, by one (the histogram's L1 sensitivity 1), and
    an out-of-bounds row that clamps leaves the failing count where it was."""
    raw = table(np.random.default_rng(4), 120)
    s = schema({"on_out_of_bounds": "clamp"}, color=OTHER)
    base = cells_of(raw, s)
    extras = [
        {"age": "200", "amount": "5", "seen": "2020-02-02", "color": "red"},  # clamped only
        {"age": "30", "amount": "5", "seen": "2020-02-02", "color": "blue"},  # other only
        {"age": "-4", "amount": "5", "seen": "2030-02-02", "color": "blue"},  # both
        {"age": "30", "amount": "5", "seen": "2020-02-02", "color": "red"},  # unchanged
        {"age": "x", "amount": "500", "seen": "2020-02-02", "color": "blue"},  # failing
    ]
    names = ["failing", "unchanged", "clamped", "other", "both"]
    for extra, moved in zip(extras, ["clamped", "other", "both", "unchanged", "failing"], strict=True):
        after = cells_of(raw.vstack(pl.DataFrame([extra])), s)
        diff = {n: getattr(after, n) - getattr(base, n) for n in names}
        assert diff == {n: int(n == moved) for n in names}
    removed = [cells_of(raw.slice(0, i).vstack(raw.slice(i + 1)), s) for i in range(0, 120, 17)]
    for after in removed:
        assert sum(abs(getattr(after, n) - getattr(base, n)) for n in names) == 1


# ----------------------------------------------------------------------------- the gate


def test_the_gate_releases_one_laplace_draw_per_cell_at_the_gates_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[np.ndarray, float, float]] = []

    def seeded(value: np.ndarray, sens: float, nm: float) -> np.ndarray:
        calls.append((value.copy(), sens, nm))
        return value + np.random.default_rng(0).laplace(0.0, sens * nm, value.shape)

    monkeypatch.setattr(validation_gate, "laplace_mechanism", seeded)
    event = gate_event(0.5)
    cells = RowCells(3, 80, 10, 5, 2, clamp=True, other_in_effect=True)
    d = gate(3, 1e9, event, 97, -math.inf, cells)
    noise = np.random.default_rng(0).laplace(0.0, 2.0, 5)
    value, sens, nm = calls[0]
    assert value.tolist() == [3, 80, 10, 5, 2] and sens == 1.0 and nm == 2.0
    assert d.noisy_failing == pytest.approx(3 + noise[0])
    assert d.noisy_passing == pytest.approx(97 + noise[1:].sum())
    assert d.noisy_clamped == pytest.approx(12 + noise[2] + noise[4])
    assert d.noisy_other == pytest.approx(7 + noise[3] + noise[4])
    assert "rows had a value clamped to a bound" in d.describe() and "had a category sent to 'other'" in d.describe()
    # a schema that neither clamps nor declares `other` releases (failing, passing) as before
    plain = gate(3, 1e9, event, 97)
    assert calls[-1][0].tolist() == [3, 97] and plain.noisy_clamped is None and plain.noisy_other is None
    assert "clamped" not in plain.describe()
    only = gate(3, 1e9, event, 97, -math.inf, RowCells(3, 90, 7, clamp=True))
    assert calls[-1][0].tolist() == [3, 90, 7] and only.noisy_other is None and only.noisy_clamped is not None
    with pytest.raises(ValueError, match="not the rows given"):
        gate(3, 1e9, event, 96, -math.inf, cells)


def test_the_gate_cells_noise_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """With OpenDP's exact sampler: each cell's noise is Laplace(1/epsilon) and the passing count's
    the sum of four such draws (laplace_sum_tail), by KS tests each failing a correct gate with
    probability at most FALSE_FAILURE."""
    eps, n = 0.5, 1500
    event = gate_event(eps)
    cells = RowCells(3, 80, 10, 5, 2, clamp=True, other_in_effect=True)
    draws = [gate(3, 1e9, event, 97, -math.inf, cells) for _ in range(n)]
    b = 1.0 / eps
    f = np.array([d.noisy_failing for d in draws]) - 3
    p = np.array([d.noisy_passing for d in draws]) - 97
    assert stats.kstest(f, stats.laplace(scale=b).cdf).pvalue > FALSE_FAILURE

    def sum_cdf(x: np.ndarray) -> np.ndarray:
        y = np.abs(np.asarray(x)) / b
        tail = np.array([laplace_sum_tail(4, float(t)) for t in y])
        return np.where(np.asarray(x) >= 0, 1.0 - tail, tail)

    assert stats.kstest(p, sum_cdf).pvalue > FALSE_FAILURE
    assert stats.kstest(p, stats.laplace(scale=b).cdf).pvalue < 1e-3  # not a single draw: the test has power


def test_the_sum_of_laplace_tail_and_the_floor() -> None:
    for x in (0.0, 0.3, 2.0, 9.0):
        assert laplace_sum_tail(1, x) == pytest.approx(0.5 * math.exp(-x))
        assert laplace_sum_tail(2, x) == pytest.approx((2 + x) * math.exp(-x) / 4)
    assert laplace_sum_tail(4, 0.0) == pytest.approx(0.5)
    q = laplace_sum_quantile(4, 2.0, 1e-3)
    assert laplace_sum_tail(4, q / 2.0) == pytest.approx(1e-3, rel=1e-9)
    event = LaplaceEvent(2.0)
    assert floor(10_000, 50, event) == 100.0  # far from the noise: the fraction
    assert floor(200, 50, event) == pytest.approx(min(50.0, 200 - 2.0 * math.log(500)))
    assert floor(200, 50, event, passing_cells=4) == pytest.approx(min(50.0, 200 - q))
    assert passing_cells(schema()) == 1
    assert passing_cells(schema(amount=CLAMP)) == 2 and passing_cells(schema(color=OTHER)) == 2
    assert passing_cells(schema(amount=CLAMP, color=OTHER)) == 4


@pytest.mark.parametrize(
    "dataset,overrides",
    [({}, {}), ({"on_out_of_bounds": "clamp"}, {"color": OTHER}), ({}, {"amount": {**CLAMP, "nullable": True}})],
)
def test_typed_rows_are_validates_rows_without_great_expectations(dataset: dict, overrides: dict) -> None:
    """`typed_rows` (what a table read back is digested over) keeps exactly the rows `validate`
    keeps, typed, clamped and sent to `other` alike, including a line the reader could not read."""
    from privflow.data.io import UNREADABLE
    from privflow.data.validation import typed_rows

    s = schema(dataset, **overrides)
    df = table(np.random.default_rng(3), 400)
    df = df.with_columns(
        pl.when(pl.int_range(pl.len()) == 7).then(None).otherwise(pl.col("amount")).alias("amount"),
        pl.when(pl.int_range(pl.len()) == 9).then(pl.lit("line 11 is not valid CSV")).alias(UNREADABLE),
    )
    kept, report = validate(df, s, "strict", None, lambda _f, _p: False)
    assert 0 < kept.height < df.height and report.failing_rows > 0
    assert typed_rows(df, s).equals(kept)
    assert typed_rows(df.drop("color"), s).height == 0  # a missing column: no passing row
