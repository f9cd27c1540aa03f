"""Fixtures of the data tests: the validation tests' (tests/data/test_validation*.py) opt in by name."""

from __future__ import annotations

import pytest

from privflow.data.schema import Schema
from tests.data.validation_tables import DEMO


@pytest.fixture(scope="module")
def gx_imported() -> None:
    """Importing Great Expectations takes seconds; pay it once, outside any single test."""
    import great_expectations  # noqa: F401


@pytest.fixture(scope="module")
def adult_schema() -> Schema:
    return Schema.from_yaml(DEMO / "adult.yaml")
