"""Calendar parts (privflow/data/calendar.py): a date or datetime seen through its day and time of
day, so that a grid of times and a season survive the copula codec's marginals."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from privflow.data import calendar
from privflow.data.copula import CopulaCodec, Marginals, marginal_of, schema_cells
from privflow.data.lowering import lower, lower_column
from privflow.data.schema import Column, DatasetInfo, Schema


def _lowered(type_: str, low: str, high: str, granularity: str | None = None) -> Column:
    return lower_column(Column(name="t", type=type_, bounds=(low, high), granularity=granularity, nullable=True))


CASES = [
    ("date", "1975-06-27", "2021-11-07", None, ["year", "yday"]),
    ("date", "2020-01-01", "2021-06-30", None, ["day"]),
    ("datetime", "1975-01-01T00:00:00", "2021-12-31T23:00:00", "hour", ["year", "yday", "time"]),
    ("datetime", "2020-01-01T00:00:00", "2020-03-01T00:00:00", "minute", ["day", "hour", "inhour"]),
    ("datetime", "2020-01-01T00:00:00", "2029-03-01T00:00:00", "second", ["year", "yday", "hour", "inhour"]),
    ("datetime", "1990-01-01T00:00:00", "2000-01-01T00:00:00", "day", ["year", "yday"]),
]


@pytest.mark.parametrize(("type_", "low", "high", "granularity", "parts"), CASES)
def test_parts_round_trip_every_value_inside_the_bounds(type_, low, high, granularity, parts) -> None:
    col = _lowered(type_, low, high, granularity)
    got = calendar.parts_of(col, 1024)
    assert [p.part for p in got] == parts
    lo, hi = int(col.bounds[0]), int(col.bounds[1])
    rng = np.random.default_rng(0)
    x = np.concatenate([[lo, hi], rng.integers(lo, hi + 1, 5000)]).astype(np.float64)
    values = [calendar.part_values(x, int(col.calendar_unit), p.part) for p in got]
    for p, v in zip(got, values, strict=True):
        assert p.low <= v.min() and v.max() <= p.high, p
    back = calendar.recompose(col, {p.part: v for p, v in zip(got, values, strict=True)})
    assert np.array_equal(back, x.astype(np.int64))


def test_parts_agree_with_the_calendar() -> None:
    """Against Python's datetime: 2016-12-31 18:00 is day 365 of a leap year, at hour 18."""
    col = _lowered("datetime", "1975-01-01T00:00:00", "2021-12-31T23:00:00", "hour")
    moment = datetime(2016, 12, 31, 18)
    units = np.array([(moment - datetime(1970, 1, 1)) // timedelta(hours=1)], dtype=np.float64)
    got = {p.part: calendar.part_values(units, 3600, p.part)[0] for p in calendar.parts_of(col, 1024)}
    assert got == {"year": 2016, "yday": moment.timetuple().tm_yday - 1, "time": 18}


def test_a_day_past_a_short_year_and_a_value_past_the_bounds_are_clamped() -> None:
    col = _lowered("date", "1975-06-27", "2021-11-07")
    assert [p.part for p in calendar.parts_of(col, 1024)] == ["year", "yday"]
    units = calendar.recompose(col, {"year": np.array([2019, 2021, 1975]), "yday": np.array([365, 364, 0])})
    days = [date(1970, 1, 1) + timedelta(days=int(u)) for u in units]
    assert days == [date(2019, 12, 31), date(2021, 11, 7), date(1975, 6, 27)]


def test_a_declared_column_keeps_its_name() -> None:
    col = _lowered("date", "1975-06-27", "2021-11-07")
    names = [p.name for p in calendar.parts_of(col, 1024, frozenset({"t", "t:year"}))]
    assert names == ["t:year'", "t:yday"]


def _storms(n: int, seed: int = 0) -> tuple[Schema, pl.DataFrame]:
    """Hourly datetimes on the 00/06/12/18 grid, June to November, over 46 years; a few nulls."""
    rng = np.random.default_rng(seed)
    years = rng.integers(1975, 2021, n)
    ydays = rng.integers(151, 334, n)
    hours = rng.choice([0, 6, 12, 18], n)
    moments = [
        datetime(int(y), 1, 1) + timedelta(days=int(d), hours=int(h))
        for y, d, h in zip(years, ydays, hours, strict=True)
    ]
    text = [m.strftime("%Y-%m-%d %H:%M:%S") if i % 50 else None for i, m in enumerate(moments)]
    schema = Schema(
        dataset=DatasetInfo(name="storms"),
        columns=(
            Column(
                name="when",
                type="datetime",
                bounds=("1975-01-01T00:00:00", "2021-12-31T23:00:00"),
                granularity="hour",
                format="%Y-%m-%d %H:%M:%S",
                nullable=True,
            ),
            Column(name="wind", type="integer", bounds=(0, 200)),
        ),
    )
    model = lower(schema)
    surface = schema.column("when")
    units = [None if t is None else surface.time_units(t) for t in text]
    frame = pl.DataFrame({"when": pl.Series(units, dtype=pl.Int64), "wind": rng.integers(10, 150, n)})
    return model, frame


def test_copula_codec_round_trips_calendar_columns() -> None:
    model, frame = _storms(2000)
    cells = schema_cells(model)
    codec = CopulaCodec(model, Marginals({c.column: marginal_of(frame, c) for c in cells}))
    assert [c.column for c in codec.cells] == ["when:year", "when:yday", "when:time", "wind"]
    back = codec.decode(codec.encode(frame, np.random.default_rng(1)))
    assert back.columns == ["when", "wind"]
    assert back.get_column("when").to_list() == frame.get_column("when").to_list()


def test_a_grid_of_times_and_a_season_survive_the_marginals() -> None:
    """Decoded from independent uniforms (no flow: the marginals alone), every time is on the
    6-hour grid and on the table's days of the year; as one integer column, most would not be."""
    model, frame = _storms(3000)

    def decoded(parts: bool) -> pl.Series:
        cells = schema_cells(model, calendar_parts=parts)
        m = Marginals({c.column: marginal_of(frame, c) for c in cells}, calendar_parts=parts)
        codec = CopulaCodec(model, m)
        u = np.random.default_rng(2).random((4000, codec.dim))
        units = codec.decode(u).get_column("when").drop_nulls().to_numpy()
        return pl.Series([datetime(1970, 1, 1) + timedelta(hours=int(h)) for h in units])

    for parts in (True, False):
        when = decoded(parts)
        on_grid = float((when.dt.hour() % 6 == 0).mean())
        in_season = float(when.dt.ordinal_day().is_between(152, 334).mean())  # the table's days of the year
        if parts:
            assert on_grid == 1.0 and in_season == 1.0
        else:
            assert on_grid < 0.5 and in_season < 0.97  # 27-day cells straddle the season's ends


def test_a_release_without_parts_loads_as_it_was_made() -> None:
    """Marginals stored before the parts existed (no `calendar_parts` key) keep one column."""
    model, frame = _storms(500)
    cells = schema_cells(model, calendar_parts=False)
    stored = Marginals({c.column: marginal_of(frame, c) for c in cells}, calendar_parts=False).to_dict()
    del stored["calendar_parts"]
    codec = CopulaCodec(model, Marginals.from_dict(stored))
    assert [c.column for c in codec.cells] == ["when", "wind"]
