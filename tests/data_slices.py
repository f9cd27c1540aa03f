"""Small real tables for end-to-end tests: slices of the bundled Adult demo with a schema whose
public expected_rows is the slice's size (so the plan's sample rate matches the rows)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml


def adult_slice(tmp: Path, demo_dir: Path, rows: int) -> tuple[Path, Path]:
    """The first `rows` rows of the demo's Adult file and its schema with expected_rows = rows."""
    data = tmp / "adult.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=rows).write_csv(data)
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = rows
    schema = tmp / "adult.yaml"
    schema.write_text(yaml.safe_dump(doc))
    return data, schema
