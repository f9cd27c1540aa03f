"""validate: the schema's Great Expectations suite over the input file; the stop decision is the DP gate's."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from privflow.data.io import read_table
from privflow.data.schema import Schema
from privflow.data.validation import Gate, Policy, ValidationReport, validate


def validate_data(
    data_path: Path | str,
    schema: Schema,
    policy: Policy,
    quarantine_path: Path | None,
    gate: Gate | None = None,
) -> tuple[pl.DataFrame, ValidationReport]:
    """Read and validate; `gate` (the DP validation gate) decides whether failing rows stop the run,
    called as `gate(failing, passing)`, with `cells=RowCells` (the rows' partition: failing, passing
    unchanged, clamped, sent to other, both) where it takes that keyword (`validation.ask_gate`)."""
    return validate(
        read_table(data_path, max_line_bytes=schema.dataset.max_line_bytes),
        schema,
        policy=policy,
        quarantine_path=quarantine_path,
        gate=gate,
    )
