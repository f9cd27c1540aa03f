"""A streamed run (`privflow run --stream`, tasks/stream.py): the table read in chunks, never whole.

One small run each way on the same Parquet table with failing rows, in process, with the DP
mixture prior (its DP-EM iterations read the rows from disk too): the streamed run never
reads the table whole, spends exactly what the run that reads it whole spends
(plan, events, epsilon), sees the same validation counts and quarantines the same rows at
the same positions, releases a valid synthetic table, and leaves no working file behind.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.data.validation import validate
from privflow.privacy.ledger import Ledger
from tests.data_slices import adult_slice

ROWS = 2500
BAD = [5, 1234, 2400]  # rows given an age outside the public bounds


def _no_prefect_api(*args: object, **kwargs: object) -> None:
    raise AssertionError("the streamed run reached Prefect's API")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_dir: Path, empty_store: Path):
    """(config, summary) of the run that reads the table whole and of the streamed run, in one
    store (new, its MLflow database already made: tests/conftest.py, `empty_store`)."""
    import prefect.client.orchestration as orchestration
    from prefect.server.api.server import SubprocessASGIServer

    import privflow.tasks.validate as whole_reader
    from privflow.flows.pipeline import train_in_process
    from tests.stores import copy_store

    tmp = tmp_path_factory.mktemp("stream")
    csv, schema = adult_slice(tmp, demo_dir, ROWS)
    store = copy_store(empty_store, tmp / "store")
    ints = [c.name for c in Schema.from_yaml(schema).columns if c.type == "integer"]
    df = pl.read_csv(csv, infer_schema=False).with_columns(pl.col(c).str.strip_chars().cast(pl.Int64) for c in ints)
    df = df.with_columns(pl.when(pl.int_range(pl.len()).is_in(BAD)).then(7).otherwise(pl.col("age")).alias("age"))
    data = tmp / "adult.parquet"
    df.write_parquet(data, row_group_size=600)

    def config(model_name: str, stream: bool) -> RunConfig:
        return RunConfig.build(
            data=data,
            schema_path=schema,
            store=store,
            model_name=model_name,
            policy="quarantine",
            privacy={"epsilon": 2.0, "delta": 1e-5},
            model={"name": "maf", "blocks": 1, "hidden": 8, "prior": "mog"},  # DP-EM reads rows on disk too
            head={"steps": 20},
            train={"epochs": 1, "batch_size": 256, "checkpoint_every": 2, "min_effective_batch": 0},
            evaluate={"synthetic_rows": 300, "utility": False, "privacy_risk": False, "report": False},
            stream={"enabled": stream, "chunk_rows": 1000, "diagnostic_rows": 1000},
        )

    whole_cfg = config("privflow-adult-whole", False)
    whole = train_in_process(whole_cfg, show_progress=False)
    stream_cfg = config("privflow-adult-stream", True)
    with pytest.MonkeyPatch.context() as mp:

        def never(*args: object, **kwargs: object) -> None:
            raise AssertionError("the streamed run read the table whole")

        mp.setattr(whole_reader, "read_table", never)
        mp.setattr(orchestration, "get_client", _no_prefect_api)  # in process: no Prefect engine or server
        mp.setattr(SubprocessASGIServer, "start", _no_prefect_api)
        streamed = train_in_process(stream_cfg, show_progress=False)
    return (whole_cfg, whole), (stream_cfg, streamed)


def test_a_streamed_run_spends_what_a_whole_run_spends(runs) -> None:
    (whole_cfg, whole), (stream_cfg, streamed) = runs
    (a,) = [r for r in Ledger(whole_cfg.store / "ledger.db").runs() if r.run_id == whole.run_id]
    (b,) = [r for r in Ledger(stream_cfg.store / "ledger.db").runs() if r.run_id == streamed.run_id]
    assert a.status == b.status == "settled"
    assert b.reserved_events == a.reserved_events and b.events == a.events  # same mechanisms, same noise
    assert streamed.epsilon == pytest.approx(whole.epsilon, rel=1e-12)
    assert streamed.stages == whole.stages
    assert "dp_prior" in streamed.stages


def test_a_streamed_run_validates_and_quarantines_as_a_whole_run(runs) -> None:
    import json

    (_, whole), (_, streamed) = runs

    def report(summary) -> dict:  # noqa: ANN001
        doc = json.loads((Path(summary.curator_dir) / "validation.json").read_text())
        return doc | {"quarantine_path": None}

    assert report(streamed) == report(whole)
    assert report(streamed)["failing_rows"] == len(BAD)
    q = pl.read_csv(Path(streamed.curator_dir) / "quarantine.csv")
    assert q["_privflow_row"].to_list() == BAD
    assert q.equals(pl.read_csv(Path(whole.curator_dir) / "quarantine.csv"))


def test_a_streamed_run_releases_a_valid_table_and_leaves_no_working_file(runs) -> None:
    (_, whole), (stream_cfg, streamed) = runs
    schema = Schema.from_yaml(stream_cfg.schema_path)
    table = pl.read_csv(streamed.synthetic_path, infer_schema=False)
    assert table.columns == schema.names and table.height == 300
    assert validate(table, schema, policy="strict", quarantine_path=None)[0].height == 300
    assert not (Path(streamed.curator_dir) / "scratch").exists()
    assert set(streamed.metrics) == set(whole.metrics) and streamed.metrics  # diagnostics ran, on the sample


def test_a_streamed_run_records_the_keyed_sample_of_the_rows_it_was_charged_for(runs) -> None:
    """The streamed run never holds its rows whole: the ledger keeps the keyed sample of their
    digests, exactly the sampled part of what the whole run over the same rows recorded."""
    from privflow.privacy.fingerprint import digests_from_blob, is_sample, sampled

    (whole_cfg, whole), (_, streamed) = runs
    prints = {p.run_id: p for p in Ledger(whole_cfg.store / "ledger.db").row_prints("charged")}
    full, part = prints[whole.run_id], prints[streamed.run_id]
    assert not is_sample(full.fingerprint) and is_sample(part.fingerprint)
    assert len(part.digests) > 0
    assert set(digests_from_blob(part.digests)) == set(sampled(digests_from_blob(full.digests)))
    assert f"of {full.rows} rows" in part.fingerprint  # every clean row read, though only the sample is kept
    (summary,) = Ledger(whole_cfg.store / "ledger.db").curator_summary()
    assert {run: rows for run, rows, _ in summary["charged"]}[streamed.run_id] == full.rows  # the table's rows
