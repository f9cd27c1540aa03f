"""The exit statuses (`privflow.core.errors.ExitStatus`, listed in the top-level `--help`) tell
apart a usage error (2), a budget refusal (4), a gate stop (5), rows failing `privflow check` (3)
and an internal error (1); each error is one paragraph, without a traceback. Nothing here trains:
the refusals come before any spend, and the gate stops a header-only table at its first step."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

import privflow.cli.run as run_command
from privflow.core.errors import (
    EXIT_STATUS_MEANINGS,
    BudgetExceeded,
    ConfigError,
    DataError,
    ExitStatus,
    GateStopped,
    ModelNotFound,
    PrivacyPlanError,
    SchemaError,
    StoreError,
    ValidationFailed,
    status_of,
)
from tests.cli._helpers import invoke, run_args, text, workspace

pytestmark = pytest.mark.usefixtures("cli_process_state")


@pytest.fixture()
def ws(tmp_path: Path) -> dict[str, Path]:
    return workspace(tmp_path)


def _one_paragraph_error(result, status: int) -> str:
    out = result.output
    assert result.exit_code == status, out
    assert "Traceback" not in out and [line[:6] for line in out.splitlines()].count("error:") == 1, out
    assert len(" ".join(out.split())) < 1500, out
    return " ".join(out.split())


def _over_budget(ws: dict[str, Path]) -> Path:
    doc = yaml.safe_load(ws["schema"].read_text())
    doc["dataset"]["budget"]["epsilon"] = 0.5
    tight = ws["dir"] / "tight.yaml"
    tight.write_text(yaml.safe_dump(doc))
    return tight


# ------------------------------------------------------------------------- the one definition


def test_the_statuses_are_distinct_and_each_has_a_meaning() -> None:
    assert len({int(s) for s in ExitStatus}) == len(ExitStatus)
    assert set(EXIT_STATUS_MEANINGS) == set(ExitStatus)
    assert (ExitStatus.OK, ExitStatus.INTERNAL, ExitStatus.USAGE) == (0, 1, 2)  # click's 2 for user errors
    assert len({ExitStatus.USAGE, ExitStatus.CHECK_FAILED, ExitStatus.BUDGET, ExitStatus.GATE_STOPPED}) == 4


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("x"), ExitStatus.USAGE),
        (SchemaError("x"), ExitStatus.USAGE),
        (DataError("x"), ExitStatus.USAGE),
        (StoreError("x"), ExitStatus.USAGE),
        (ModelNotFound("x"), ExitStatus.USAGE),
        (PrivacyPlanError("x"), ExitStatus.USAGE),
        (ValidationFailed("x"), ExitStatus.USAGE),  # a table that does not match its schema
        (BudgetExceeded("x"), ExitStatus.BUDGET),
        (GateStopped("x"), ExitStatus.GATE_STOPPED),
        (OSError(errno.ENOSPC, "No space left on device"), ExitStatus.USAGE),  # the machine's state
        (RuntimeError("a bug"), ExitStatus.INTERNAL),
        (KeyError("a bug"), ExitStatus.INTERNAL),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.name,
)
def test_each_error_class_maps_to_its_status(error: BaseException, status: ExitStatus) -> None:
    assert status_of(error) is status


def test_the_top_level_help_lists_every_status() -> None:
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    shown = text(result.output)
    assert "Exit statuses:" in shown
    for status, meaning in EXIT_STATUS_MEANINGS.items():
        assert f"{int(status)}: {meaning}." in shown, (status, shown)


# ----------------------------------------------------------------------------- each situation


def test_a_usage_error_exits_2(ws: dict[str, Path]) -> None:
    missing = _one_paragraph_error(invoke(*run_args(ws, "--data", ws["dir"] / "nope.csv")), 2)
    assert "nope.csv" in missing and "does not exist" in missing
    bad_flag = invoke(*run_args(ws, "--no-such-flag"))  # click's own usage error
    assert bad_flag.exit_code == 2 and "No such option" in text(bad_flag.output)
    assert "Traceback" not in bad_flag.output
    assert not ws["store"].exists()


def test_a_budget_refusal_exits_4_before_anything_is_spent(ws: dict[str, Path]) -> None:
    said = _one_paragraph_error(invoke(*run_args(ws, "--schema", _over_budget(ws), "--epsilon", "1")), 4)
    assert "budget" in said and "refused before reading any row" in said
    assert not (ws["store"] / "mlflow.db").exists()


def test_a_gate_stop_exits_5(ws: dict[str, Path], empty_store: Path) -> None:
    """A header-only table passes pre-flight (a private file's rows are never counted there) and
    is stopped by the gate's DP count, charging only the gate."""
    from privflow.privacy.ledger import Ledger
    from tests.stores import copy_store

    copy_store(empty_store, ws["store"])  # its MLflow database made (tests/conftest.py): not what is tested here

    header = ws["dir"] / "header.csv"
    header.write_text(ws["data"].read_text().splitlines()[0] + "\n")
    said = _one_paragraph_error(invoke(*run_args(ws, "--data", header)), 5)
    assert "validation gate stopped the run" in said and "privflow check" in said
    [charged] = Ledger(ws["store"] / "ledger.db").runs("adult")
    assert [e.kind for e in charged.events] == ["laplace"]


def test_rows_failing_check_exit_3_and_a_clean_table_0(ws: dict[str, Path]) -> None:
    clean = invoke("check", "--data", ws["data"], "--schema", ws["schema"])
    assert clean.exit_code == 0, clean.output
    bad = ws["dir"] / "bad.csv"
    pl.read_csv(ws["data"], infer_schema=False).with_columns(pl.lit("old").alias("age")).write_csv(bad)
    failing = invoke("check", "--data", bad, "--schema", ws["schema"])
    assert failing.exit_code == 3, failing.output
    assert "Traceback" not in failing.output and "error:" not in failing.output  # a verdict, not an error
    unreadable = invoke("check", "--data", ws["dir"] / "nope.csv", "--schema", ws["schema"])
    assert _one_paragraph_error(unreadable, 2)


def test_an_internal_error_exits_1_in_one_paragraph(ws: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(run_command, "_run_body", bug)
    said = _one_paragraph_error(invoke(*run_args(ws)), 1)
    assert "internal error" in said and "simulated bug" in said and "--verbose" in said
    verbose = invoke(*run_args(ws, "--verbose"))
    assert verbose.exit_code == 1 and "Traceback" in verbose.output


@pytest.mark.parametrize(
    ("error", "status"),
    [(BudgetExceeded("refused"), 4), (GateStopped("stopped"), 5), (ConfigError("bad"), 2)],
    ids=["budget", "gate", "usage"],
)
def test_where_a_run_raises_decides_nothing_but_the_class_does(
    ws: dict[str, Path], monkeypatch: pytest.MonkeyPatch, error: Exception, status: int
) -> None:
    """The same error class gives the same status wherever the run raises it (here from inside
    the pipeline's body, after pre-flight)."""

    def raises(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(run_command, "_run_body", raises)
    _one_paragraph_error(invoke(*run_args(ws)), status)


def test_the_console_script_exits_with_the_status(ws: dict[str, Path]) -> None:
    """The console script's own exit (core/startup.py, FAST_EXIT) keeps the status: 4, not 2 or 0."""
    script = Path(sys.executable).parent / "privflow"
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    argv = [str(a) for a in run_args(ws, "--schema", _over_budget(ws), "--epsilon", "1")]
    done = subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=120, cwd=ws["dir"])
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith("error:") and "Traceback" not in done.stderr
