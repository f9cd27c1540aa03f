"""The layout's rules, checked: layers only point down, the library imports neither Prefect
nor MLflow (import-linter contracts in pyproject.toml), and an installed privflow adds no
generic top-level module to a user's environment."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_hold() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "lint-imports")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_contracts_are_checked(tmp_path: Path) -> None:
    """A broken contract fails: the forbidden contract catches a privacy module importing prefect."""
    module = runpy.run_path(str(REPO / ".ci" / "lint-imports"), run_name="lint_imports_ci")
    tree = module["build_tree"](tmp_path)
    (tree / "privflow" / "privacy" / "_bad.py").write_text("import prefect\n")
    exe = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(exe), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": str(exe.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "BROKEN" in done.stdout


def test_no_generic_top_level_modules(tmp_path: Path) -> None:
    """From outside the repo, `import models` fails while `import privflow` works."""
    code = (
        "import importlib.util, privflow, privflow.models, privflow.tasks\n"
        "bad = [m for m in ('models', 'privacy', 'tasks', 'flows') if importlib.util.find_spec(m)]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run(
        [sys.executable, "-c", "import models"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr
