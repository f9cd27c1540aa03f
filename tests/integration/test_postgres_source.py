"""`--data postgresql://...`: a real PostgreSQL on loopback (tests/integration/servers.py) read as
the private table by `privflow check` and an in-process `privflow run`, with the password in the
URI never shown: not in any output, MLflow param, ledger or other store file."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from tests.integration.servers import Stack, postgres_bin, start_postgres

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "privflow" / "demo"
ROWS = 300
PASSWORD = "Pg-s3cr&t@9"  # the server trusts loopback: the password is carried, never checked
TINY = {
    "policy": "quarantine",
    "model": {"name": "maf", "blocks": 1, "hidden": 8},
    "train": {"epochs": 1, "batch_size": 256, "device": "cpu", "threads": 1},
    "evaluate": {"synthetic_rows": 300, "utility": False, "privacy_risk": False, "report": False},
}
INTEGER = ("fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")


def _table(port: int) -> None:
    """Database `sales`, table `people`: the demo's first ROWS rows, integer columns typed, `age`
    as text: row 0's age is out of type ('abc'), row 1's is NULL (the schema's age is not nullable)."""
    import psycopg2

    con = psycopg2.connect(host="127.0.0.1", port=port, user="privflow", dbname="postgres")
    con.autocommit = True
    with con.cursor() as cur:
        cur.execute("CREATE DATABASE sales")
    con.close()
    frame = pl.read_csv(DEMO / "adult_train.csv", infer_schema=False, n_rows=ROWS)
    con = psycopg2.connect(host="127.0.0.1", port=port, user="privflow", dbname="sales")
    con.autocommit = True
    columns = ", ".join(f'"{c}" {"bigint" if c in INTEGER else "text"}' for c in frame.columns)
    rows = [list(r) for r in frame.iter_rows()]
    rows[0][0], rows[1][0] = "abc", None
    with con.cursor() as cur:
        cur.execute(f"CREATE TABLE people ({columns})")
        marks = ", ".join(["%s"] * frame.width)
        cur.executemany(f"INSERT INTO people VALUES ({marks})", [[v if v != "" else None for v in r] for r in rows])
    con.close()


def _files_text(folder: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in folder.rglob("*") if p.is_file()]


def _leaks(blob: bytes | str) -> list[str]:
    data = blob.encode() if isinstance(blob, str) else blob
    return [form for form in (PASSWORD, quote(PASSWORD, safe="")) if form.encode() in data]


def test_a_postgres_table_is_checked_and_trained_on_without_showing_the_password(tmp_path: Path) -> None:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL server binaries (initdb, postgres) are not installed")
    pytest.importorskip("adbc_driver_postgresql")
    from privflow.cli import app

    stack = Stack(tmp_path / "servers")
    try:
        backend = start_postgres(stack)
        port = int(backend.rsplit(":", 1)[1].split("/", 1)[0])
        _table(port)
        uri = f"postgresql://privflow:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/sales?table=people"
        doc = yaml.safe_load((DEMO / "adult.yaml").read_text())
        doc["dataset"].update({"name": "adult-pg", "expected_rows": ROWS})
        schema = tmp_path / "adult.yaml"
        schema.write_text(yaml.safe_dump(doc))
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(TINY))
        runner = CliRunner()

        # curator's dry run: exact counts, the two bad rows named by column
        checked = runner.invoke(app, ["check", "--data", uri, "--schema", str(schema)])
        out = checked.output
        assert checked.exit_code == 3, out
        assert f"{ROWS} rows read, {ROWS - 2} pass, 2 fail" in out, out
        assert "column 'age'" in out and "'abc'" in out, out

        # a connection refused in pre-flight: exit 2, one paragraph, host and database named
        wrong = uri.replace("/sales?", "/nosuch?")
        refused = runner.invoke(app, ["run", "--data", wrong, "--schema", str(schema), "--store", str(tmp_path / "x")])
        assert refused.exit_code == 2, refused.output
        assert "database 'nosuch' at 127.0.0.1" in " ".join(refused.output.split()) and not _leaks(refused.output)
        assert not (tmp_path / "x" / "ledger.db").exists()

        store = tmp_path / "store"
        run = runner.invoke(
            app,
            ["run", "--data", uri, "--schema", str(schema), "--config", str(config), "--store", str(store)]
            + ["--epsilon", "1", "--engine", "local", "--quiet"],
        )
        assert run.exit_code == 0, run.output
        assert not _leaks(run.output), run.output
        (report,) = list((store / "curator").glob("*/validation.json"))
        counts = json.loads(report.read_text())
        assert (counts["total_rows"], counts["failing_rows"]) == (ROWS, 2)

        from mlflow import MlflowClient

        from privflow.tasks import mlflow_store

        mlflow_store.tracking(store)
        client = MlflowClient()
        (experiment,) = [e for e in client.search_experiments() if e.name == "privflow-adult-pg"]
        (released,) = client.search_runs([experiment.experiment_id])
        assert released.data.params["data"] == uri.replace(quote(PASSWORD, safe=""), "***")
        assert "gate.noisy_failing_rows" in released.data.metrics
        for name, value in released.data.params.items():
            assert not _leaks(value), name
        leaked = [str(p) for p, blob in _files_text(store) if _leaks(blob)]
        assert not leaked, leaked  # MLflow's database and artifacts, the ledger, the curator folder

        # the same rows under a second dataset name: read for the identity check, refused before spending
        doc["dataset"]["name"] = "adult-pg2"
        second = tmp_path / "second.yaml"
        second.write_text(yaml.safe_dump(doc))
        again = runner.invoke(
            app,
            ["run", "--data", uri, "--schema", str(second), "--config", str(config), "--store", str(store)]
            + ["--epsilon", "1", "--engine", "local", "--quiet"],
        )
        assert again.exit_code == 2 and "dataset 'adult-pg'" in " ".join(again.output.split()), again.output
        assert not _leaks(again.output)
        from privflow.privacy.ledger import Ledger

        assert Ledger(store / "ledger.db").runs("adult-pg2") == []
        # last, as it needs cli/check.py to show --data as `as_data_source(data)` does (masked)
        assert not _leaks(out), out
    finally:
        stack.stop_all()
