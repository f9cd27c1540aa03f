"""The audit flow on 2,000 Adult rows with a tiny MAF: mutants are caught, the default passes.

Runs the flow's function directly (no Prefect server); a few seconds per audit. The seeds are
the test-only override, so the outcome is reproducible.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from privflow.config import RunConfig
from privflow.flows.audit import audit_pipeline


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> RunConfig:
    tmp = tmp_path_factory.mktemp("audit")
    pl.read_csv(demo_dir / "adult_train.csv").head(2000).write_csv(tmp / "adult.csv")
    schema = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    schema["dataset"]["expected_rows"] = 2000
    (tmp / "adult.yaml").write_text(yaml.safe_dump(schema))
    return RunConfig.build(
        data=tmp / "adult.csv",
        schema_path=tmp / "adult.yaml",
        store=tmp / "store",
        privacy={"epsilon": 1.0, "delta": 1e-5},
        model={"name": "maf", "blocks": 2, "hidden": 16},
        train={"batch_size": 200, "epochs": 5, "threads": 1},
    )


@pytest.mark.parametrize("mutation", ["noise/10", "no-clip"])
def test_mutant_is_caught(config: RunConfig, mutation: str) -> None:
    report = audit_pipeline.fn(config, canaries=500, mutation=mutation, seed=3)
    assert report.epsilon_lower_bound > report.claimed_epsilon
    assert not report.passed


def test_shipped_default_passes_and_writes_only_the_audit_report(config: RunConfig) -> None:
    report = audit_pipeline.fn(config, canaries=500, seed=4)
    assert report.epsilon_lower_bound <= report.claimed_epsilon and report.passed
    assert report.guesses == 100 and 0 < report.included < 500
    path = Path(report.report_path)
    assert path.parent == config.store.resolve() / "audits"
    assert json.loads(path.read_text())["correct"] == report.correct
    assert not (config.store / "ledger.db").exists()  # no ledger spend, nothing registered
