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

from privflow import env  # noqa: E402

env.configure(_HOME)

DEMO = Path(__file__).resolve().parent.parent / "privflow" / "demo"


@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect server for the whole session (startup costs ~15-25 s here)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    return DEMO


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

    def floor(expected_rows, least, event, false_stop=validation_gate.FALSE_STOP):
        return real_floor(expected_rows, least, event, min(false_stop, TEST_FALSE_STOP))

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
