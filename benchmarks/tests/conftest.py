"""The benchmark's tests share the test-wide settings of tests/conftest.py (offline and quiet,
a temporary PRIVFLOW_HOME and PREFECT_HOME, set when it is imported, before any library) and
its session's temporary Prefect server, for the sweeps that run flows."""

from __future__ import annotations

import pytest

import tests.conftest as shared  # noqa: F401  (its import sets the test-wide environment)


@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect server for the session, as in tests/conftest.py; when a run that also collects tests/
    has one up already, that one (a second would start for nothing)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    if PREFECT_API_URL.value():
        yield
        return
    with prefect_test_harness(server_startup_timeout=180):
        yield
