"""`privflow generate`'s output path: batches streamed to one file read back as the whole
table, the schema's decimals in CSV text, dates written without a Python call per value, and a
local store's release loaded without MLflow (the same rows as MLflow's load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from privflow.data.codec import Codec
from privflow.data.lowering import _map_unique, _time_texts, _vector_format, _writer, csv_text, lower, to_surface
from privflow.data.schema import Schema
from privflow.models import build_flow
from privflow.serving.sampler import sample_rows, write_samples

TYPES = """
dataset: {name: types, expected_rows: 1000}
columns:
  - {name: admitted, type: date, bounds: ['2015-01-01', '2024-12-31'], format: '%d/%m/%Y', nullable: true}
  - {name: seen_at, type: datetime, bounds: ['2020-01-01T00:00:00', '2020-12-31T23:59:59'], granularity: minute}
  - {name: shift, type: datetime, bounds: ['2020-01-01', '2021-01-01'], granularity: hour, format: '%d.%m.%Y %H'}
  - {name: month, type: date, bounds: ['2015-01-01', '2024-12-31'], format: '%b %d %Y'}
  - {name: smoker, type: boolean, labels: ['yes', 'no']}
  - {name: patient_id, type: id}
  - {name: weight, type: numeric, bounds: [-30, 200], decimals: 2, nullable: true}
  - {name: dose, type: numeric, bounds: [0, 5000], decimals: 0}
  - {name: ratio, type: numeric, bounds: [0, 1]}
  - {name: ward, type: categorical, categories: [a, b, c]}
"""


@pytest.fixture(scope="module")
def types_release() -> tuple[Schema, torch.nn.Module, Codec]:
    schema = Schema.validated(yaml.safe_load(TYPES))
    codec = Codec.from_schema(lower(schema))
    torch.manual_seed(0)
    flow = build_flow("maf", codec.cardinalities, blocks=1, hidden=8).eval()
    return schema, flow, codec


def test_chunked_parquet_reads_back_as_the_table_written_at_once(types_release, tmp_path: Path) -> None:
    schema, flow, codec = types_release
    out = write_samples([flow], codec, 301, tmp_path / "s.parquet", seed=4, batch=64, schema=schema)
    whole = to_surface(sample_rows([flow], codec, 301, seed=4, batch=64), schema)
    whole.write_parquet(tmp_path / "whole.parquet")
    got, want = pl.read_parquet(out), pl.read_parquet(tmp_path / "whole.parquet")
    assert got.schema == want.schema and got.equals(want)
    assert "patient_id" not in got.columns and got.height == 301


def test_csv_writes_the_declared_decimals_and_reads_back_the_parquet_numbers(types_release, tmp_path: Path) -> None:
    schema, flow, codec = types_release
    csv = write_samples([flow], codec, 500, tmp_path / "s.csv", seed=9, batch=128, schema=schema)
    parquet = pl.read_parquet(
        write_samples([flow], codec, 500, tmp_path / "s.parquet", seed=9, batch=128, schema=schema)
    )
    text = pl.read_csv(csv, infer_schema=False)
    weights = [w for w in text.get_column("weight").to_list() if w is not None]
    assert weights and all(len(w.split(".")[1]) == 2 for w in weights)  # 3.10, never 3.1
    assert all("." not in d for d in text.get_column("dose").to_list())  # 0 decimals: 4, never 4.0
    numbers = pl.read_csv(csv, schema_overrides={c: pl.Float64 for c in ("weight", "dose", "ratio")})
    for name in ("weight", "dose", "ratio"):  # no decimals (ratio): float64's shortest round-trip text
        assert numbers.get_column(name).to_list() == parquet.get_column(name).cast(pl.Float64).to_list()
    assert text.get_column("admitted").to_list() == parquet.get_column("admitted").to_list()


def test_csv_text_of_negative_and_null_values() -> None:
    schema = Schema.validated(yaml.safe_load(TYPES))
    frame = pl.DataFrame({"weight": [-0.05, -12.5, 3.1, None, 0.0], "dose": [4.0, 0.0, 4999.0, 7.0, 12.0]})
    out = csv_text(frame, schema)
    assert out.get_column("weight").to_list() == ["-0.05", "-12.50", "3.10", None, "0.00"]
    assert out.get_column("dose").to_list() == ["4", "0", "4999", "7", "12"]


def test_dates_written_by_polars_match_pythons_strftime() -> None:
    schema = Schema.validated(yaml.safe_load(TYPES))
    rng = np.random.default_rng(0)
    temporal = {c.name: c for c in schema.columns if c.type in ("date", "datetime")}
    assert [n for n, c in temporal.items() if _vector_format(c)] == ["admitted", "seen_at", "shift"]  # not '%b'
    for name, col in temporal.items():
        low = lower(schema).column(name)
        lo, hi = (int(b) for b in low.bounds)
        units = pl.Series(name, [lo, hi, *rng.integers(lo, hi + 1, 2000).tolist(), None], dtype=pl.Int64)
        want = _map_unique(units, _writer(col), pl.String)
        assert _time_texts(units, col).to_list() == want.to_list()


# -- a registered release, loaded without MLflow ------------------------------------------------

MODEL = "privflow-adult"  # the shared trained store's model (tests/stores.py)


def test_a_local_release_samples_the_rows_mlflow_loads(trained_store: dict) -> None:
    from privflow.serving.local_store import load_local
    from privflow.tasks.mlflow_store import load_generator

    store = trained_store["store"]
    local = load_local(f"{MODEL}@champion", store)
    version = load_local(f"{MODEL}/1", store)
    assert local is not None and version is not None
    via_mlflow = load_generator(f"{MODEL}@champion", store).unwrap_python_model()
    ours = sample_rows(local.flows, local.codec, 700, seed=3)
    theirs = sample_rows(via_mlflow.flows, via_mlflow.codec, 700, seed=3)
    assert ours.equals(theirs) and local.schema == via_mlflow.schema


@pytest.mark.parametrize("spec", [f"{MODEL}@nosuchalias", f"{MODEL}/999", "nosuchmodel@champion", MODEL, "@x"])
def test_what_the_local_store_cannot_answer_goes_to_mlflow(trained_store: dict, spec: str) -> None:
    from privflow.serving.local_store import local_artifacts

    assert local_artifacts(spec, trained_store["store"]) is None


def test_an_operators_tracking_server_goes_to_mlflow(trained_store: dict, monkeypatch) -> None:
    from privflow.core import env
    from privflow.serving.local_store import local_artifacts

    assert local_artifacts(f"{MODEL}@champion", trained_store["store"]) is not None
    monkeypatch.setattr(env, "_OPERATOR_TRACKING_URI", "http://tracking:5000")
    assert local_artifacts(f"{MODEL}@champion", trained_store["store"]) is None


GENERATE_ALONE = """
import sys
from typer.testing import CliRunner
from privflow.cli import app
res = CliRunner().invoke(app, ["generate", "--model", sys.argv[1], "-n", "50", "-o", sys.argv[2],
                               "--store", sys.argv[3], "--seed", "1"])
assert res.exit_code == 0, res.output
print(",".join(m for m in ("mlflow", "pandas", "prefect") if m in sys.modules) or "none")
"""


def test_generate_from_a_local_store_imports_neither_mlflow_nor_prefect(trained_store: dict, tmp_path: Path) -> None:
    import os

    out = tmp_path / "s.csv"
    # without the tracking URI this test process set: the store's own registry, as a user runs it
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    done = subprocess.run(
        [sys.executable, "-c", GENERATE_ALONE, f"{MODEL}@champion", str(out), str(trained_store["store"])],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "none"
    assert pl.read_csv(out).height == 50
