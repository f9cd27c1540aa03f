"""The promotion's comparison (tasks/promote.py) reads the table with the total reader and a gate
that never stops: a malformed line is a failing row, dropped like any other (privacy rule 8),
and the margin is released all the same. Untrained flows stand in for two registered versions."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from privflow.core.config import RunConfig
from privflow.data.codec import Codec
from privflow.data.schema import Schema
from privflow.models import build_flow
from privflow.serving.release import Release
from privflow.tasks.promote import PromotionSettings, _noisy_margin


@pytest.mark.parametrize("policy", ["strict", "quarantine"])
def test_a_malformed_line_is_a_failing_row_of_the_comparison(tmp_path: Path, demo_dir: Path, policy: str) -> None:
    import torch

    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    torch.manual_seed(0)
    new, old = (
        Release(schema, [build_flow("maf", Codec.from_schema(schema).cardinalities, blocks=1, hidden=8)], version=v)
        for v in ("2", "1")
    )
    data = tmp_path / "rows.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=200).write_csv(data)
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join([*lines[:50], '"unterminated,' + lines[50], "\x00\n", *lines[51:]]))
    config = RunConfig.build(data=data, schema_path=demo_dir / "adult.yaml", store=tmp_path / "store", policy=policy)
    noisy, sensitivity = _noisy_margin(config, schema, new, old, PromotionSettings(epsilon=1.0), "p:promote")
    assert math.isfinite(noisy) and sensitivity > 0
