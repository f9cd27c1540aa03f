"""A table of one's own (the README's path): a schema drafted by DP is part of the models'
lineage (privacy rule 9), and the whole path, draft -> check -> run -> generate, on a table with
an id, a date, a datetime, a flag and a point mass (examples/clinic_visits.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from privflow.cli import app
from privflow.data.schema import Schema
from privflow.flows.pipeline import _parent_link

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _schema(draft_run: str | None) -> Schema:
    doc = {
        "dataset": {"name": "t", "draft_run": draft_run} if draft_run else {"name": "t"},
        "columns": [{"name": "a", "type": "categorical", "categories": ["x", "y"]}],
    }
    return Schema.validated(doc)


def test_a_drafted_schema_links_the_draft_into_the_lineage() -> None:
    public = SimpleNamespace(spec="pre/1", ledger_run=None)
    private = SimpleNamespace(spec="m/3", ledger_run="run-3")
    assert _parent_link(None, _schema(None)) == []
    assert _parent_link(None, _schema("draft-1")) == [("schema draft", "draft-1")]
    # every private ancestor is linked: a public parent adds none, a private one adds its run
    assert _parent_link(public, _schema("draft-1")) == [("pre/1", None), ("schema draft", "draft-1")]  # type: ignore[arg-type]
    assert _parent_link(public, _schema(None)) == [("pre/1", None)]  # type: ignore[arg-type]
    assert _parent_link(private, _schema("draft-1")) == [("m/3", "run-3"), ("schema draft", "draft-1")]  # type: ignore[arg-type]


def test_a_schema_drafted_in_another_ledger_is_refused_before_anything(tmp_path: Path, demo_dir: Path) -> None:
    data = tmp_path / "adult.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=300).write_csv(data)
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["draft_run"] = "schema-draft-elsewhere"
    schema = tmp_path / "adult.yaml"
    schema.write_text(yaml.safe_dump(doc))
    store = tmp_path / "store"
    out = runner.invoke(app, ["run", "--data", str(data), "--schema", str(schema), "--store", str(store)])
    assert out.exit_code == 2, out.output
    assert "draft_run" in out.output and "schema-draft-elsewhere" in out.output and "Traceback" not in out.output
    assert not (store / "ledger.db").exists()  # nothing reserved, nothing charged


@pytest.mark.slow
def test_a_new_table_goes_from_csv_to_a_registered_model_with_a_drafted_schema(tmp_path: Path) -> None:
    """The README's path on examples/clinic_visits.py's table: `schema draft --epsilon`, `check`,
    `run`, `generate`, with no edit of the draft; dates come back in the input's format, the id
    is left out, and the version's epsilon composes the draft's charge with the run's."""
    import importlib.util
    import re

    from privflow.privacy.ledger import Ledger, compose_epsilon

    spec = importlib.util.spec_from_file_location("clinic_visits", ROOT / "examples" / "clinic_visits.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data, schema, store = tmp_path / "visits.csv", tmp_path / "visits.yaml", tmp_path / "store"
    example.visits(3000).write_csv(data)

    out = runner.invoke(
        app, ["schema", "draft", "--data", str(data), "--epsilon", "2", "-o", str(schema), "--store", str(store)]
    )
    assert out.exit_code == 0, out.output
    drafted = Schema.from_yaml(schema)
    kinds = {c.name: c.type for c in drafted.columns}
    assert kinds["visit_id"] == "ignore" and kinds["visit_date"] == "date" and kinds["arrived_at"] == "datetime"
    assert kinds["smoker"] == "boolean" and 0.0 in drafted.column("alcohol_units").atoms

    checked = runner.invoke(app, ["check", "--data", str(data), "--schema", str(schema)])
    assert checked.exit_code in (0, 3) and "CURATOR-ONLY" in checked.output, checked.output

    args = ["run", "--data", str(data), "--schema", str(schema), "--store", str(store), "--epochs", "1"]
    ran = runner.invoke(app, [*args, "--epsilon", "1"])
    assert ran.exit_code == 0, ran.output
    assert "schema draft" in ran.output  # the lineage line

    synthetic = tmp_path / "synthetic.csv"
    gen = runner.invoke(
        app,
        ["generate", "--model", "privflow-visits@champion", "-n", "500", "-o", str(synthetic), "--store", str(store)],
    )
    assert gen.exit_code == 0, gen.output
    rows = pl.read_csv(synthetic, infer_schema=False)
    assert "visit_id" not in rows.columns
    assert rows["visit_date"].drop_nulls().str.contains(r"^\d{4}-\d{2}-\d{2}$").all()
    assert rows["arrived_at"].drop_nulls().str.contains(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}$").all()
    assert set(rows["smoker"].drop_nulls()) <= {"yes", "no"}

    ledger = Ledger(store / "ledger.db")
    runs = ledger.runs("visits")
    assert [bool(re.match("schema-draft-", r.run_id)) for r in runs] == [True, False]
    chain = ledger.lineage(runs[1].run_id)
    assert chain.runs == (runs[0].run_id, runs[1].run_id)
    everything = [e for r in runs for e in r.events]
    assert chain.epsilon == pytest.approx(compose_epsilon(everything, chain.delta))
    assert chain.epsilon > compose_epsilon(list(runs[1].events), chain.delta)
