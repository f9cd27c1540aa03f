"""Test-wide settings: offline and quiet before any library is imported; one temporary
Prefect server per session for the tests that run flows."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="privflow-tests-"))
os.environ["PRIVFLOW_HOME"] = str(_HOME)
os.environ["PREFECT_HOME"] = str(_HOME / "prefect")
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("MLFLOW_TRACKING_URI", None)
# every test composes for itself (tests/privacy/test_composed_cache.py turns the cache on)
os.environ["PRIVFLOW_ACCOUNTING_CACHE"] = "off"
# runs in tests compute their diagnostics in their own process: xdist already fills the cores
# (tests/core/test_timing.py turns the worker on where it tests it)
os.environ["PRIVFLOW_DIAGNOSTICS_WORKER"] = "0"
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per xdist worker: the workers already fill the cores, and oversubscribed
    # OpenMP pools (torch, numba, BLAS) made every step slower
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

from privflow.core import env  # noqa: E402

env.configure(_HOME)

DEMO = Path(__file__).resolve().parent.parent / "src" / "privflow" / "demo"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect server for the whole session, for the tests that run a Prefect flow
    (its start costs seconds per xdist worker; keeping those tests on one worker to start it once
    cost more in balance than it saved: 320 s against 274 s for the tier)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture()
def cli_process_state():
    """The CLI switches logging and warnings off for its process and sets environment variables:
    give a test that invokes it in process its state back afterwards."""
    import logging
    import warnings

    saved = dict(os.environ)
    with warnings.catch_warnings():
        yield
    logging.disable(logging.NOTSET)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    return DEMO


@pytest.fixture(scope="session")
def trained_store(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session's one small trained store (tests/stores.py), READ-ONLY: `store`, `data`,
    `schema`, the run's `config` (a RunConfig) and `summary` (its dict). Built once across xdist
    workers; a test that changes a store takes `store_copy` instead."""
    import json

    from filelock import FileLock

    from privflow.core.config import RunConfig
    from tests import stores

    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's base is a folder of the session's: the store goes beside them
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "trained-store"
    done = root / "trained.json"
    with FileLock(str(root) + ".lock"):
        if not done.exists():
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(stores.build(root, DEMO)))
    info = stores.load(done)
    config = RunConfig.model_validate(info["config"])
    return {
        "store": root / "store",
        "data": root / "adult.csv",
        "schema": root / "adult.yaml",
        "config": config,
        "summary": info["summary"],
        "seed": stores.SEED,
    }


@pytest.fixture()
def store_copy(trained_store: dict, tmp_path: Path) -> Path:
    """A private copy of the shared trained store, for a test that charges or registers."""
    from tests import stores

    return stores.copy_store(trained_store["store"], tmp_path / "store")


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store folder holding only MLflow's database with its schema made (tests/stores.py,
    `build_empty`), READ-ONLY: a test that trains into a new store, where how a store is first
    made is not under test, starts from `stores.copy_store(empty_store, <its store>)` and skips
    MLflow's migrations (seconds per new store). Built once across xdist workers."""
    from filelock import FileLock

    from tests import stores

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "empty-store"
    with FileLock(str(root) + ".lock"):
        if not (root / "built").exists():
            stores.build_empty(root)
            (root / "built").touch()
    return root / "store"


@pytest.fixture()
def new_store(empty_store: Path, tmp_path: Path) -> Path:
    """`tmp_path / "store"`: a new store for a test that trains or logs into one, its MLflow
    database already made (a copy of `empty_store`)."""
    from tests import stores

    return stores.copy_store(empty_store, tmp_path / "store")


TEST_FALSE_STOP = 1e-12


@pytest.fixture(scope="session", autouse=True)
def _gate_never_stops_a_clean_table_by_chance():
    """The gate stops a clean table with probability `gate.false_stop` (1e-3 by default): across
    the suite's many runs that would fail CI now and then on clean data. Runs in tests use 1e-12
    instead (a limit that noise alone never reaches). Session-wide, so that module-scoped
    fixtures that run a pipeline (set up before any function-scoped fixture) are covered too."""
    from privflow.privacy.mechanisms import validation_gate

    real = validation_gate.threshold
    real_floor = validation_gate.floor

    def threshold(policy_rows, event, false_stop=validation_gate.FALSE_STOP):
        return real(policy_rows, event, min(false_stop, TEST_FALSE_STOP))

    def floor(expected_rows, least, event, false_stop=validation_gate.FALSE_STOP, **kw):
        return real_floor(expected_rows, least, event, min(false_stop, TEST_FALSE_STOP), **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validation_gate, "threshold", threshold)
        mp.setattr(validation_gate, "floor", floor)
        yield real, real_floor


@pytest.fixture(autouse=True)
def _gate_odds_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _gate_never_stops_a_clean_table_by_chance
):
    """Tests marked `gate_odds` (tests of the gate itself) keep the product's odds."""
    if request.node.get_closest_marker("gate_odds") is not None:
        from privflow.privacy.mechanisms import validation_gate

        real, real_floor = _gate_never_stops_a_clean_table_by_chance
        monkeypatch.setattr(validation_gate, "threshold", real)
        monkeypatch.setattr(validation_gate, "floor", real_floor)
    yield


@pytest.fixture
def no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DP draft's samplers without noise (Laplace counts exact, Report-Noisy-Max the argmax), so
    that a test of what a draft decides is deterministic; the statistical behaviour under real
    noise is tested with a stated failure probability, or in the slow tier."""
    import numpy as np

    from privflow.privacy.mechanisms import dp_quantile, laplace

    monkeypatch.setattr(laplace, "exact_laplace", lambda v, s, m: np.asarray(v, dtype=np.float64).copy())
    monkeypatch.setattr(dp_quantile, "exact_noisy_max", lambda scores, s, e, monotone: int(np.argmax(scores)))


@pytest.fixture(scope="session", autouse=True)
def _seeded_noise():
    """Every test draws the same noise on every run (tests/seeded_noise.py)."""
    from tests.seeded_noise import SeededNoise, seeded

    noise = SeededNoise()
    with seeded(noise):
        yield noise


@pytest.fixture(autouse=True)
def _noise_seeded_by_test(request: pytest.FixtureRequest, _seeded_noise):
    """Reseed from the test's id before it and from a constant after it; a test marked
    `real_noise` (of a sampler's own law) draws from OpenDP and the OS instead."""
    from tests.seeded_noise import BETWEEN_TESTS, real

    if request.node.get_closest_marker("real_noise") is not None:
        with real(_seeded_noise):
            yield
    else:
        _seeded_noise.reseed(request.node.nodeid)
        yield
    _seeded_noise.reseed(BETWEEN_TESTS)
