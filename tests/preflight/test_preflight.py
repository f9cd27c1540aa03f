"""Pre-flight: imports no Prefect/MLflow/Great Expectations (nor torch without a GPU driver), checks
without reserving, and resolves the device. Its time on the demo is a benchmark
(benchmarks/bench_test_bounds.py, benchmarks/bench_overhead.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from privflow.core.config import RunConfig
from privflow.core.errors import BudgetExceeded, ConfigError, DeviceUnavailable
from privflow.preflight import nvidia_driver, preflight, resolve_device

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "privflow" / "demo"

CHILD = """
import json, sys
from privflow.core.config import RunConfig
from privflow.preflight import preflight
cfg = RunConfig.build(data=sys.argv[1], schema_path=sys.argv[2], store=sys.argv[3],
                      evaluate={"test_data": sys.argv[4]})
checked = preflight(cfg)
print(json.dumps({"rows": checked.rows, "device": checked.device,
                  "heavy": [m for m in ("prefect", "mlflow", "great_expectations") if m in sys.modules],
                  "torch": "torch" in sys.modules}))
"""


def test_demo_preflight_imports_no_server_library(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(DEMO / "adult_train.csv"),
            str(DEMO / "adult.yaml"),
            str(tmp_path / "store"),
            str(DEMO / "adult_test.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    # nor torch (a second of import), unless an NVIDIA driver makes `auto` ask torch about CUDA
    assert not out["torch"] or nvidia_driver()
    assert out["rows"] is None and out["device"] in ("cpu", "cuda")  # the private file's rows are never counted
    assert not (tmp_path / "store").exists()  # nothing created, nothing reserved


def test_minimum_rows_follows_the_validation_fraction() -> None:
    cfg = RunConfig.build(data="x.csv", schema_path="s.yaml")
    assert cfg.select.min_rows(None) == cfg.select.min_rows(32_561) == 20  # ceil(2 / 0.1)
    cfg = RunConfig.build(data="x.csv", schema_path="s.yaml", select={"validation_fraction": 0.4})
    assert cfg.select.min_rows(None) == 10


def test_selection_share_is_capped_by_the_public_expected_rows() -> None:
    """Above max_validation_rows / validation_fraction expected rows the split expects
    max_validation_rows rows; below, validation_fraction; the minimum row count follows."""
    cfg = RunConfig.build(data="x.csv", schema_path="s.yaml", select={"max_validation_rows": 50_000})
    assert cfg.select.fraction(None) == cfg.select.fraction(32_561) == cfg.select.fraction(500_000) == 0.1
    assert cfg.select.fraction(5_000_000) * 5_000_000 == pytest.approx(50_000)
    assert cfg.select.min_rows(5_000_000) == 200  # ceil(2 / 0.01)
    with pytest.raises(ConfigError, match="max_validation_rows"):
        RunConfig.build(data="x.csv", schema_path="s.yaml", select={"max_validation_rows": 1})


def test_device() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in ("cpu", "cuda")
    with pytest.raises(ConfigError, match="auto, cpu or cuda"):
        resolve_device("gpu")
    if not Path("/proc/driver/nvidia/version").exists():
        with pytest.raises(DeviceUnavailable, match="--device cpu"):
            resolve_device("cuda")


def test_budget_is_checked_against_the_ledger_without_reserving(tmp_path: Path) -> None:
    from privflow.privacy.accounting.events import PureDPEvent
    from privflow.privacy.ledger import Ledger

    store = tmp_path / "store"
    led = Ledger(store / "ledger.db")
    led.ensure_dataset("adult", 10.0, 1e-5, None)
    led.reserve("adult", "earlier", [PureDPEvent(9.5)])
    cfg = RunConfig.build(data=DEMO / "adult_train.csv", schema_path=DEMO / "adult.yaml", store=store)
    with pytest.raises(BudgetExceeded, match="1 earlier run"):
        preflight(cfg)
    assert [r.run_id for r in led.runs()] == ["earlier"]


@pytest.mark.parametrize("epsilon", [1e4, 1e6, float("inf"), float("nan")])
def test_huge_or_non_finite_epsilon_is_refused_at_once(epsilon: float) -> None:
    cfg = RunConfig.model_construct(
        **{**RunConfig.build(data=DEMO / "adult_train.csv", schema_path=DEMO / "adult.yaml").__dict__}
    )
    cfg = cfg.model_copy(update={"privacy": cfg.privacy.model_copy(update={"epsilon": epsilon})})
    with pytest.raises(ConfigError, match="epsilon"):
        preflight(cfg)


@pytest.mark.gate_odds
def test_gate_note_warns_when_the_gate_cannot_stop_the_run() -> None:
    """On a table no larger than the gate's limit (its noise floor at a small epsilon), even a table
    whose every row fails goes on: pre-flight says so; on a larger table it says nothing."""
    from types import SimpleNamespace

    from privflow.data.schema import Schema
    from privflow.preflight import gate_limit, gate_note
    from privflow.privacy.accounting.events import LaplaceEvent

    schema = Schema.from_yaml(DEMO / "adult.yaml")
    stage = SimpleNamespace(event=LaplaceEvent(50.0))  # the gate at epsilon 0.02: floor 50 ln 500 = 311
    plan = SimpleNamespace(stage=lambda name: stage)
    cfg = RunConfig.build(data="x.csv", schema_path="s.yaml", gate={"false_stop": 1e-3})

    def sized(rows: int | None) -> Schema:
        return schema.model_copy(update={"dataset": schema.dataset.model_copy(update={"expected_rows": rows})})

    small = sized(300)
    assert gate_limit(cfg, small, plan) == pytest.approx(50.0 * math.log(500.0))
    note = gate_note(cfg, small, plan)
    assert note is not None and "cannot stop" in note and "311" in note and "300 expected rows" in note
    assert "privacy.gate_share" in note
    assert gate_note(cfg, sized(32_000), plan) is None
    undeclared = gate_note(cfg, sized(None), plan)  # no expected_rows: no minimum of rows, and it says so
    assert undeclared is not None and "no public minimum of rows" in undeclared and "expected_rows" in undeclared


@pytest.mark.gate_odds
def test_the_gate_floor_is_public_and_below_the_noise_of_a_table_of_the_expected_size() -> None:
    from types import SimpleNamespace

    from privflow.data.schema import Schema
    from privflow.preflight import gate_floor
    from privflow.privacy.accounting.events import LaplaceEvent
    from privflow.privacy.mechanisms import validation_gate

    schema = Schema.from_yaml(DEMO / "adult.yaml")
    event = LaplaceEvent(50.0)
    plan = SimpleNamespace(stage=lambda name: SimpleNamespace(event=event))
    cfg = RunConfig.build(data="x.csv", schema_path="s.yaml")

    def sized(rows: int | None) -> Schema:
        return schema.model_copy(update={"dataset": schema.dataset.model_copy(update={"expected_rows": rows})})

    assert gate_floor(cfg, sized(32_000), plan) == pytest.approx(320.0)  # 1% of expected_rows
    assert gate_floor(cfg, sized(None), plan) == -math.inf
    # a small table: lowered so that a table of the expected size is stopped with probability <= false_stop
    noise = 50.0 * math.log(1.0 / (2.0 * 1e-3))
    assert validation_gate.floor(320, 20, event, 1e-3) == pytest.approx(320 - noise)  # 9 rows, not 20
    assert validation_gate.floor(2_000, 20, event, 1e-3) == pytest.approx(20.0)


def test_budget_delta_note_when_the_dataset_total_is_stated_at_a_meaningless_delta() -> None:
    """A budget delta of 1e-5 with two million expected rows: the dataset's total is stated at a
    delta above 1/n (fuzzing round 6 saw a cumulative 0.2248 printed under a run's own 0.4970);
    pre-flight says so and names a delta below 1/n. The demo's budget (1e-5 at 32,561 rows) is fine."""
    from privflow.data.schema import Schema
    from privflow.preflight import budget_delta_note

    schema = Schema.from_yaml(DEMO / "adult.yaml")
    assert budget_delta_note(schema) is None
    big = schema.model_copy(update={"dataset": schema.dataset.model_copy(update={"expected_rows": 2_000_000})})
    note = budget_delta_note(big)
    assert note is not None and "1e-05" in note and "5e-07" in note and "e.g. to 1e-08" in note


def test_preflight_says_whether_the_table_is_streamed(tmp_path: Path) -> None:
    """The CLI's first line names a streamed read (fuzzing round 6: a run streamed because its
    expected_rows passed stream.auto_rows did not say so anywhere)."""
    import polars as pl

    ints = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
    parquet = tmp_path / "adult.parquet"
    frame = pl.read_csv(DEMO / "adult_train.csv", infer_schema=False, n_rows=500)
    frame.with_columns(pl.col(c).str.strip_chars().cast(pl.Int64) for c in ints).write_parquet(parquet)
    common = {"schema_path": DEMO / "adult.yaml", "store": tmp_path / "store"}
    assert preflight(RunConfig.build(data=parquet, stream={"enabled": True}, **common)).streamed
    assert not preflight(RunConfig.build(data=parquet, stream={"enabled": False}, **common)).streamed
    assert not preflight(RunConfig.build(data=DEMO / "adult_train.csv", **common)).streamed


def test_atoms_note_when_the_marginals_that_keep_them_are_off() -> None:
    from privflow.data.schema import Schema
    from privflow.preflight import atoms_note

    schema = Schema.from_yaml(DEMO / "adult.yaml")
    cols = tuple(c.model_copy(update={"atoms": (0.0,)}) if c.name == "capital-gain" else c for c in schema.columns)
    with_atoms = schema.model_copy(update={"columns": cols})
    off = RunConfig.build(data="x.csv", schema_path="s.yaml", marginals={"enabled": False})
    on = RunConfig.build(data="x.csv", schema_path="s.yaml")
    note = atoms_note(off, with_atoms)
    assert note is not None and "capital-gain" in note and "marginals" in note
    assert atoms_note(on, with_atoms) is None and atoms_note(off, schema) is None
