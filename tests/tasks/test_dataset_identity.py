"""One budget per table (tasks/dataset_identity.py): the same rows under a second dataset
name are refused before anything is reserved, by `privflow run`'s pre-flight and by a DP draft."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.errors import PrivflowError
from privflow.data.schema import Schema
from privflow.privacy.fingerprint import table_rows
from privflow.privacy.ledger import Ledger
from privflow.tasks.dataset_identity import SameRowsOtherDataset, check_rows_not_charged_elsewhere
from privflow.tasks.warm_start import record_charged_rows
from tests.cli.test_schema_draft import _table

runner = CliRunner()


@pytest.fixture()
def charged(tmp_path: Path, demo_dir: Path) -> dict:
    """A store whose ledger charged 'adult' for 400 Adult rows (their keyed digests recorded as a
    run records them), and the next 400 rows as another table."""
    frame = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=800)
    data, other = tmp_path / "adult.csv", tmp_path / "other.csv"
    frame.head(400).write_csv(data)
    frame.tail(400).write_csv(other)
    schema_path = tmp_path / "adult.yaml"
    shutil.copy(demo_dir / "adult.yaml", schema_path)
    schema = Schema.from_yaml(schema_path)
    store = tmp_path / "store"
    ledger = Ledger(store / "ledger.db")
    ledger.ensure_dataset("adult", 10.0, 1e-5)
    record_charged_rows(ledger, store, "adult", "run-1", table_rows(data, schema))
    return {"data": data, "other": other, "schema": schema_path, "store": store, "frame": frame.head(400)}


def _renamed(schema: Path, name: str) -> Path:
    doc = yaml.safe_load(schema.read_text())
    doc["dataset"]["name"] = name
    out = schema.with_name(f"{name}.yaml")
    out.write_text(yaml.safe_dump(doc))
    return out


def _run(data: Path, schema: Path, store: Path):
    args = ["run", "--data", str(data), "--schema", str(schema), "--store", str(store), "--quiet"]
    return runner.invoke(app, args)


def test_the_same_rows_under_a_second_name_are_refused_before_any_run(charged: dict, tmp_path: Path) -> None:
    shuffled = tmp_path / "again.csv.gz"  # the same rows, gzipped and in another order
    with gzip.open(shuffled, "wb") as fh:
        charged["frame"].sample(fraction=1.0, shuffle=True, seed=1).write_csv(fh)
    second = _renamed(charged["schema"], "adult2")
    for data in (charged["data"], shuffled):
        result = _run(data, second, charged["store"])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "dataset 'adult'" in text and "privflow ledger link adult2 adult" in text
        assert "Traceback" not in result.output
    ledger = Ledger(charged["store"] / "ledger.db")
    assert ledger.runs("adult2") == [] and [d.name for d in ledger.datasets()] == ["adult"]


def test_a_different_table_and_the_same_dataset_pass(charged: dict) -> None:
    schema = Schema.from_yaml(charged["schema"])
    second = Schema.from_yaml(_renamed(charged["schema"], "adult2"))
    check_rows_not_charged_elsewhere(charged["other"], second, charged["store"], "adult2")
    check_rows_not_charged_elsewhere(charged["data"], schema, charged["store"], "adult")  # its own rows
    with pytest.raises(SameRowsOtherDataset):
        check_rows_not_charged_elsewhere(charged["data"], second, charged["store"], "adult2")


def test_a_curators_link_lets_the_second_name_through(charged: dict) -> None:
    second = Schema.from_yaml(_renamed(charged["schema"], "adult2"))
    result = runner.invoke(app, ["ledger", "link", "adult2", "adult", "--store", str(charged["store"])])
    assert result.exit_code == 0, result.output
    check_rows_not_charged_elsewhere(charged["data"], second, charged["store"], "adult2")
    notes = Ledger(charged["store"] / "ledger.db").curator_notes()
    assert {n[0] for n in notes} == {"adult", "adult2"} and Ledger(charged["store"] / "ledger.db").notes() == []


def test_no_row_is_read_without_another_datasets_row_prints(
    charged: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import privflow.data.io

    def fail(*_a, **_k):
        raise AssertionError("the table was read")

    monkeypatch.setattr(privflow.data.io, "read_table", fail)
    schema = Schema.from_yaml(charged["schema"])
    check_rows_not_charged_elsewhere(charged["data"], schema, charged["store"], "adult")  # only its own prints
    check_rows_not_charged_elsewhere(charged["data"], None, tmp_path / "nowhere", "adult2")  # no ledger
    bare = tmp_path / "bare"
    Ledger(bare / "ledger.db").ensure_dataset("adult", 10.0, 1e-5)  # a ledger without row prints
    check_rows_not_charged_elsewhere(charged["data"], None, bare, "adult2")
    check_rows_not_charged_elsewhere(charged["data"], schema, bare, "adult2")


def _draft(data: Path, out: Path, store: Path, name: str):
    args = ["--data", str(data), "-o", str(out), "--epsilon", "3", "--store", str(store), "--name", name]
    return runner.invoke(app, ["schema", "draft", *args])


def test_a_dp_draft_of_charged_rows_under_a_second_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_noise: None
) -> None:
    """A draft reads no schema: its raw rows are compared with the rows the first draft recorded as
    its own drafted schema types them (the identifier column ignored, numbers as numbers)."""
    from privflow.privacy.mechanisms import dp_bounds

    monkeypatch.setattr(dp_bounds, "FALSE_CELL", 1e-4)  # as tests/cli/test_schema_draft.py: no bound far out
    data, store = tmp_path / "bank.csv", tmp_path / "store"
    _table(data, rows=600)
    assert _draft(data, tmp_path / "bank.yaml", store, "bank").exit_code == 0
    assert [p.dataset for p in Ledger(store / "ledger.db").row_prints("charged")] == ["bank"]
    again = tmp_path / "again.csv.gz"
    frame = pl.read_csv(data, infer_schema=False)
    with gzip.open(again, "wb") as fh:
        frame.sample(fraction=1.0, shuffle=True, seed=2).write_csv(fh)
    for table in (data, again):
        result = _draft(table, tmp_path / "bank2.yaml", store, "bank2")
        assert result.exit_code == 2, result.output
        assert "dataset 'bank'" in " ".join(result.output.split())
    ledger = Ledger(store / "ledger.db")
    assert ledger.runs("bank2") == [] and not (tmp_path / "bank2.yaml").exists()
    # the run pre-flight compares typed rows: the drafted schema under a second name is refused too
    schema = Schema.from_yaml(_renamed(tmp_path / "bank.yaml", "bank2"))
    with pytest.raises(PrivflowError, match="dataset 'bank'"):
        check_rows_not_charged_elsewhere(again, schema, store, "bank2")
    other = tmp_path / "other.csv"
    _table(other, rows=600, seed=7)  # another table: drafted under its own name
    assert _draft(other, tmp_path / "other.yaml", store, "other").exit_code == 0


def test_a_streamed_run_is_checked_by_its_rows_keyed_sample(charged: dict, tmp_path: Path) -> None:
    """The charged rows as Parquet under a second name: refused read whole, and refused streamed
    (read chunk by chunk, compared through the keyed sample of its rows' digests)."""
    from privflow.core.config import RunConfig
    from privflow.preflight import preflight

    ints = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
    parquet = tmp_path / "adult.parquet"
    charged["frame"].with_columns(pl.col(c).str.strip_chars().cast(pl.Int64) for c in ints).write_parquet(parquet)
    common = {"data": parquet, "schema_path": _renamed(charged["schema"], "adult2"), "store": charged["store"]}
    for enabled in (True, False):
        with pytest.raises(SameRowsOtherDataset):
            preflight(RunConfig.build(stream={"enabled": enabled}, **common))


def test_rows_a_streamed_run_was_charged_for_are_refused_under_another_name(tmp_path: Path, demo_dir: Path) -> None:
    """A streamed run keeps only the keyed sample of its rows' digests; the same rows under a second
    dataset name, and as a pretraining table, are still refused (through their own rows in the
    sample), and other rows are not."""
    from privflow.privacy.fingerprint import row_digests, sampled, store_key
    from privflow.tasks.warm_start import check_pretraining_rows, record_charged_sample

    frame = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=8000)
    data, other = tmp_path / "adult.csv", tmp_path / "other.csv"
    frame.head(4000).write_csv(data)
    frame.tail(4000).write_csv(other)
    schema = Schema.from_yaml(shutil.copy(demo_dir / "adult.yaml", tmp_path / "adult.yaml"))
    store = tmp_path / "store"
    ledger = Ledger(store / "ledger.db")
    ledger.ensure_dataset("adult", 10.0, 1e-5)
    rows = table_rows(data, schema)
    record_charged_sample(ledger, "adult", "run-s", sampled(row_digests(rows, store_key(store))), rows.height)
    second = Schema.from_yaml(_renamed(tmp_path / "adult.yaml", "adult2"))
    with pytest.raises(SameRowsOtherDataset, match="dataset 'adult'"):
        check_rows_not_charged_elsewhere(data, second, store, "adult2")
    with pytest.raises(PrivflowError, match="dataset 'adult'"):
        check_pretraining_rows(rows, store, "adult.csv")
    check_rows_not_charged_elsewhere(other, second, store, "adult2")  # other rows: no refusal
    check_pretraining_rows(table_rows(other, schema), store, "other.csv")


def test_the_keyed_sample_holds_the_same_rows_of_every_table() -> None:
    """A digest is in the sample by its value: the same rows are sampled in two tables, about one
    row in SAMPLE_EVERY, so a table's sampled share found in another's sample is its share (keyed
    digests are uniform 64-bit values: drawn here from a seeded generator)."""
    from privflow.privacy.fingerprint import SAMPLE_EVERY, found_in, sampled

    rng = np.random.default_rng(0)
    digests = rng.integers(0, np.iinfo(np.uint64).max, 200_000, dtype=np.uint64, endpoint=True)
    other = np.concatenate([digests[:60_000], rng.integers(0, 2**63, 40_000, dtype=np.uint64)])
    whole, part = sampled(digests), sampled(other)
    assert abs(len(whole) / len(digests) - 1 / SAMPLE_EVERY) < 4 * np.sqrt(1 / SAMPLE_EVERY / len(digests))
    assert set(sampled(digests[:60_000])) <= set(whole) and set(part) >= set(sampled(digests[:60_000]))
    assert float(np.mean(found_in(part, whole))) == pytest.approx(0.6, abs=0.05)  # 60% of `other`'s rows


def test_reordered_columns_and_digits_read_as_labels_are_the_same_rows(charged: dict, tmp_path: Path) -> None:
    """The same rows with the columns in another order, and with a column of digits written with
    leading zeros and declared as labels, are still the charged rows."""
    frame = charged["frame"]
    reordered = tmp_path / "reordered.csv"
    frame.select(list(reversed(frame.columns))).write_csv(reordered)
    with pytest.raises(SameRowsOtherDataset):
        check_rows_not_charged_elsewhere(reordered, None, charged["store"], "adult2")
    doc = yaml.safe_load(charged["schema"].read_text())
    doc["dataset"]["name"] = "adult2"
    doc["columns"] = list(reversed(doc["columns"]))
    age = next(c for c in doc["columns"] if c["name"] == "age")
    values = sorted(set(frame.get_column("age").to_list()))
    age.clear()
    age.update({"name": "age", "type": "categorical", "categories": [v.zfill(3) for v in values]})
    relabelled = tmp_path / "relabelled.csv"
    frame.with_columns(pl.col("age").str.zfill(3)).write_csv(relabelled)
    schema_path = tmp_path / "adult2.yaml"
    schema_path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SameRowsOtherDataset):
        check_rows_not_charged_elsewhere(relabelled, Schema.from_yaml(schema_path), charged["store"], "adult2")
