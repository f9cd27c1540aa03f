"""The layout's rules, checked: layers only point down, the library imports neither Prefect
nor MLflow (import-linter contracts in pyproject.toml), nothing below flows/ imports Prefect (an
AST scan), and an installed privflow adds no generic top-level module to a user's environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_broken_contract_fails(tmp_path: Path) -> None:
    """The contracts bite (CI runs `lint-imports` on the tree itself): a privacy module that
    imports Prefect, in a copy of the package, breaks the forbidden contract."""
    shutil.copytree(REPO / "src" / "privflow", tmp_path / "privflow", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "privflow" / "privacy" / "_bad.py").write_text("import prefect\n")
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


def test_the_folder_is_the_import_path() -> None:
    """src layout: every package under src/privflow is importable under the same dotted path,
    and there is no package-dir remapping left in pyproject.toml."""
    import importlib

    assert "package-dir" not in (REPO / "pyproject.toml").read_text()
    root = REPO / "src"
    for init in sorted(root.rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(root).parts)
        assert Path(importlib.import_module(name).__file__).resolve() == init.resolve(), name


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


# the test modules at the top of tests/: the API's (src/privflow/api.py is a top-level module)
# and the suites that cross every layer; anything else lives in the folder of what it tests
TOP_LEVEL_TESTS = {
    "test_api.py",
    "test_api_errors.py",
    "test_architecture.py",
    "test_docs.py",
    "test_infra_scale_out.py",
    "test_seeded_noise.py",
    "test_totality.py",
    "test_totality_draft.py",
    "test_totality_lineage.py",
    "test_totality_reader.py",
    "test_totality_score.py",
}


def test_tests_mirror_the_package() -> None:
    """tests/X/ tests src/privflow/X/: every test folder but integration/ names a package folder,
    and no other test module sits at the top of tests/."""
    tests = Path(__file__).resolve().parent
    package = tests.parent / "src" / "privflow"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders - {"integration"} <= {p.name for p in package.iterdir() if p.is_dir()}
    top = {p.name for p in tests.glob("test_*.py")}
    assert top <= TOP_LEVEL_TESTS, sorted(top - TOP_LEVEL_TESTS)


# Prefect stays in flows/ (and the CLI and API that start flows): every layer below runs plain
# functions (flows/steps.py gives the steps their task options). core/startup.py is the one
# exception: the CLI's start-up engineering, which spawns Prefect's temporary server early.
NO_PREFECT = ("preflight", "tasks", "serving", "models", "privacy", "data", "core")
PREFECT_ALLOWED = {"core/startup.py"}


def _imports(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, at any depth (lazy imports too)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_flows_import_prefect() -> None:
    package = REPO / "src" / "privflow"
    offenders = [
        path.relative_to(package).as_posix()
        for layer in NO_PREFECT
        for path in sorted((package / layer).rglob("*.py"))
        if "prefect" in _imports(path) and path.relative_to(package).as_posix() not in PREFECT_ALLOWED
    ]
    assert not offenders, offenders
    # the scan sees lazy imports (flows/steps.py imports Prefect inside functions only), and the
    # exception is still needed
    assert all("prefect" in _imports(package / p) for p in {"flows/steps.py", *PREFECT_ALLOWED})
