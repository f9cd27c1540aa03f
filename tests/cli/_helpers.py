"""What the tests of the CLI's conventions share: a small table and schema, the CLI invoked in
process, and its output as one line of text (click's usage errors unboxed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from privflow.cli import app

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"
runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def text(output: str) -> str:
    """The output as one line: typer's error panel's frame dropped, whitespace runs joined."""
    return " ".join(output.translate(str.maketrans("", "", "│╭╮╰╯─")).split())


def workspace(tmp_path: Path, rows: int = 400) -> dict[str, Path]:
    """A slice of the bundled Adult table, its schema (a copy) and a store folder not yet made."""
    data = tmp_path / "adult.csv"
    pl.read_csv(DEMO / "adult_train.csv", infer_schema=False, n_rows=rows).write_csv(data)
    schema = tmp_path / "adult.yaml"
    shutil.copy(DEMO / "adult.yaml", schema)
    return {"dir": tmp_path, "data": data, "schema": schema, "store": tmp_path / "store"}


def run_args(ws: dict[str, Path], *extra: object) -> list[object]:
    return ["run", "--data", ws["data"], "--schema", ws["schema"], "--store", ws["store"], "--quiet", *extra]
