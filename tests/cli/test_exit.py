"""How `privflow` starts and ends a run ("Fast at every size"):

- without a configured Prefect API the pipeline runs in process unless `--engine prefect`; with
  one (PREFECT_API_URL) under Prefect unless `--engine local` (or PRIVFLOW_ENGINE=local); the
  deprecated `--prefect` / `--no-server` still map onto it (tests/cli/test_deprecated.py);
- the console script skips the interpreter's teardown only after every exit handler has run,
  with the command's exit status and all of its output, and only when it is the process's
  first exit handler (a host process such as a test runner exits normally).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import privflow.cli.run as run_command
from privflow.cli import app

runner = CliRunner()


@pytest.fixture()
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The `server` choice each `run` / `demo` call passes on (the body itself is not run)."""
    seen: list[bool] = []

    def body(config_path, overrides, quiet, verbose, promote, server=True) -> None:  # noqa: ANN001
        seen.append(server)

    monkeypatch.setattr(run_command, "_run_body", body)
    return seen


def test_prefect_runs_only_when_asked_for_or_configured(
    recorded: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Prefect API configured: in process unless --engine prefect; an operator's PREFECT_API_URL:
    under Prefect unless --engine local (flag or PRIVFLOW_ENGINE); two that disagree (the engine and
    a deprecated flag's variable): a usage error (exit 2)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    for name in ("PRIVFLOW_ENGINE", "PRIVFLOW_PREFECT", "PRIVFLOW_NO_SERVER"):
        monkeypatch.delenv(name, raising=False)
    base = ["run", "--data", str(tmp_path / "a.csv"), "--schema", str(tmp_path / "a.yaml")]
    assert runner.invoke(app, base).exit_code == 0
    assert runner.invoke(app, [*base, "--engine", "prefect"]).exit_code == 0
    assert runner.invoke(app, ["demo", "--engine", "prefect"]).exit_code == 0
    assert runner.invoke(app, [*base, "--engine", "local"]).exit_code == 0
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert runner.invoke(app, base).exit_code == 0
    assert runner.invoke(app, [*base, "--engine", "local"]).exit_code == 0
    assert runner.invoke(app, ["demo", "--engine", "LOCAL"]).exit_code == 0  # choices ignore case
    monkeypatch.setenv("PRIVFLOW_ENGINE", "local")
    assert runner.invoke(app, base).exit_code == 0
    assert runner.invoke(app, [*base, "--engine", "prefect"]).exit_code == 0  # the flag wins over its variable
    assert recorded == [False, True, True, False, True, False, False, False, True]
    monkeypatch.delenv("PRIVFLOW_ENGINE")
    monkeypatch.setenv("PRIVFLOW_NO_SERVER", "1")
    contradiction = runner.invoke(app, [*base, "--engine", "prefect"])  # contradicts PRIVFLOW_NO_SERVER
    assert contradiction.exit_code == 2 and "contradict" in contradiction.output
    assert "PRIVFLOW_NO_SERVER" in contradiction.output and "Traceback" not in contradiction.output
    assert len(recorded) == 9  # refused before anything ran
    help_text = runner.invoke(app, ["run", "--help"]).output
    assert "--engine" in help_text and "prefect|local" in help_text and "PREFECT_API_URL" in help_text
    assert "--no-server" not in help_text and "--prefect " not in help_text  # hidden, deprecated


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` as a fresh interpreter's main script; its output and exit status."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)


# A command whose exit handler runs during the command (as Prefect's and MLflow's do) and an
# object that announces the interpreter's teardown when it is freed.
COMMAND = """
    import atexit, sys
    import privflow.cli as cli

    class Teardown:
        def __del__(self):
            print("teardown ran", flush=True)

    witness = Teardown()

    def command():
        atexit.register(lambda: print("handler ran", flush=True))
        print("output of the command", end="")  # unflushed, no newline
        sys.stderr.write("a message on stderr")
        raise SystemExit(3)

    cli.app = command
"""


def test_teardown_is_skipped_after_every_handler_with_the_exit_status(tmp_path: Path) -> None:
    done = _script(tmp_path, COMMAND + "    cli.main()\n")
    assert done.returncode == 3
    assert "output of the command" in done.stdout and "handler ran" in done.stdout
    assert "a message on stderr" in done.stderr
    assert "teardown ran" not in done.stdout  # the process ended before freeing modules


def test_a_host_process_keeps_its_normal_exit(tmp_path: Path) -> None:
    """An exit handler registered before main (a test runner's): main does not arm, so that
    handler and the teardown run as usual."""
    host = COMMAND + "    atexit.register(lambda: print('host handler ran', flush=True))\n    cli.main()\n"
    done = _script(tmp_path, host)
    assert done.returncode == 3
    assert "handler ran" in done.stdout and "host handler ran" in done.stdout
    assert "teardown ran" in done.stdout


def test_the_console_script_reports_an_error_in_full_with_status_2(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "privflow"
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    done = subprocess.run(
        [str(script), "ledger", "show", "--store", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "No ledger at" in done.stderr and "pass --store" in " ".join(done.stderr.split())
