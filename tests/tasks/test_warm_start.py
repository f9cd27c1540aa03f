"""Warm starts refused up front: `privflow run --init-from` with a missing model, a
parent under another schema, another flow or codec space, a private release of another
dataset, a private parent the ledger does not hold, or a version tagged public in the registry
that `privflow pretrain` never declared in the ledger exits 2 with one paragraph,
before any reservation, and leaves the ledger as it was; a private parent's ledger run is the
ledger's record of the version (`Ledger.record_version`), never its registry tags. Plus the plan
of a warm start: the from-scratch plan minus its initialisation stages, DP-SGD unchanged; and the
ledger's lineage composition (privacy rule 9).

Parents are registered directly (`register_model`, as the pipeline logs them), so no
Prefect server is needed; the end-to-end runs are in tests/flows/test_warm_start.py.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import polars as pl
import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError
from privflow.data.codec import Codec
from privflow.data.schema import Schema
from privflow.privacy.accounting.events import GaussianEvent, LaplaceEvent, event_to_dict
from privflow.privacy.ledger import Ledger, compose_epsilon
from privflow.tasks.run_plan import run_plan

runner = CliRunner()
MODEL = {"name": "maf", "blocks": 1, "hidden": 8}
PARENT_RUN = "parent-run-attempt1"
SCHEMA_CODEC = {"enabled": False}  # parents and runs here use the schema codec (DP marginals are on by default)
NO_HEAD = {"enabled": False}  # and a flow over every column (the target head is on by default)


def _schema_file(path: Path, demo_dir: Path, name: str = "adult", age_high: float | None = None) -> Path:
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["name"] = name
    doc["dataset"]["expected_rows"] = 400
    if age_high is not None:
        for col in doc["columns"]:
            if col["name"] == "age":
                col["bounds"] = [col["bounds"][0], age_high]
    path.write_text(yaml.safe_dump(doc))
    return path


def _register(store: Path, name: str, schema: Path, tags: dict[str, str], model: dict | None = None) -> str:
    """A version logged like the pipeline logs one, with the full model section in meta.json."""
    from privflow.tasks.fit import initial_model
    from privflow.tasks.mlflow_store import experiment_for, register_model, tracking

    cfg = RunConfig.build(data="x.csv", schema_path=schema, model=model or MODEL, marginals=SCHEMA_CODEC)
    sch = Schema.from_yaml(schema)
    tracking(store)
    experiment_for("warm-start-test", store)
    state = initial_model(cfg, Codec.from_schema(sch)).state_dict()
    with mlflow.start_run():
        return register_model(
            name, "champion", sch, cfg.model.name, cfg.model.model_dump(exclude={"name"}), [state], tags
        ).version


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, empty_store: Path) -> dict:
    from tests.stores import copy_store

    tmp = tmp_path_factory.mktemp("warm")
    store = copy_store(empty_store, tmp / "store")  # new, its MLflow database made (tests/conftest.py)
    data = tmp / "adult.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=400).write_csv(data)
    schema = _schema_file(tmp / "adult.yaml", demo_dir)
    other_bounds = _schema_file(tmp / "adult-age.yaml", demo_dir, age_high=120)
    other_name = _schema_file(tmp / "census.yaml", demo_dir, name="census")
    # one charged run of 'adult', the private parent's, and one of 'census'
    ledger = Ledger(store / "ledger.db")
    ledger.ensure_dataset("adult", 10.0, 1e-5)
    ledger.reserve("adult", PARENT_RUN, [GaussianEvent(5.0)])
    ledger.settle(PARENT_RUN, [GaussianEvent(5.0)])
    ledger.ensure_dataset("census", 10.0, 1e-5)
    ledger.reserve("census", "c-1", [GaussianEvent(5.0)])
    ledger.settle("c-1", [GaussianEvent(5.0)])
    public = {"privflow.pretrained": "public", "privflow.data": "public"}
    versions = {
        "public": _register(store, "parents", schema, public),
        "other-bounds": _register(store, "parents", other_bounds, public),
        "other-flow": _register(store, "parents", schema, public, {**MODEL, "hidden": 16}),
        "other-dataset": _register(store, "parents", other_name, {"dataset": "census", "privflow_run_id": "c-1"}),
        "not-in-ledger": _register(store, "parents", schema, {"dataset": "adult", "privflow_run_id": "elsewhere"}),
        "same-dataset": _register(store, "parents", schema, {"dataset": "adult", "privflow_run_id": PARENT_RUN}),
        # its tag names another run; the ledger's record decides
        "tag-elsewhere": _register(store, "parents", schema, {"dataset": "adult", "privflow_run_id": "cheap"}),
        "re-registered": _register(store, "parents", schema, {"dataset": "adult", "privflow_run_id": PARENT_RUN}),
        "untagged": _register(store, "parents", schema, {}),
        "tag-only": _register(store, "parents", schema, {}),
        "replaced": _register(store, "parents", schema, public),
    }
    from privflow.tasks.warm_start import declare_public_version, record_registered_version

    # what `privflow pretrain` does once it has registered a version (flows/pretrain.py)
    for kind in ("public", "other-bounds", "other-flow"):
        declare_public_version(store, "parents", versions[kind], "blake2b-rows:" + "1" * 32, "adult")
    # what `privflow run` does once it has registered a version (flows/pipeline.py)
    for kind, run in (("same-dataset", PARENT_RUN), ("tag-elsewhere", PARENT_RUN), ("other-dataset", "c-1")):
        record_registered_version(ledger, "parents", versions[kind], run)
    # a record whose weights are not those registered under the number now
    ledger.record_version("parents", versions["re-registered"], PARENT_RUN, "sha256:" + "0" * 64)
    # someone with registry write access tags a version public by hand: no declaration
    MlflowClient().set_model_version_tag("parents", versions["tag-only"], "privflow.pretrained", "public")
    # a declaration whose weights are not those registered under the number now
    ledger.declare_public("parents", versions["replaced"], "sha256:" + "0" * 64, "hmac-sha256:x", "adult")
    config = tmp / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {"model": MODEL, "marginals": SCHEMA_CODEC, "head": NO_HEAD, "train": {"epochs": 1, "batch_size": 128}}
        )
    )
    return {"store": store, "data": data, "schema": schema, "config": config, "v": versions, "tmp": tmp}


def _ledger_state(store: Path) -> tuple:
    ledger = Ledger(store / "ledger.db")
    return tuple(ledger.runs()), tuple((d.name, d.spent_epsilon, d.runs) for d in ledger.datasets())


def _run(setup: dict, init_from: str, *extra: str):
    return runner.invoke(
        app,
        [
            "run",
            "--data",
            str(setup["data"]),
            "--schema",
            str(setup["schema"]),
            "--config",
            str(setup["config"]),
            "--store",
            str(setup["store"]),
            "--epsilon",
            "1",
            "--quiet",
            "--init-from",
            init_from,
            *extra,
        ],
    )


def _refused(setup: dict, init_from: str, *needles: str, extra: tuple[str, ...] = ()) -> str:
    before = _ledger_state(setup["store"])
    result = _run(setup, init_from, *extra)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "pre-flight passed" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output  # one paragraph
    for needle in needles:
        assert needle.lower() in lines[0].lower(), lines[0]
    assert _ledger_state(setup["store"]) == before  # nothing reserved, nothing charged
    return lines[0]


def test_missing_model_is_refused(setup: dict) -> None:
    _refused(setup, "no-such-model@champion", "not in the registry", "privflow pretrain")
    # the model exists, its version or alias does not: say what it has
    missing = int(setup["v"]["untagged"]) + 50
    _refused(setup, f"parents/{missing}", f"'parents' has no version {missing}", "latest version")
    _refused(setup, "parents@nosuch", "'parents' has no alias @nosuch", "its aliases")


def test_missing_registry_is_refused(setup: dict) -> None:
    empty = dict(setup, store=setup["tmp"] / "empty-store")
    Ledger(empty["store"] / "ledger.db").ensure_dataset("adult", 10.0, 1e-5)
    _refused(empty, "parents/1", "no model registry")


def test_schema_mismatch_is_refused(setup: dict) -> None:
    message = _refused(setup, f"parents/{setup['v']['other-bounds']}", "another schema", "column 'age'", "bounds")
    assert "120" in message


def test_other_flow_or_codec_is_refused(setup: dict) -> None:
    _refused(setup, f"parents/{setup['v']['other-flow']}", "different flow", "model.hidden")
    marginals = setup["tmp"] / "marginals.yaml"
    marginals.write_text(yaml.safe_dump({"model": MODEL, "marginals": {"enabled": True}, "head": NO_HEAD}))
    _refused(setup, f"parents/{setup['v']['public']}", "codec", "marginals.enabled", extra=("--config", str(marginals)))


def test_a_parent_without_the_runs_target_head_is_refused(setup: dict) -> None:
    """The parent's flow models every column; with the head on, this run's flow would model every
    column but the target: the weights would not fit."""
    head = setup["tmp"] / "head.yaml"
    head.write_text(yaml.safe_dump({"model": MODEL, "marginals": SCHEMA_CODEC}))  # the head on, as by default
    _refused(setup, f"parents/{setup['v']['public']}", "no target head", "head.enabled", extra=("--config", str(head)))


def test_private_release_of_another_dataset_is_refused(setup: dict) -> None:
    # its schema differs only in the dataset's name: the columns match, the dataset does not
    _refused(
        setup,
        f"parents/{setup['v']['other-dataset']}",
        "trained privately on dataset 'census'",
        "public output",
        "share people",
        "privflow generate",
        "privflow pretrain",
    )


def test_private_parent_missing_from_the_ledger_or_untagged_is_refused(setup: dict) -> None:
    """Tags naming a dataset and a ledger run decide nothing: the ledger must record the version."""
    version = setup["v"]["not-in-ledger"]
    message = _refused(
        setup, f"parents/{version}", f"does not record version {version}", "ledger run elsewhere", "decide nothing"
    )
    assert "nothing was reserved" in message
    _refused(setup, f"parents/{setup['v']['untagged']}", "does not record version", "neither as a public pretraining")


def test_a_recorded_version_whose_weights_were_replaced_is_refused(setup: dict) -> None:
    _refused(setup, f"parents/{setup['v']['re-registered']}", "not the ones recorded", "replaced")


def test_a_private_parents_run_comes_from_the_ledger_not_its_tags(setup: dict) -> None:
    from privflow.tasks import mlflow_store
    from privflow.tasks.warm_start import find_parent

    mlflow_store.tracking(setup["store"])
    ledger_path = setup["store"] / "ledger.db"
    for kind in ("same-dataset", "tag-elsewhere"):
        parent = find_parent(f"parents/{setup['v'][kind]}", ledger_path)
        assert parent.kind == "private" and parent.ledger_run == PARENT_RUN and parent.dataset == "adult"
    # a tag pointed at another run afterwards changes nothing either
    MlflowClient().set_model_version_tag("parents", setup["v"]["same-dataset"], "privflow_run_id", "c-1")
    assert find_parent(f"parents/{setup['v']['same-dataset']}", ledger_path).ledger_run == PARENT_RUN


def test_a_public_tag_the_ledger_does_not_declare_is_refused(setup: dict) -> None:
    """Public is the data owner's declaration, recorded by `privflow pretrain` in the ledger; the
    registry tag is information, and anyone with registry write access can set it."""
    from privflow.tasks.warm_start import UndeclaredPublicParent

    assert issubclass(UndeclaredPublicParent, ConfigError)
    message = _refused(
        setup,
        f"parents/{setup['v']['tag-only']}",
        "privflow.pretrained=public",
        "holds no declaration",
        "privflow pretrain",
        "nothing was reserved",
    )
    assert "decides nothing" in message
    _refused(setup, f"parents/{setup['v']['replaced']}", "not the ones declared", "replaced")
    ledger = Ledger(setup["store"] / "ledger.db")
    declared = ledger.public_source("parents", setup["v"]["public"])
    assert declared is not None and declared.fingerprint.startswith("blake2b-rows:") and declared.dataset == "adult"
    assert ledger.public_source("parents", setup["v"]["tag-only"]) is None


def test_lineage_composes_the_private_chain(tmp_path: Path) -> None:
    """Privacy rule 9: a run's lineage is its events and every private ancestor's, composed at
    the dataset's delta; a public root adds nothing, other runs of the dataset are not in it."""
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.ensure_dataset("d", 50.0, 1e-6)
    events = {"v1": [GaussianEvent(3.0)], "other": [GaussianEvent(2.0)], "v2": [LaplaceEvent(4.0)]}
    for run, ev in events.items():
        ledger.reserve("d", run, ev)
        ledger.settle(run, ev)
    ledger.record_parent("v1", "pub/4", None)
    ledger.record_parent("v2", "m/1", "v1")
    fresh = ledger.lineage("other")
    assert fresh.runs == ("other",) and fresh.parents == () and not fresh.private_parents
    assert fresh.epsilon == pytest.approx(compose_epsilon(events["other"], 1e-6))
    v2 = ledger.lineage("v2")
    assert v2.runs == ("v1", "v2") and v2.parents == ("pub/4 (public)", "m/1") and v2.delta == 1e-6
    assert v2.epsilon == pytest.approx(compose_epsilon(events["v1"] + events["v2"], 1e-6), rel=1e-9)
    assert v2.epsilon > compose_epsilon(events["v2"], 1e-6)
    # a ledger written before the lineage table: the run's stages name its parent's ledger run
    old = [GaussianEvent(6.0)]
    ledger.reserve("d", "v3", old, {"init_from": "m/2: private on dataset 'd', ledger run v2 (already counted; ok)"})
    ledger.settle("v3", old)
    v3 = ledger.lineage("v3")
    assert v3.runs == ("v1", "v2", "v3") and v3.parents == ("pub/4 (public)", "m/1", "m/2")
    assert v3.epsilon == pytest.approx(compose_epsilon(events["v1"] + events["v2"] + old, 1e-6), rel=1e-9)


def test_allowed_parents_pass_preflight_pinned_to_their_version(setup: dict) -> None:
    from privflow.preflight import preflight

    for kind in ("public", "same-dataset", "tag-elsewhere"):
        cfg = RunConfig.build(
            data=setup["data"],
            schema_path=setup["schema"],
            store=setup["store"],
            # the first version registered (the public one) holds @champion
            init_from="parents@champion" if kind == "public" else f"parents/{setup['v'][kind]}",
            model=MODEL,
            marginals=SCHEMA_CODEC,
            head=NO_HEAD,
            train={"epochs": 1, "batch_size": 128},
        )
        checked = preflight(cfg)
        assert checked.config.init_from == f"parents/{setup['v'][kind]}"
        assert {s.name for s in checked.plan.stages} == {"validate", "train", "select"}  # type: ignore[attr-defined]


def test_warm_start_plan_is_the_scratch_plan_minus_initialisation(setup: dict) -> None:
    base = {
        "data": "x.csv",
        "schema_path": setup["schema"],
        "model": {**MODEL, "prior": "mog"},
        "marginals": SCHEMA_CODEC,
    }
    schema = Schema.from_yaml(setup["schema"])
    scratch = run_plan(RunConfig.build(**base), schema)
    warm = run_plan(RunConfig.build(**base, init_from="parents/1"), schema)
    assert [s.name for s in scratch.stages] == ["validate", "dp_head", "dp_stats", "dp_prior", "select", "train"]
    assert [s.name for s in warm.stages] == ["validate", "dp_head", "select", "train"]
    for s in warm.stages:  # every kept stage, DP-SGD included, keeps its noise
        assert event_to_dict(s.event) == event_to_dict(scratch.stage(s.name).event)
    from privflow.privacy.accounting.accountant import PLDAccountant

    assert warm.epsilon == pytest.approx(PLDAccountant().epsilon(warm.events, warm.delta))
    assert warm.epsilon < scratch.epsilon <= 1.0 and warm.target_epsilon == scratch.target_epsilon


def test_help_names_the_warm_start_commands() -> None:
    pretrain = runner.invoke(app, ["pretrain", "--help"])
    assert pretrain.exit_code == 0 and "public" in pretrain.output.lower()
    assert "--init-from" in runner.invoke(app, ["run", "--help"]).output


@pytest.mark.usefixtures("cli_process_state")
def test_pretrain_reports_the_commands_wall_time_not_the_flows(tmp_path: Path, monkeypatch) -> None:
    """The time printed covers the whole command (Prefect's start-up included), not the flow's own
    `wall_seconds` (only part of it): measured from the command's start."""
    import time
    from types import SimpleNamespace

    import privflow.flows.pretrain as flows_pretrain
    import privflow.preflight as preflight

    def checked(cfg: RunConfig) -> SimpleNamespace:
        monkeypatch.setattr(time, "monotonic", lambda t=time.monotonic: t() + 0.3)  # 0.3 s the flow does not count
        return SimpleNamespace(config=cfg, schema=None, rows=10, data_format="csv", device="cpu")

    summary = flows_pretrain.PretrainSummary("m", "1", "pretrained", "run", 10, 0, 5, 5, -1.0, wall_seconds=0.0)
    monkeypatch.setattr(preflight, "preflight_pretrain", checked)
    monkeypatch.setattr(flows_pretrain, "pretrain_pipeline", lambda cfg, show_progress: summary)
    result = runner.invoke(
        app,
        ["pretrain", "--data", str(tmp_path / "p.csv"), "--schema", str(tmp_path / "s.yaml"),
         "--store", str(tmp_path / "store"), "--quiet"],
    )  # fmt: skip
    out = " ".join(result.output.split())
    assert result.exit_code == 0, out
    wall = float(out.split("5 steps, checkpoint of step 5, validation -1.000 nats/row, ")[1].split()[0])
    assert wall >= 0.3 and "s in all (checks, Prefect's start-up, training and registration)" in out, out


def test_pretrain_refuses_a_reserved_alias_before_training(setup: dict, demo_dir: Path) -> None:
    result = runner.invoke(
        app,
        [
            "pretrain",
            "--data",
            str(demo_dir / "adult_test.csv"),
            "--schema",
            str(setup["schema"]),
            "--store",
            str(setup["tmp"] / "pretrain-store"),
            "--alias",
            "latest",
        ],
    )
    assert result.exit_code == 2 and "cannot be an alias" in " ".join(result.output.split())
    assert not (setup["tmp"] / "pretrain-store").exists()  # refused before anything was created
