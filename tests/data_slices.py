"""Small real tables for end-to-end tests: slices of the bundled Adult demo with a schema whose
public expected_rows is the slice's size (so the plan's sample rate matches the rows)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml


def adult_slice(tmp: Path, demo_dir: Path, rows: int, bad_age: int = 0) -> tuple[Path, Path]:
    """The first `rows` rows of the demo's Adult file and its schema with expected_rows = rows;
    the first `bad_age` rows get an age far outside the schema's public bounds."""
    data = tmp / "adult.csv"
    frame = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=rows)
    if bad_age:
        frame = frame.with_columns(
            pl.when(pl.int_range(pl.len()) < bad_age).then(pl.lit("999")).otherwise(pl.col("age")).alias("age")
        )
    frame.write_csv(data)
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = rows
    schema = tmp / "adult.yaml"
    schema.write_text(yaml.safe_dump(doc))
    return data, schema


def small_config(data: Path, schema: Path, store: Path, model_name: str, epsilon: float, **sections: dict):
    """A quick end-to-end run's config: the MAF backbone with one block of 8 hidden units, one
    epoch of batch 256, 20 target-head steps, delta 1e-5, 300 synthetic rows and only the fidelity
    diagnostics; `sections` add to (or replace keys of) those sections, or set others."""
    from privflow.core.config import RunConfig

    base: dict[str, dict] = {
        "model": {"name": "maf", "blocks": 1, "hidden": 8},
        "train": {"epochs": 1, "batch_size": 256},
        "evaluate": {"synthetic_rows": 300, "utility": False, "privacy_risk": False, "report": False},
        "head": {"steps": 20},  # the target head on (as by default), trained briefly
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return RunConfig.build(
        data=data,
        schema_path=schema,
        store=store,
        model_name=model_name,
        privacy={"epsilon": epsilon, "delta": 1e-5},
        **base,
    )
