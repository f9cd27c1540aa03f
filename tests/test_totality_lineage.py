"""Privacy rule 9 against every laundering route: a version's epsilon is its lineage's, read
from the ledger (never from registry tags), DP drafts included; rows the ledger has charged are
never public, whatever their encoding or order.

- the charged training file gzipped, reordered, or re-encoded (UTF-16, Parquet) is refused by
  `privflow pretrain` (exit 2, one paragraph naming the dataset, no row value), nothing registered;
- a table `privflow generate` sampled from v1, pretrained on, is not public: a warm start from
  that pretraining reports the composition of v1's run and its own (recomputed here with
  `compose_epsilon` over `Ledger.runs`);
- a registry tag pointed at another (cheap) run changes nothing: the child's epsilon is still its
  true ledger lineage, which also holds the run's own DP schema draft beside its private parent;
- a parent the ledger does not record is refused before any ledger run is recorded.

Built on a copy of the session's small trained store (tests/stores.py; v1 = privflow-adult/1),
with in-process runs and the smallest configs.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.errors import ConfigError
from privflow.privacy.accounting.events import LaplaceEvent
from privflow.privacy.ledger import Ledger, compose_epsilon
from tests.data_slices import small_config

DRAFT_RUN = "schema-draft-lineage-test"
NEVER = {"promotion": "never"}  # no DP promotion comparison: the lineage is what is looked at


def _cli(*args: str):  # noqa: ANN202
    """The CLI in process, its environment given back afterwards (it configures MLflow's)."""
    saved = dict(os.environ)
    try:
        return CliRunner().invoke(app, list(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _composed(ledger: Ledger, runs: tuple[str, ...], delta: float) -> float:
    """The independent figure: `compose_epsilon` over the recorded events of `runs`."""
    records = {r.run_id: r for r in ledger.runs()}
    return compose_epsilon([e for run in runs for e in records[run].events], delta)


def _registered(store: Path) -> list[tuple[str, str]]:
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    return sorted((v.name, str(v.version)) for v in client.search_model_versions())


@pytest.fixture(scope="module")
def world(trained_store: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from privflow.flows.pipeline import train_in_process
    from privflow.flows.pretrain import pretrain_in_process
    from privflow.tasks import mlflow_store
    from tests import stores

    tmp = tmp_path_factory.mktemp("lineage")
    store = stores.copy_store(trained_store["store"], tmp / "store")
    data, schema = trained_store["data"], trained_store["schema"]
    v1 = trained_store["summary"]
    ledger = Ledger(store / "ledger.db")
    out: dict = {"tmp": tmp, "store": store, "data": data, "schema": schema, "v1": v1, "ledger": ledger}

    # the run's own DP schema draft (its ledger run, as `privflow schema draft --epsilon` records it)
    ledger.reserve("adult", DRAFT_RUN, [LaplaceEvent(4.0)])
    ledger.settle(DRAFT_RUN, [LaplaceEvent(4.0)])
    doc = yaml.safe_load(schema.read_text())
    doc["dataset"]["draft_run"] = DRAFT_RUN
    drafted = tmp / "adult-drafted.yaml"
    drafted.write_text(yaml.safe_dump(doc))
    # a cheap run, and v1's registry tag pointed at it
    ledger.reserve("adult", "cheap-quantile", [LaplaceEvent(20.0)])
    ledger.settle("cheap-quantile", [LaplaceEvent(20.0)])
    mlflow_store.tracking(store)
    MlflowClient().set_model_version_tag(v1["model_name"], v1["model_version"], "privflow_run_id", "cheap-quantile")

    spec = f"{v1['model_name']}/{v1['model_version']}"
    config = small_config(data, drafted, store, v1["model_name"], 1.0)
    out["tagged"] = train_in_process(config.model_copy(update={"init_from": spec, **NEVER}), show_progress=False)

    # a synthetic table sampled from v1, pretrained on, then warm-started from
    generated = tmp / "v1-sample.csv"
    result = _cli("generate", "--model", spec, "-n", "2000", "-o", str(generated), "--seed", "5", "--store", str(store))
    assert result.exit_code == 0, result.output
    pre_config = small_config(generated, schema, store, "privflow-adult-pre", 1.0).model_copy(
        update={"alias": "pretrained"}
    )
    out["pretrained"] = pretrain_in_process(pre_config, show_progress=False)
    pre = out["pretrained"]
    child = small_config(data, schema, store, v1["model_name"], 1.0)
    out["child"] = train_in_process(
        child.model_copy(update={"init_from": f"{pre.model_name}/{pre.model_version}", **NEVER}), show_progress=False
    )
    return out


@pytest.mark.parametrize("route", ["gzipped", "reordered", "utf-16", "parquet"])
def test_the_charged_file_in_another_form_is_refused_by_pretrain(world: dict, route: str) -> None:
    raw = world["data"].read_bytes()
    frame = pl.read_csv(world["data"], infer_schema=False)
    laundered = world["tmp"] / f"laundered-{route}.{'parquet' if route == 'parquet' else 'csv'}"
    if route == "gzipped":
        laundered.write_bytes(gzip.compress(raw))
    elif route == "reordered":
        frame.reverse().write_csv(laundered)
    elif route == "utf-16":
        laundered.write_bytes(raw.decode().encode("utf-16"))
    else:  # typed columns, as a Parquet file of this schema holds them, rows reordered
        pl.read_csv(world["data"]).sample(fraction=1.0, shuffle=True, seed=3).write_parquet(laundered)
    registered, runs = _registered(world["store"]), world["ledger"].runs()
    result = _cli(
        "pretrain",
        "--data",
        str(laundered),
        "--schema",
        str(world["schema"]),
        "--store",
        str(world["store"]),
        "--quiet",
    )
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "dataset 'adult'" in text and "never public" in text and "Traceback" not in text, text
    second = frame.row(1, named=True)  # no row value is shown
    assert str(second["fnlwgt"]) not in text and str(second["occupation"]) not in text
    assert _registered(world["store"]) == registered and world["ledger"].runs() == runs  # nothing registered


def test_a_generated_table_pretrained_on_links_the_generating_lineage(world: dict) -> None:
    ledger, v1, pre, child = world["ledger"], world["v1"], world["pretrained"], world["child"]
    assert not pre.public and "NOT public" in pre.note and f"{v1['model_name']}/{v1['model_version']}" in pre.note
    record = ledger.version(pre.model_name, pre.model_version)
    assert record is not None and record.derived and ledger.public_source(pre.model_name, pre.model_version) is None
    assert ledger.ancestors(record.run_id) == (v1["run_id"],)
    # the child's epsilon is its lineage's: v1's run and its own, each once
    assert child.lineage_runs == (v1["run_id"], child.run_id)
    reference = _composed(ledger, child.lineage_runs, child.delta)
    assert child.epsilon == pytest.approx(reference, rel=1e-9)
    assert child.epsilon > child.epsilon_run + 0.1  # not the 0.99 of a "public" warm start
    assert child.lineage == (
        f"{v1['model_name']}/{v1['model_version']} (sampled) -> {pre.model_name}/{pre.model_version} -> "
        f"{child.model_name}/{child.model_version}"
    )
    tags = MlflowClient().get_model_version(child.model_name, child.model_version).tags
    assert float(tags["epsilon"]) == pytest.approx(reference, rel=1e-5)


def test_generated_tables_are_recorded_as_they_read_back(world: dict) -> None:
    """`generate`'s table and the run's own synthetic table: their recorded digests are those a
    pretraining reading the file computes, and either one, pretrained on, links v1's run."""
    from privflow.data.schema import Schema
    from privflow.privacy.fingerprint import row_digests, store_key, table_fingerprint, table_rows
    from privflow.tasks.warm_start import check_pretraining_rows

    ledger, v1, store = world["ledger"], world["v1"], world["store"]
    schema, key = Schema.from_yaml(world["schema"]), store_key(store)
    recorded = {p.fingerprint: p for p in ledger.row_prints("generated")}
    for table in (world["tmp"] / "v1-sample.csv", store / "synthetic" / Path(v1["synthetic_path"]).name):
        typed = table_rows(table, schema)
        record = recorded[table_fingerprint(row_digests(typed, key), key)]
        assert (record.model, record.version, record.run_id) == (v1["model_name"], v1["model_version"], v1["run_id"])
        rows = check_pretraining_rows(typed, store, str(table))
        assert not rows.public and rows.sampled_from == ((f"{v1['model_name']}/{v1['model_version']}", v1["run_id"]),)


def test_a_tag_pointed_at_another_run_changes_nothing_and_the_draft_is_in_the_lineage(world: dict) -> None:
    ledger, v1, tagged = world["ledger"], world["v1"], world["tagged"]
    assert tagged.lineage_runs == (v1["run_id"], DRAFT_RUN, tagged.run_id)  # the parent and the draft, both
    assert "cheap-quantile" not in tagged.lineage_runs
    reference = _composed(ledger, tagged.lineage_runs, tagged.delta)
    assert tagged.epsilon == pytest.approx(reference, rel=1e-9)
    from_the_tag = _composed(ledger, ("cheap-quantile", tagged.run_id), tagged.delta)
    assert tagged.epsilon > from_the_tag + 0.1
    assert tagged.lineage == (
        f"{v1['model_name']}/{v1['model_version']} -> schema draft -> {tagged.model_name}/{tagged.model_version}"
    )


def test_a_parent_the_ledger_does_not_record_is_refused_before_any_reservation(world: dict) -> None:
    """A version registered outside this store's runs, tagged like v1 (dataset, its ledger run)."""
    import mlflow

    from privflow.data.codec import Codec
    from privflow.data.schema import Schema
    from privflow.flows.pipeline import train_in_process
    from privflow.tasks.fit import initial_model
    from privflow.tasks.mlflow_store import experiment_for, register_model, tracking

    v1, store = world["v1"], world["store"]
    config = small_config(world["data"], world["schema"], store, v1["model_name"], 1.0)
    schema = Schema.from_yaml(world["schema"])
    tracking(store)
    experiment_for("unrecorded", store)
    state = initial_model(config, Codec.from_schema(schema)).state_dict()
    tags = {"dataset": "adult", "privflow_run_id": v1["run_id"]}
    with mlflow.start_run():
        version = register_model(
            "unrecorded", "champion", schema, "maf", config.model.model_dump(exclude={"name"}), [state], tags
        ).version
    runs = world["ledger"].runs()
    with pytest.raises(ConfigError, match="does not record version") as refused:
        train_in_process(config.model_copy(update={"init_from": f"unrecorded/{version}"}), show_progress=False)
    assert "decide nothing" in str(refused.value) and "\n" not in str(refused.value)
    assert world["ledger"].runs() == runs  # nothing reserved


def test_rows_a_dp_schema_draft_read_are_refused_by_pretrain(world: dict, demo_dir: Path) -> None:
    """The draft is a charged run too: its rows, as its own drafted schema reads them, are never public."""
    data, out, store = world["tmp"] / "to-draft.csv", world["tmp"] / "drafted.yaml", world["tmp"] / "draft-store"
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=1500).write_csv(data)
    drafted = _cli("schema", "draft", "--data", str(data), "--epsilon", "4", "--name", "drafted", "-o", str(out),
                   "--store", str(store))  # fmt: skip
    assert drafted.exit_code == 0, drafted.output
    (charged,) = Ledger(store / "ledger.db").row_prints("charged")
    assert charged.dataset == "drafted" and charged.run_id.startswith("schema-draft-") and charged.rows > 1000
    pl.read_csv(data, infer_schema=False).reverse().write_csv(world["tmp"] / "to-draft-reordered.csv")
    refused = _cli("pretrain", "--data", str(world["tmp"] / "to-draft-reordered.csv"), "--schema", str(out),
                   "--store", str(store), "--quiet")  # fmt: skip
    text = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "dataset 'drafted'" in text and "never public" in text, text
