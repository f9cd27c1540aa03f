"""The renamed options keep working, hidden from `--help`, each with a one-line note on stderr:
`--model` for the flow family (now `--flow`) in `run`, `pretrain` and `dpad fit`, and `--prefect`
/ `--no-server` (and their variables) for `--engine prefect|local`. Contradictions are usage
errors (exit 2). `--model` in `generate` and `score` still names a registered model, without a note."""

from __future__ import annotations

from pathlib import Path

import pytest

import privflow.cli.dpad as dpad_command
import privflow.cli.pretrain as pretrain_command
import privflow.cli.run as run_command
from tests.cli._helpers import invoke, text

pytestmark = pytest.mark.usefixtures("cli_process_state")

RUN = ["run", "--data", "d.csv", "--schema", "s.yaml"]


@pytest.fixture()
def runs(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """What each `run` / `demo` call passes on (overrides, promote, server); the body is not run."""
    for name in ("PREFECT_API_URL", "PRIVFLOW_ENGINE", "PRIVFLOW_PREFECT", "PRIVFLOW_NO_SERVER"):
        monkeypatch.delenv(name, raising=False)
    seen: list[dict] = []

    def body(config_path, overrides, quiet, verbose, promote, server=True) -> None:  # noqa: ANN001
        seen.append({"overrides": overrides, "promote": promote, "server": server})

    monkeypatch.setattr(run_command, "_run_body", body)
    return seen


def _one_note(result, *needles: str) -> None:
    """Exactly one line of deprecation note, on stderr, naming `needles`."""
    notes = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert len(notes) == 1, result.stderr
    assert all(n in notes[0] for n in needles), notes[0]
    assert "deprecated" not in result.stdout


# ------------------------------------------------------------------------ --model -> --flow


def test_run_model_is_the_flow_family_with_a_note(runs: list[dict]) -> None:
    new = invoke(*RUN, "--flow", "maf")
    assert new.exit_code == 0, new.output
    assert "deprecated" not in new.output
    old = invoke(*RUN, "--model", "maf")
    assert old.exit_code == 0, old.output
    _one_note(old, "--model maf", "--flow maf")
    same = invoke(*RUN, "--flow", "maf", "--model", "maf")
    assert same.exit_code == 0, same.output
    assert [r["overrides"]["model"] for r in runs] == [{"name": "maf"}] * 3
    default = invoke(*RUN)
    assert default.exit_code == 0 and runs[-1]["overrides"]["model"] == {"name": None}  # the config's choice


def test_flow_and_model_naming_different_families_is_a_usage_error(runs: list[dict]) -> None:
    result = invoke(*RUN, "--flow", "dphflow", "--model", "maf")
    assert result.exit_code == 2, result.output
    said = text(result.output)
    assert "--flow dphflow and --model maf" in said and "Traceback" not in result.output
    assert runs == []


def test_pretrain_and_dpad_fit_take_flow_and_still_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pretrained: list[dict] = []
    fitted: list[str | None] = []
    monkeypatch.setattr(
        pretrain_command, "_pretrain", lambda config, overrides, quiet, verbose: pretrained.append(overrides)
    )
    monkeypatch.setattr(dpad_command, "_dpad_fit", lambda *args: fitted.append(args[8]))
    pre = ["pretrain", "--data", "public.csv", "--schema", "s.yaml"]
    fit = ["dpad", "fit", "--data", "d.csv", "--schema", "s.yaml", "-k", "3", "--epsilon-per-query", "0.1"]
    for base in (pre, fit):
        assert invoke(*base, "--flow", "maf").exit_code == 0
        old = invoke(*base, "--model", "maf")
        assert old.exit_code == 0, old.output
        _one_note(old, "--model maf", "--flow maf")
        assert invoke(*base, "--flow", "maf", "--model", "dphflow").exit_code == 2
    assert [o["model"] for o in pretrained] == [{"name": "maf"}] * 2
    assert fitted == ["maf", "maf"]


@pytest.mark.parametrize("command", [["run"], ["pretrain"], ["dpad", "fit"]])
def test_help_shows_flow_and_hides_the_deprecated_model(command: list[str]) -> None:
    shown = invoke(*command, "--help").output
    assert "--flow" in shown and "dphflow|maf" in shown
    assert "--model " not in shown


@pytest.mark.parametrize("command", ["generate", "score"])
def test_generate_and_score_keep_model_as_a_registered_model(tmp_path: Path, command: str) -> None:
    extra = ["-n", "5"] if command == "generate" else ["--data", "d.csv", "--threshold", "1"]
    result = invoke(command, "--model", "m@a", "-o", tmp_path / "o.csv", "--store", tmp_path / "store", *extra)
    assert result.exit_code == 2 and "deprecated" not in result.output, result.output  # no registry: a usage error
    assert "NAME@ALIAS" in invoke(command, "--help").output


# ------------------------------------------------------------- --prefect / --no-server -> --engine


@pytest.mark.parametrize(
    ("flag", "env", "server", "needles"),
    [
        (["--prefect"], {}, True, ["--prefect", "--engine prefect"]),
        (["--no-server"], {}, False, ["--no-server", "--engine local"]),
        ([], {"PRIVFLOW_PREFECT": "1"}, True, ["PRIVFLOW_PREFECT", "--engine prefect"]),
        ([], {"PRIVFLOW_NO_SERVER": "1"}, False, ["PRIVFLOW_NO_SERVER", "--engine local"]),
    ],
    ids=["--prefect", "--no-server", "PRIVFLOW_PREFECT", "PRIVFLOW_NO_SERVER"],
)
@pytest.mark.parametrize("command", ["run", "demo"])
def test_the_old_engine_flags_map_onto_engine_with_a_note(
    runs: list[dict], monkeypatch: pytest.MonkeyPatch, command: str, flag, env, server: bool, needles
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if server is False:  # only visible where the default would be Prefect's engine
        monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    base = RUN if command == "run" else ["demo"]
    result = invoke(*base, *flag)
    assert result.exit_code == 0, result.output
    _one_note(result, *needles)
    assert [r["server"] for r in runs] == [server]
    for name in env:
        monkeypatch.delenv(name)
    engine = invoke(*base, "--engine", "prefect" if server else "local")  # the same choice, without a note
    assert engine.exit_code == 0 and "deprecated" not in engine.output
    assert [r["server"] for r in runs] == [server, server]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--engine", "local", "--prefect"], {}, ["--engine local", "--prefect"]),
        (["--engine", "prefect", "--no-server"], {}, ["--engine prefect", "--no-server"]),
        (["--prefect", "--no-server"], {}, ["--prefect", "--no-server"]),
        (["--engine", "prefect"], {"PRIVFLOW_NO_SERVER": "1"}, ["--engine prefect", "PRIVFLOW_NO_SERVER"]),
        ([], {"PRIVFLOW_ENGINE": "local", "PRIVFLOW_PREFECT": "1"}, ["PRIVFLOW_ENGINE=local", "PRIVFLOW_PREFECT"]),
    ],
)
def test_contradicting_engine_choices_are_a_usage_error(
    runs: list[dict], monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict, named: list[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = invoke(*RUN, *args)
    assert result.exit_code == 2, result.output
    said = text(result.output)
    assert "contradict" in said and all(n in said for n in named), said
    assert "Traceback" not in result.output and runs == []


def test_the_old_engine_flags_are_hidden() -> None:
    for command in ("run", "demo"):
        shown = invoke(command, "--help").output
        assert "--engine" in shown and "prefect|local" in shown
        assert "--no-server" not in shown and "--prefect " not in shown
