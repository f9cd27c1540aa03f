"""`privflow --version`: the installed package's version, exit 0."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.cli._helpers import invoke


def test_version_prints_the_package_version_and_exits_0() -> None:
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"privflow {version('privflow')}"


def test_version_is_listed_in_the_top_level_help() -> None:
    result = invoke("--help")
    assert result.exit_code == 0 and "--version" in result.output


def test_the_console_script_prints_the_version() -> None:
    script = Path(sys.executable).parent / "privflow"
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"privflow {version('privflow')}"
