"""Benchmark datasets: DP-NF's 2-D densities (generated with fixed seeds) and the bundled
Adult and German credit tables with fixed train/test splits.

2-D densities (Waites & Cummings 2021, Appendix C, Table 3: 30,000 points each, split 90/10
into train and test as in their Sec. 4.2.1):

- ``pinwheel``: Johnson et al. (2016)'s generator with DP-NF's parameters (radial std 0.3,
  tangential std 0.05, 5 arms, rate 0.25, coordinates x10).
- ``half-moons``: two interleaving half circles with Gaussian noise 0.05 (sklearn's
  ``make_moons`` geometry; the angle is drawn uniformly instead of on an even grid so that
  the rows are i.i.d. draws of one density).
- ``8-gaussians``: eight isotropic Gaussians (std 0.2) centred on the circle of radius 2
  around (3, 3), equal weights (DP-NF's "Gaussians" dataset).

Each 2-D density has public bounds (a box holding all but a negligible tail of it) and a
schema written here in code. Rows outside the box are redrawn, so the data is a draw of the
density truncated to the box and the codec never clips it. DP-NF reports test NLL on
*standardised* data; `standardisation` gives the population mean and std of each generator
(from a large reference sample with a seed of its own, public: it depends on no private
row), and `std_nll_offset` turns a model's nats per row in privflow's encoded space into
nats per row in DP-NF's standardised coordinates.

Imported as ``benchmarks.datasets`` from the repository root (benchmarks/__init__.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import polars as pl

from privflow.data.schema import Schema

if TYPE_CHECKING:
    from privflow.data.codec import Codec

DEMO = Path(__file__).resolve().parent.parent / "src" / "privflow" / "demo"

TWO_D: tuple[str, ...] = ("pinwheel", "half-moons", "8-gaussians")
TABULAR: tuple[str, ...] = ("adult", "german")
ALL: tuple[str, ...] = TABULAR + TWO_D

TWO_D_ROWS = 30_000  # DP-NF Table 3
TEST_FRACTION = 0.1  # DP-NF Sec. 4.2.1: 90% train, 10% test
GERMAN_TRAIN_FRACTION = 0.7
DATA_SEED = 20210601  # the one seed every 2-D dataset and the German split are drawn with
_REFERENCE_SEED = 777  # a separate stream for the population moments used by the NLL conversion
_REFERENCE_ROWS = 1_000_000

# Public boxes: each holds the density up to >= 5 standard deviations of its noise.
BOUNDS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    # radius 10 * |(1 + 0.3 e1, 0.05 e2)| <= 25 for e1 <= 5
    "pinwheel": ((-25.0, 25.0), (-25.0, 25.0)),
    # x in [-1, 2], y in [-0.5, 1] before noise of std 0.05
    "half-moons": ((-1.5, 2.5), (-1.0, 1.5)),
    # centres within [1, 5] on each axis, std 0.2
    "8-gaussians": ((-0.5, 6.5), (-0.5, 6.5)),
}


def _pinwheel_raw(n: int, rng: np.random.Generator) -> np.ndarray:
    """Johnson et al. (2016) pinwheel with DP-NF's parameters (arms drawn with equal weight)."""
    arms, rate = 5, 0.25
    feats = rng.standard_normal((n, 2)) * np.array([0.3, 0.05])
    feats[:, 0] += 1.0
    label = rng.integers(0, arms, size=n)
    angle = 2.0 * np.pi * label / arms + rate * np.exp(feats[:, 0])
    c, s = np.cos(angle), np.sin(angle)
    # row vector times rotation [[c, -s], [s, c]]
    x = feats[:, 0] * c + feats[:, 1] * s
    y = -feats[:, 0] * s + feats[:, 1] * c
    return 10.0 * np.stack([x, y], axis=1)


def _half_moons_raw(n: int, rng: np.random.Generator) -> np.ndarray:
    """sklearn's two moons (upper: (cos t, sin t); lower: (1 - cos t, 0.5 - sin t)), noise 0.05."""
    t = rng.uniform(0.0, np.pi, size=n)
    lower = rng.random(n) < 0.5
    x = np.where(lower, 1.0 - np.cos(t), np.cos(t))
    y = np.where(lower, 0.5 - np.sin(t), np.sin(t))
    return np.stack([x, y], axis=1) + 0.05 * rng.standard_normal((n, 2))


def _eight_gaussians_raw(n: int, rng: np.random.Generator) -> np.ndarray:
    """Equal mixture of N(c_k, 0.2^2 I), c_k = (3, 3) + 2 (cos k pi/4, sin k pi/4)."""
    k = rng.integers(0, 8, size=n)
    angle = k * np.pi / 4.0
    centres = np.stack([3.0 + 2.0 * np.cos(angle), 3.0 + 2.0 * np.sin(angle)], axis=1)
    return centres + 0.2 * rng.standard_normal((n, 2))


_GENERATORS = {"pinwheel": _pinwheel_raw, "half-moons": _half_moons_raw, "8-gaussians": _eight_gaussians_raw}


def generate(name: str, n: int, seed: int) -> np.ndarray:
    """n rows [n, 2] of the 2-D density `name`, truncated to its public box; same seed, same rows."""
    if name not in _GENERATORS:
        raise ValueError(f"unknown 2-D density '{name}'; choose one of {TWO_D}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = np.random.default_rng(seed)
    (x_lo, x_hi), (y_lo, y_hi) = BOUNDS[name]
    parts, have = [], 0
    while have < n:
        draw = _GENERATORS[name](max(n - have, 64) + 64, rng)
        keep = draw[(draw[:, 0] >= x_lo) & (draw[:, 0] <= x_hi) & (draw[:, 1] >= y_lo) & (draw[:, 1] <= y_hi)]
        parts.append(keep)
        have += len(keep)
    return np.concatenate(parts, axis=0)[:n] if n else np.empty((0, 2))


def pinwheel(n: int, seed: int) -> np.ndarray:
    return generate("pinwheel", n, seed)


def half_moons(n: int, seed: int) -> np.ndarray:
    return generate("half-moons", n, seed)


def eight_gaussians(n: int, seed: int) -> np.ndarray:
    return generate("8-gaussians", n, seed)


def schema_2d(name: str, expected_rows: int) -> Schema:
    """The public schema of a 2-D density: two numeric columns x, y with the public box."""
    (x_lo, x_hi), (y_lo, y_hi) = BOUNDS[name]
    return Schema.model_validate(
        {
            "dataset": {"name": name, "expected_rows": int(expected_rows), "budget": {"epsilon": 1e6, "delta": 1e-5}},
            "columns": [
                {"name": "x", "type": "numeric", "bounds": [x_lo, x_hi]},
                {"name": "y", "type": "numeric", "bounds": [y_lo, y_hi]},
            ],
        }
    )


@cache
def standardisation(name: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """Population (mean, std) per axis of the truncated density, from 10^6 reference draws."""
    ref = generate(name, _REFERENCE_ROWS, _REFERENCE_SEED)
    mean, std = ref.mean(axis=0), ref.std(axis=0)
    return (float(mean[0]), float(mean[1])), (float(std[0]), float(std[1]))


def std_nll_offset(name: str) -> float:
    """NLL_standardised = NLL_encoded + this, in nats per row.

    The codec maps u_j = (x_j - lo_j) / (hi_j - lo_j) and DP-NF standardises s_j =
    (x_j - m_j) / sd_j, so s_j = u_j (hi_j - lo_j) / sd_j + const and, by change of variables,
    -log p_s(s) = -log p_u(u) + sum_j log((hi_j - lo_j) / sd_j).
    """
    _, std = standardisation(name)
    return float(sum(math.log((hi - lo) / sd) for (lo, hi), sd in zip(BOUNDS[name], std, strict=True)))


@dataclass(frozen=True)
class BenchmarkData:
    """A dataset ready for the benchmark: typed train/test frames under `schema`.

    `schema.dataset.expected_rows` is the public size of the training split (what the
    planner turns into a sample rate). `nll_offset` converts encoded-space NLL to the
    convention the papers report for this dataset (0 for the tables).
    """

    name: str
    kind: Literal["tabular", "2d"]
    schema: Schema
    train: pl.DataFrame
    test: pl.DataFrame
    nll_offset: float = 0.0

    @cached_property
    def codec(self) -> Codec:
        """The schema-only codec of this dataset (privflow/data/codec.py)."""
        from privflow.data.codec import Codec

        return Codec.from_schema(self.schema)


def _with_rows(schema: Schema, rows: int) -> Schema:
    doc = schema.model_dump(mode="json")
    doc["dataset"]["expected_rows"] = int(rows)
    return Schema.model_validate(doc)


def _validated(path: Path, schema: Schema, work: Path) -> pl.DataFrame:
    """Read and validate a bundled table (rows failing the schema are set aside and counted)."""
    from privflow.data.io import read_table
    from privflow.data.validation import validate

    df, _ = validate(read_table(path), schema, "quarantine", work / f"{path.stem}-quarantine.csv")
    return df


def _subsample(df: pl.DataFrame, rows: int | None, seed: int) -> pl.DataFrame:
    if rows is None or df.height <= rows:
        return df
    return df.sample(n=rows, seed=seed, shuffle=True)


def load(
    name: str,
    work_dir: Path | str | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
) -> BenchmarkData:
    """Load `name` with its fixed split; `max_train`/`max_test` subsample it (seeded) for quick runs.

    adult: the published train/test files (src/privflow/demo). german: a fixed seeded 70/30 split
    of src/privflow/demo/german.csv. 2-D densities: 30,000 rows drawn with DATA_SEED, the first
    90% for training and the last 10% for testing.
    """
    import tempfile

    work = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir()) / "privflow-benchmark-data"
    work.mkdir(parents=True, exist_ok=True)
    if name == "adult":
        schema = Schema.from_yaml(DEMO / "adult.yaml")
        train = _subsample(_validated(DEMO / "adult_train.csv", schema, work), max_train, DATA_SEED)
        test = _subsample(_validated(DEMO / "adult_test.csv", schema, work), max_test, DATA_SEED + 1)
        return BenchmarkData(name, "tabular", _with_rows(schema, train.height), train, test)
    if name == "german":
        schema = Schema.from_yaml(DEMO / "german.yaml")
        full = _validated(DEMO / "german.csv", schema, work)
        order = np.random.default_rng(DATA_SEED).permutation(full.height)
        cut = int(round(GERMAN_TRAIN_FRACTION * full.height))
        train = _subsample(full[order[:cut].tolist()], max_train, DATA_SEED)
        test = _subsample(full[order[cut:].tolist()], max_test, DATA_SEED + 1)
        return BenchmarkData(name, "tabular", _with_rows(schema, train.height), train, test)
    if name in TWO_D:
        rows = generate(name, TWO_D_ROWS, DATA_SEED)
        cut = int(round((1.0 - TEST_FRACTION) * TWO_D_ROWS))
        tr, te = rows[:cut], rows[cut:]
        if max_train is not None:
            tr = tr[:max_train]
        if max_test is not None:
            te = te[:max_test]
        frame = lambda a: pl.DataFrame({"x": a[:, 0], "y": a[:, 1]}, schema={"x": pl.Float64, "y": pl.Float64})  # noqa: E731
        return BenchmarkData(name, "2d", schema_2d(name, len(tr)), frame(tr), frame(te), std_nll_offset(name))
    raise ValueError(f"unknown benchmark dataset '{name}'; choose from {ALL}")


__all__ = [
    "ALL",
    "BOUNDS",
    "BenchmarkData",
    "DATA_SEED",
    "TABULAR",
    "TWO_D",
    "eight_gaussians",
    "generate",
    "half_moons",
    "load",
    "pinwheel",
    "schema_2d",
    "standardisation",
    "std_nll_offset",
]
