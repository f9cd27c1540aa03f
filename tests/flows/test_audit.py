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

from privflow.core.config import RunConfig
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


@pytest.fixture(scope="module")
def small_report(config: RunConfig):
    return audit_pipeline.fn(config, canaries=100, seed=5)


@pytest.mark.parametrize(
    ("mutation", "passed", "status"),
    [("none", True, 0), ("none", False, 3), ("no-clip", False, 0), ("no-clip", True, 3)],
)
def test_the_exit_status_says_whether_the_verdict_is_the_healthy_one(
    config: RunConfig, small_report, monkeypatch: pytest.MonkeyPatch, mutation: str, passed: bool, status: int
) -> None:
    """A scheduled or CI audit reads the exit status: 3 when the shipped configuration FAILs or a
    mutant PASSes (is not caught); it used to exit 0 either way."""
    from dataclasses import replace

    from typer.testing import CliRunner

    import privflow.flows.audit as audit_flow
    from privflow.cli import app

    def canned(*args: object, **kwargs: object) -> object:  # a real report, its verdict set
        return replace(small_report, mutation=mutation, passed=passed)

    monkeypatch.setattr(audit_flow, "audit_pipeline", canned)
    result = CliRunner().invoke(
        app,
        ["audit", "--data", str(config.data), "--schema", str(config.schema_path), "--epsilon", "1",
         "--canaries", "100", "--mutate", mutation, "--store", str(config.store)],
    )  # fmt: skip
    assert result.exit_code == status, result.output
    assert ("PASS" if passed else "FAIL") in result.output


def test_fewer_than_100_canaries_are_refused() -> None:
    from typer.testing import CliRunner

    from privflow.cli import app

    result = CliRunner().invoke(
        app, ["audit", "--data", "x.csv", "--schema", "x.yaml", "--epsilon", "1", "--canaries", "2"]
    )
    assert result.exit_code == 2 and "--canaries" in result.output
