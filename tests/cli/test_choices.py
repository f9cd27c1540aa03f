"""Options with a fixed set of values are typed choices: `--help` lists them, a bad value is
click's one-paragraph usage error (exit 2, no traceback, no pydantic message), checked before
the command's body runs (nothing is created). Case is ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from privflow.cli import app
from tests.cli._helpers import invoke, runner, text

pytestmark = pytest.mark.usefixtures("cli_process_state")

RUN = ["run", "--data", "d.csv", "--schema", "s.yaml"]
CHOICES = [
    (RUN, "--flow", "gpt", ["dphflow", "maf"]),
    (RUN, "--model", "gpt", ["dphflow", "maf"]),  # the deprecated spelling of --flow
    (RUN, "--policy", "lenient", ["strict", "quarantine"]),
    (RUN, "--device", "gpu", ["auto", "cpu", "cuda"]),
    (RUN, "--promote", "sometimes", ["if-better", "always", "never"]),
    (RUN, "--engine", "dask", ["prefect", "local"]),
    (["demo"], "--promote", "sometimes", ["if-better", "always", "never"]),
    (["demo"], "--engine", "dask", ["prefect", "local"]),
    (["pretrain", "--data", "p.csv", "--schema", "s.yaml"], "--flow", "realnvp", ["dphflow", "maf"]),
    (["pretrain", "--data", "p.csv", "--schema", "s.yaml"], "--device", "tpu", ["auto", "cpu", "cuda"]),
    (
        ["dpad", "fit", "--data", "d.csv", "--schema", "s.yaml", "-k", "3", "--epsilon-per-query", "0.1"],
        "--flow",
        "gpt",
        ["dphflow", "maf"],
    ),
    (["generate", "--model", "m@a", "-n", "5", "-o", "o.csv"], "--device", "gpu", ["auto", "cpu", "cuda"]),
    (["audit", "--data", "d.csv", "--schema", "s.yaml", "--epsilon", "1"], "--mutate", "noise", ["none", "noise/10"]),
]


@pytest.mark.parametrize(
    ("command", "option", "value", "choices"),
    CHOICES,
    ids=[f"{' '.join(c[0][:2] if c[0][0] == 'dpad' else c[0][:1])} {c[1]}" for c in CHOICES],
)
def test_a_bad_choice_is_a_usage_error(
    tmp_path: Path, command: list[str], option: str, value: str, choices: list[str]
) -> None:
    store = tmp_path / "store"
    result = invoke(*command, option, value, "--store", store)
    assert result.exit_code == 2, result.output
    said = text(result.output)
    assert f"Invalid value for '{option}'" in said and f"'{value}' is not one of" in said, said
    assert all(f"'{c}'" in said for c in choices), said
    assert "Traceback" not in result.output and "Input should be" not in said  # no pydantic message
    assert said.count("Invalid value") == 1
    assert not store.exists()


@pytest.mark.parametrize(
    ("command", "listed"),
    [
        (["run"], ["dphflow|maf", "strict|quarantine", "auto|cpu|cuda", "if-better|always|never", "prefect|local"]),
        (["demo"], ["if-better|always|never", "prefect|local"]),
        (["pretrain"], ["dphflow|maf", "auto|cpu|cuda"]),
        (["dpad", "fit"], ["dphflow|maf"]),
        (["generate"], ["auto|cpu|cuda"]),
        (["audit"], ["none|noise/10|no-clip"]),
    ],
)
def test_help_lists_the_choices(command: list[str], listed: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})  # no metavar wrapped in its column
    assert result.exit_code == 0
    shown = text(result.output)
    for choices in listed:
        assert choices in shown, (choices, result.output)


def test_choices_ignore_case_and_reach_the_config_as_it_spells_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import privflow.cli.run as run_command

    for name in ("PREFECT_API_URL", "PRIVFLOW_ENGINE", "PRIVFLOW_PREFECT", "PRIVFLOW_NO_SERVER"):
        monkeypatch.delenv(name, raising=False)
    seen: list[tuple[dict, str | None]] = []
    monkeypatch.setattr(
        run_command, "_run_body", lambda c, overrides, q, v, promote, server=True: seen.append((overrides, promote))
    )
    args = ["--flow", "MAF", "--policy", "Quarantine", "--device", "CPU", "--promote", "If-Better"]
    result = invoke(*RUN, *args)
    assert result.exit_code == 0, result.output
    [(overrides, promote)] = seen
    assert overrides["model"] == {"name": "maf"} and overrides["policy"] == "quarantine"
    assert overrides["train"]["device"] == "cpu" and promote == "if-better"
    assert all(type(v) is str for v in (overrides["model"]["name"], overrides["policy"], promote))


def test_the_schema_group_says_what_it_holds() -> None:
    result = invoke("schema", "--help")
    assert result.exit_code == 0
    shown = text(result.output)
    assert "Draft and check" not in shown and "draft" in shown and "privflow check" in shown
    assert invoke("--help").exit_code == 0 and "Draft and check" not in text(invoke("--help").output)
