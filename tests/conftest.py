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
