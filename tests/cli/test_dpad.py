"""`privflow dpad fit` / `privflow dpad score`: the ensemble is fitted for free and registered,
every query is charged, and user errors exit 2 with one paragraph before anything is spent."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from privflow.cli import app
from privflow.privacy.accounting.events import PureDPEvent, RepeatedEvent
from privflow.privacy.ledger import Ledger


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def cli(tmp_path_factory, demo_dir: Path) -> dict:
    tmp = tmp_path_factory.mktemp("dpad-cli")
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = 1200
    schema = tmp / "adult.yaml"
    schema.write_text(yaml.safe_dump(doc))
    train, new = tmp / "train.csv", tmp / "new.csv"
    pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=1200).write_csv(train)
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=25).write_csv(new)
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": {"blocks": 1, "hidden": 8}, "train": {"batch_size": 128}}))
    store = tmp / "store"
    res = _invoke(
        "dpad", "fit", "--data", train, "--schema", schema, "--partitions", 3, "--epsilon-per-query", 0.05,
        "--config", config, "--flow", "maf", "--epochs", 1, "--store", store,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    ensemble = re.search(r"DP-AD ensemble (dpad-[0-9a-f]{12})", res.output).group(1)
    return {"tmp": tmp, "schema": schema, "train": train, "new": new, "config": config, "store": store,
            "ensemble": ensemble, "fit_output": res.output}  # fmt: skip


def _runs(store: Path) -> list:
    return Ledger(store / "ledger.db").runs("adult")


def test_fit_says_nothing_was_charged_and_registers(cli: dict) -> None:
    assert "nothing was charged" in cli["fit_output"] and "curator" in cli["fit_output"]
    (reg,) = [r for r in _runs(cli["store"]) if r.run_id == cli["ensemble"]]
    assert reg.status == "settled" and reg.epsilon == 0.0
    shown = _invoke("ledger", "show", "adult", "--store", cli["store"])
    assert shown.exit_code == 0 and cli["ensemble"] in shown.output


def test_score_writes_dp_answers_and_is_charged(cli: dict) -> None:
    out = cli["tmp"] / "scored.csv"
    res = _invoke(
        "dpad", "score", "--ensemble", cli["ensemble"], "--data", cli["new"], "-o", out, "--store", cli["store"]
    )
    assert res.exit_code == 0, res.output
    scored = pl.read_csv(out)
    assert scored.columns[-1] == "anomaly" and scored.height == 25
    assert not {"loglik", "votes"} & set(scored.columns)  # only the DP answer leaves
    run = _runs(cli["store"])[-1]
    assert run.status == "settled" and list(run.events) == [RepeatedEvent(PureDPEvent(0.05), 25)]
    assert "25 of 25 rows answered" in res.output and run.run_id in res.output


def test_svt_score_reports_unanswered_rows_and_charges_at_most_the_cutoff(cli: dict) -> None:
    out = cli["tmp"] / "svt.parquet"
    res = _invoke(
        "dpad", "score", "--ensemble", cli["ensemble"], "--data", cli["new"], "-o", out, "--svt",
        "--max-flags", 1, "--store", cli["store"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    run = _runs(cli["store"])[-1]
    assert list(run.reserved_events) == [RepeatedEvent(PureDPEvent(0.05), 1)]
    assert list(run.events) == [RepeatedEvent(PureDPEvent(0.05), 1)]
    answers = pl.read_parquet(out)["anomaly"]
    assert int(answers.sum()) <= 1


def test_score_over_budget_is_refused_before_anything(cli: dict) -> None:
    store = cli["store"]
    Ledger(store / "ledger.db").set_budget("adult", 0.3, 1e-5)  # 25 queries at 0.05 compose past 0.3
    try:
        before = _runs(store)
        out = cli["tmp"] / "never.csv"
        res = _invoke("dpad", "score", "--ensemble", cli["ensemble"], "--data", cli["new"], "-o", out, "--store", store)
        assert res.exit_code == 4 and "refused" in res.output and "Traceback" not in res.output  # ExitStatus.BUDGET
        assert _runs(store) == before and not out.exists()
    finally:
        Ledger(store / "ledger.db").set_budget("adult", 10.0, 1e-5)


@pytest.mark.parametrize(
    "case",
    ["unknown_ensemble", "bad_id", "wrong_header", "svt_without_cutoff", "cutoff_without_svt", "bad_suffix"],
)
def test_score_user_errors_exit_2(cli: dict, case: str) -> None:
    ensemble, data, out, extra = cli["ensemble"], cli["new"], cli["tmp"] / "x.csv", []
    if case == "unknown_ensemble":
        ensemble = "dpad-000000000000"
    elif case == "bad_id":
        ensemble = "../../etc"
    elif case == "wrong_header":
        data = cli["tmp"] / "bad.csv"
        pl.read_csv(cli["new"], infer_schema=False).rename({"age": "Age"}).write_csv(data)
    elif case == "svt_without_cutoff":
        extra = ["--svt"]
    elif case == "cutoff_without_svt":
        extra = ["--max-flags", "3"]
    else:
        out = cli["tmp"] / "x.txt"
    before = _runs(cli["store"])
    res = _invoke("dpad", "score", "--ensemble", ensemble, "--data", data, "-o", out, "--store", cli["store"], *extra)
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and "Traceback" not in res.output
    assert _runs(cli["store"]) == before


@pytest.mark.parametrize("case", ["epsilon", "one_partition", "both_thresholds", "wrong_header", "bad_config"])
def test_fit_user_errors_exit_2_before_reading(cli: dict, case: str) -> None:
    args = {"--partitions": "3", "--epsilon-per-query": "0.1"}
    data, extra, config = cli["train"], [], cli["config"]
    if case == "epsilon":
        args["--epsilon-per-query"] = "-1"
    elif case == "one_partition":
        args["--partitions"] = "1"
    elif case == "both_thresholds":
        extra = ["--fpr", "0.1", "--threshold", "-5"]
    elif case == "wrong_header":
        data = cli["tmp"] / "bad_train.csv"
        pl.read_csv(cli["train"], infer_schema=False).drop("age").write_csv(data)
    else:
        config = cli["tmp"] / "bad_config.yaml"
        config.write_text(yaml.safe_dump({"train": {"epochs": -1}}))
    store = cli["tmp"] / f"store-{case}"
    flat = [x for kv in args.items() for x in kv]
    res = _invoke("dpad", "fit", "--data", data, "--schema", cli["schema"], *flat, "--config", config, *extra,
                  "--store", store)  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and "Traceback" not in res.output
    assert not (store / "curator").exists()


def test_more_partitions_than_the_rows_can_train_is_refused_before_anything_is_created(tmp_path: Path, cli) -> None:
    """1,200 rows in 200 parts: 4-5 training rows each, below what a part needs to train a flow, so
    every part would vote 'normal' while every query is charged; refused, naming the most that fit."""
    store = tmp_path / "store"
    res = _invoke(
        "dpad", "fit", "--data", cli["train"], "--schema", cli["schema"], "--partitions", 200,
        "--epsilon-per-query", 0.05, "--store", store,
    )  # fmt: skip
    assert res.exit_code == 2 and "Use at most 96 partitions" in " ".join(res.output.split()), res.output
    assert "each part of about 6 rows" in " ".join(res.output.split())
    assert not store.exists()


def test_a_held_out_share_out_of_range_is_named_before_the_row_rule(tmp_path: Path, cli) -> None:
    """--holdout 1 used to be reported as 'each part gets about 0 training rows ... use at most 1
    partitions' (impossible advice); the setting's own range is checked first."""
    res = _invoke(
        "dpad", "fit", "--data", cli["train"], "--schema", cli["schema"], "--partitions", 4,
        "--epsilon-per-query", 0.5, "--holdout", 1, "--store", tmp_path / "store",
    )  # fmt: skip
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "held-out fraction must lie in [0.01, 0.9)" in text and "partitions" not in text


def _fit_small(tmp_path: Path, demo_dir: Path, name: str, lines: list[str]) -> tuple[int, str]:
    """`dpad fit` on a table of the given data lines, under a schema that declares no expected_rows."""
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"].pop("expected_rows", None)
    schema = tmp_path / "adult-no-rows.yaml"
    schema.write_text(yaml.safe_dump(doc))
    header = (demo_dir / "adult_train.csv").read_text().splitlines()[0]
    data = tmp_path / f"{name}.csv"
    data.write_text("\n".join([header, *lines]) + "\n")
    store = tmp_path / f"store-{name}"
    res = _invoke(
        "dpad", "fit", "--data", data, "--schema", schema, "--partitions", 3, "--epsilon-per-query", 0.05,
        "--flow", "maf", "--epochs", 1, "--store", store,
    )  # fmt: skip
    text = " ".join(res.output.split())
    ensemble = re.search(r"dpad-[0-9a-f]{12}", text)
    return res.exit_code, (text.replace(ensemble.group(0), "ID") if ensemble else text).replace(str(store), "STORE")


def test_fit_puts_no_minimum_on_the_private_rows(tmp_path: Path, demo_dir: Path) -> None:
    """Fewer rows than parts, none at all, or a malformed line: the fit works alike and its
    message names no count of the private rows (it refused with 'has 2 data row(s)'; a part
    with too few rows trains no flow and votes normal, and the queries are DP)."""
    rows = (demo_dir / "adult_train.csv").read_text().splitlines()[1:3]
    outcomes = {
        name: _fit_small(tmp_path, demo_dir, name, lines)
        for name, lines in {
            "two": rows,
            "none": [],
            "malformed": [*rows, rows[0] + ",extra"],
        }.items()
    }
    for name, (code, text) in outcomes.items():
        assert code == 0, text
        assert "nothing was charged" in text and "row(s)" not in text and "Parts without" not in text, text
        assert text.replace(f"/{name}", "/X") == outcomes["two"][1].replace("/two", "/X")
