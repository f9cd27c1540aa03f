"""Warm starts end to end, on slices of real data (Adult) with a tiny flow: `pretrain` on public
rows (the published test split), then `run --init-from` on training rows (in process, as the CLI
runs it).

- DP training starts from exactly the registered parent's weights (also with DP marginals,
  where the flow is fine-tuned in the run's own copula space);
- a public warm start is charged what a from-scratch run is charged minus the skipped DP
  statistics stage, with DP-SGD's noise unchanged; pretraining itself charges nothing;
- the lineage: the MLflow params and the ledger entry name the parent version; a warm start
  from a private release of the same dataset composes with it in the ledger, and the new
  version reports the lineage's composition as its epsilon everywhere (privacy rule 9);
- `pretrain` declares its version public in the ledger (the only thing a free warm start
  accepts), and refuses a file whose rows the ledger knows as charged (keyed row digests);
- every registered version is recorded in the ledger with its run and weights' digest, which is
  where a private parent's run is read from.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.accounting.events import event_to_dict
from privflow.privacy.ledger import Ledger, compose_epsilon
from privflow.tasks.run_plan import run_plan

pytestmark = pytest.mark.usefixtures("prefect_server")

TINY = {
    "model": {"name": "maf", "blocks": 2, "hidden": 16},
    "train": {"epochs": 1, "batch_size": 256, "checkpoint_every": 8},
    "head": {"steps": 20},  # the target head is on (as by default), trained briefly
    "evaluate": {"synthetic_rows": 300, "utility": False, "privacy_risk": False, "report": False},
    "marginals": {"enabled": False},  # the schema codec; the DP-marginals case sets it on
    "promotion": "never",
}


def _files(tmp: Path, demo_dir: Path, empty_store: Path) -> dict[str, Path]:
    from tests.stores import copy_store

    private, public = tmp / "adult-train.csv", tmp / "adult-public.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=3000).write_csv(private)
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=2000).write_csv(public)
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = 3000
    schema = tmp / "adult.yaml"
    schema.write_text(yaml.safe_dump(doc))
    # a new store, its MLflow database already made (tests/conftest.py, `empty_store`)
    return {"private": private, "public": public, "schema": schema, "store": copy_store(empty_store, tmp / "store")}


def _config(files: dict[str, Path], data: Path, **extra: object) -> RunConfig:
    sections = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY.items()}
    for key, value in extra.items():
        sections[key] = {**sections[key], **value} if isinstance(value, dict) and key in sections else value
    return RunConfig.build(
        data=data, schema_path=files["schema"], store=files["store"], privacy={"epsilon": 1.0}, **sections
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, empty_store: Path) -> dict:
    from privflow.flows.pipeline import train_in_process
    from privflow.flows.pretrain import pretrain_pipeline
    from privflow.tasks import train as train_task

    files = _files(tmp_path_factory.mktemp("warm"), demo_dir, empty_store)
    first_weights: list[dict] = []
    real_train = train_task.train

    def recording_train(model, data, settings, **kwargs):  # noqa: ANN001, ANN003, ANN202
        first_weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return real_train(model, data, settings, **kwargs)

    out: dict = {"files": files, "first": first_weights}
    out["parent"] = pretrain_pipeline(
        _config(files, files["public"], model_name="warmtest-public", alias="pretrained"), show_progress=False
    )
    marginals = {"marginals": {"enabled": True, "grid_bins": 64}}
    out["parent_marg"] = pretrain_pipeline(
        _config(files, files["public"], model_name="warmtest-public-marg", alias="pretrained", **marginals),
        show_progress=False,
    )
    pretrained = Ledger(files["store"] / "ledger.db")
    out["ledger_after_pretrain"] = (
        pretrained.datasets(),
        pretrained.runs(),
        pretrained.public_source(out["parent"].model_name, out["parent"].model_version),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_task, "train", recording_train)
        out["warm"] = train_in_process(
            _config(files, files["private"], model_name="warmtest", init_from="warmtest-public@pretrained"),
            show_progress=False,
        )
        out["scratch_config"] = _config(files, files["private"], model_name="warmtest")
        out["scratch"] = train_in_process(out["scratch_config"], show_progress=False)
        child_of = f"{out['warm'].model_name}/{out['warm'].model_version}"
        out["child"] = train_in_process(
            _config(files, files["private"], model_name="warmtest", init_from=child_of), show_progress=False
        )
        out["warm_marg"] = train_in_process(
            _config(
                files, files["private"], model_name="warmtest-marg", init_from="warmtest-public-marg/1", **marginals
            ),
            show_progress=False,
        )
    return out


def _version(name: str, version: str):  # noqa: ANN202
    from privflow.tasks.mlflow_store import load_version

    return load_version(name, version)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def test_pretraining_registers_a_public_version_and_charges_nothing(runs: dict) -> None:
    parent = runs["parent"]
    datasets, charged, declared = runs["ledger_after_pretrain"]
    assert datasets == [] and charged == []  # no dataset, no run: nothing charged
    # the data owner's declaration, the one thing a free warm start accepts
    assert declared is not None and declared.dataset == "adult" and declared.fingerprint.startswith("blake2b-rows:")
    tags = MlflowClient().get_model_version(parent.model_name, parent.model_version).tags
    assert tags["privflow.pretrained"] == "public" and tags["privflow.data"] == "public"
    loaded = _version(parent.model_name, parent.model_version)  # loadable like a release, schema beside it
    assert [c.name for c in loaded.schema.columns][:2] == ["age", "workclass"] and loaded.marginals is None
    assert parent.rows == 2000 and parent.steps >= 1


def test_warm_started_run_begins_from_the_pretrained_weights(runs: dict) -> None:
    parent = runs["parent"]
    weights = _version(parent.model_name, parent.model_version).flows[0].state_dict()
    assert len(runs["first"]) == 4  # warm, scratch, child, warm with marginals
    assert _same(runs["first"][0], weights)
    assert not _same(runs["first"][1], weights)  # the scratch run starts from its own initialisation
    warm = runs["warm"]
    child_parent = _version(warm.model_name, warm.model_version).flows[0].state_dict()
    assert _same(runs["first"][2], child_parent)


def test_public_warm_start_costs_a_scratch_run_minus_the_dp_statistics(runs: dict) -> None:
    files, warm, scratch = runs["files"], runs["warm"], runs["scratch"]
    records = {r.run_id: r for r in Ledger(files["store"] / "ledger.db").runs("adult")}
    w, s = records[warm.run_id], records[scratch.run_id]
    assert set(warm.stages) == {"validate", "dp_head", "train", "select"}
    assert set(scratch.stages) == {"validate", "dp_head", "dp_stats", "train", "select"}
    plan = run_plan(runs["scratch_config"], Schema.from_yaml(files["schema"]))
    skipped = event_to_dict(plan.stage("dp_stats").event)
    spent = [event_to_dict(e) for e in s.events]
    assert skipped in spent
    # the same events, DP-SGD's included, less the DP statistics; nothing for the public parent
    assert [event_to_dict(e) for e in w.events] == [e for e in spent if e != skipped]
    assert w.epsilon == pytest.approx(PLDAccountant().epsilon(list(w.events), 1e-5), rel=1e-9)
    assert w.epsilon < s.epsilon <= 1.0
    assert warm.epsilon == pytest.approx(w.epsilon, rel=1e-9)


def test_lineage_is_in_the_mlflow_run_and_the_ledger(runs: dict) -> None:
    files, parent, warm, child = runs["files"], runs["parent"], runs["warm"], runs["child"]
    spec = f"{parent.model_name}/{parent.model_version}"  # the alias, pinned to its version
    assert warm.init_from == spec
    assert MlflowClient().get_run(warm.mlflow_run_id).data.params["init_from"] == spec
    ledger = Ledger(files["store"] / "ledger.db")
    records = {r.run_id: r for r in ledger.runs("adult")}
    assert dict(records[warm.run_id].stages)["init_from"] == f"{spec}: public pretraining (no charge)"
    lineage = dict(records[child.run_id].stages)["init_from"]
    assert lineage.startswith(f"{warm.model_name}/{warm.model_version}: private on dataset 'adult'")
    assert warm.run_id in lineage
    assert "init_from" not in dict(records[runs["scratch"].run_id].stages)
    # each version is recorded with the run that registered it (what a warm start from it composes)
    for summary in (warm, child, runs["scratch"]):
        recorded = ledger.version(summary.model_name, summary.model_version)
        assert recorded is not None and recorded.run_id == summary.run_id and recorded.weights.startswith("sha256:")
    assert ledger.version(parent.model_name, parent.model_version) is None  # public: declared, not recorded
    assert {p.run_id for p in ledger.row_prints("charged")} >= {warm.run_id, child.run_id}
    # the child composes with its parent (and every other run of the dataset) in the ledger
    ordered = [r.run_id for r in ledger.runs("adult")]
    so_far = ledger.runs("adult")[: ordered.index(child.run_id) + 1]  # warm, scratch, child
    every = [e for r in so_far for e in r.events]
    assert child.dataset_epsilon == pytest.approx(PLDAccountant().epsilon(every, 1e-5), rel=1e-6)
    assert child.dataset_delta == pytest.approx(1e-5)  # stated at the budget's delta
    assert child.dataset_epsilon > max(child.epsilon, warm.epsilon)
    assert "init_from=" in ledger.describe("adult")


def test_a_version_warm_started_from_a_private_parent_reports_its_lineages_epsilon(runs: dict) -> None:
    """Privacy rule 9: the child's weights are a function of the private parent's release, so its
    only valid epsilon is the composition of the parent's and its own recorded events (not its run's
    alone, and not the dataset's total, which also counts the unrelated scratch run)."""
    import os

    from privflow.api import Synthesizer

    files, public, warm, child = runs["files"], runs["parent"], runs["warm"], runs["child"]
    records = {r.run_id: r for r in Ledger(files["store"] / "ledger.db").runs("adult")}
    reference = compose_epsilon([*records[warm.run_id].events, *records[child.run_id].events], 1e-5)
    assert child.epsilon == pytest.approx(reference, rel=1e-9) and child.delta == pytest.approx(1e-5)
    assert child.epsilon > child.epsilon_run
    assert child.epsilon_run == pytest.approx(records[child.run_id].epsilon, rel=1e-9)
    assert child.epsilon < child.dataset_epsilon  # the scratch run is no ancestor
    chain = (
        f"{public.model_name}/{public.model_version} (public) -> {warm.model_name}/{warm.model_version} -> "
        f"{child.model_name}/{child.model_version}"
    )
    assert child.lineage == chain and child.lineage_runs == (warm.run_id, child.run_id)
    client = MlflowClient()
    tags = client.get_model_version(child.model_name, child.model_version).tags
    assert float(tags["epsilon"]) == pytest.approx(reference, rel=1e-5)
    assert float(tags["epsilon_run_alone"]) == pytest.approx(child.epsilon_run, rel=1e-5)
    assert tags["privflow.lineage"] == chain
    data = client.get_run(child.mlflow_run_id).data
    assert data.metrics["epsilon"] == pytest.approx(reference, rel=1e-9)
    assert data.metrics["epsilon_run_alone"] == pytest.approx(child.epsilon_run, rel=1e-9)
    assert data.tags["privflow.lineage"] == chain
    # a public parent adds nothing: the warm run's epsilon is its own
    assert warm.epsilon == warm.epsilon_run and warm.lineage_runs == (warm.run_id,)
    assert float(client.get_model_version(warm.model_name, warm.model_version).tags["epsilon"]) == pytest.approx(
        warm.epsilon_run, rel=1e-5
    )
    # the Python API: from the run's summary, and from the registered version's tags
    loaded = _version(child.model_name, child.model_version)
    assert Synthesizer(loaded.schema, loaded.flows, summary=child).epsilon == child.epsilon
    saved = dict(os.environ)
    try:
        synth = Synthesizer.load(child.model_name, child.model_version, files["store"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert synth.epsilon == pytest.approx(reference, rel=1e-5) and synth.lineage == chain
    assert synth.epsilon_run == pytest.approx(child.epsilon_run, rel=1e-5)


def test_warm_start_with_dp_marginals_fine_tunes_in_the_runs_own_codec(runs: dict) -> None:
    parent, warm = runs["parent_marg"], runs["warm_marg"]
    start = _version(parent.model_name, parent.model_version)
    assert _same(runs["first"][3], start.flows[0].state_dict())
    released = _version(warm.model_name, warm.model_version)
    assert start.marginals is not None and released.marginals is not None
    assert released.marginals != start.marginals  # the run's DP marginals, not the public table's
    assert "dp_marginals" in warm.stages and "dp_stats" not in warm.stages


def test_pretrain_refuses_a_file_the_ledger_knows_as_private(runs: dict) -> None:
    files = runs["files"]
    result = CliRunner().invoke(
        app,
        [
            "pretrain",
            "--data",
            str(files["private"]),
            "--schema",
            str(files["schema"]),
            "--store",
            str(files["store"]),
            "--quiet",
        ],
    )
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "charged for" in text and "dataset 'adult'" in text and "never public" in text, text


def test_pretrain_refuses_a_public_table_with_too_few_rows_left_after_quarantine(
    tmp_path: Path, demo_dir: Path
) -> None:
    """Pre-flight counts the file's rows; the quarantine policy may set most aside. 3 usable rows
    of 40 used to register a model with 'validation nan nats/row'."""
    rows = pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=40)
    bad = rows.with_columns(pl.when(pl.int_range(pl.len()) < 37).then(pl.lit("7")).otherwise("age").alias("age"))
    data = tmp_path / "mostly-bad.csv"
    bad.write_csv(data)
    config = tmp_path / "quarantine.yaml"
    config.write_text("policy: quarantine\ntrain: {epochs: 1}\n")
    store = tmp_path / "few-store"
    result = CliRunner().invoke(
        app,
        ["pretrain", "--data", str(data), "--schema", str(demo_dir / "adult.yaml"), "--config", str(config),
         "--store", str(store), "--quiet"],
    )  # fmt: skip
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Only 3 of the public file's 40 rows" in text and "at least 20" in text, text
    assert (
        not (store / "mlflow.db").exists()
        or not MlflowClient(f"sqlite:///{store / 'mlflow.db'}").search_registered_models()
    )
