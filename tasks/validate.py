"""validate: the schema's Great Expectations suite over the input file (not DP: for the data owner)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from prefect import task

from privflow.io import read_table
from privflow.schema import Schema
from privflow.validation import ValidationReport, validate
from tasks._options import PRIVATE


@task(name="validate", **PRIVATE)
def validate_data(
    data_path: Path, schema: Schema, policy: str, quarantine_path: Path | None
) -> tuple[pl.DataFrame, ValidationReport]:
    """Read and validate; strict raises ValidationFailed, quarantine sets failing rows aside."""
    return validate(read_table(data_path), schema, policy=policy, quarantine_path=quarantine_path)
