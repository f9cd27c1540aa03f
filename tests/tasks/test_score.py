"""`privflow score`: per-row log-likelihoods under a released model, anomaly flags, and the
ledger charged exactly the DP quantile's epsilon (nothing for a public threshold)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from privflow.cli import app
from privflow.privacy.accounting.events import PureDPEvent
from privflow.privacy.ledger import Ledger

MODEL = "privflow-adult"  # the shared trained store's model


@pytest.fixture(scope="module")
def trained(trained_store: dict, tmp_path_factory, demo_dir: Path) -> dict:
    """A copy of the session's shared trained store (the DP threshold tests charge its ledger),
    a new table to score and a reference slice of the training rows."""
    from tests import stores

    tmp = tmp_path_factory.mktemp("score")
    store = stores.copy_store(trained_store["store"], tmp / "store")
    new = tmp / "new.csv"
    pl.read_csv(demo_dir / "adult_test.csv", infer_schema=False, n_rows=300).write_csv(new)
    ref = tmp / "ref.csv"
    pl.read_csv(trained_store["data"], infer_schema=False).slice(1, 800).write_csv(ref)
    return {"store": store, "new": new, "ref": ref, "tmp": tmp, "dataset": "adult"}


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _runs(store: Path, dataset: str) -> list:
    return Ledger(store / "ledger.db").runs(dataset)


def _without_paths(text: str, tmp: Path) -> str:
    """`text` with the test's folder and every random id (a ledger run's, a curator folder's)
    taken out, so that a count searched for cannot match a digit of a path or an id by chance."""
    import re

    return re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<id>", text.replace(str(tmp), "<tmp>"))


def _curator_report(text: str) -> dict:
    """The curator-only scoring report that the closing line points to."""
    import json

    return json.loads(Path(text.split("curator-only ")[1].split()[0].rstrip(".")).read_text())


def test_public_threshold_scores_every_row_and_spends_nothing(trained) -> None:
    store, out = trained["store"], trained["tmp"] / "scored.csv"
    before = _runs(store, trained["dataset"])
    res = _invoke(
        "score", "--model", f"{MODEL}@champion", "--data", str(trained["new"]), "-o", str(out),
        "--threshold", "-12", "--store", str(store),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    scored = pl.read_csv(out)
    source = pl.read_csv(trained["new"], infer_schema=False)
    assert scored.columns == [*source.columns, "loglik", "anomaly"]
    assert scored.height == source.height
    assert scored["loglik"].is_finite().all()
    assert (scored["anomaly"] == (scored["loglik"] < -12.0)).all()
    text = " ".join(res.output.split())
    assert "epsilon spent 0" in text and "A public threshold spends no privacy" in text
    # exact counts are the curator's, in the report the closing line names
    assert str(source.height) not in _without_paths(text, trained["tmp"])
    report = _curator_report(text)
    assert report["rows_scored"] == source.height and report["rows_unscored"] == 0
    assert report["rows_flagged"] == int(scored["anomaly"].sum())
    assert _runs(store, trained["dataset"]) == before


def test_fpr_threshold_is_dp_and_charged_exactly_epsilon(trained) -> None:
    store, out = trained["store"], trained["tmp"] / "scored_dp.csv"
    before = {r.run_id for r in _runs(store, trained["dataset"])}
    res = _invoke(
        "score", "--model", f"{MODEL}@champion", "--data", str(trained["new"]), "-o", str(out),
        "--fpr", "0.05", "--reference", str(trained["ref"]), "--epsilon", "0.25", "--store", str(store),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    new_runs = [r for r in _runs(store, trained["dataset"]) if r.run_id not in before]
    assert len(new_runs) == 1
    assert new_runs[0].status == "settled" and list(new_runs[0].events) == [PureDPEvent(0.25)]
    assert "epsilon spent 0.25" in res.output
    text = " ".join(res.output.split())  # the closing line names the charge, not "spends no privacy"
    assert f"charged epsilon 0.25 to dataset '{trained['dataset']}'" in text and "post-processing" in text
    assert "spends no privacy" not in text
    scored = pl.read_csv(out)
    threshold = float(res.output.split("DP threshold:")[1].split()[0])
    assert -20.0 <= threshold <= 10.0
    assert (scored["anomaly"] == (scored["loglik"] < threshold)).all()


def test_fpr_refused_when_the_budget_cannot_hold_it(trained) -> None:
    store = trained["store"]
    before = _runs(store, trained["dataset"])
    res = _invoke(
        "score", "--model", f"{MODEL}@champion", "--data", str(trained["new"]), "-o",
        str(trained["tmp"] / "never.csv"), "--fpr", "0.05", "--reference", str(trained["ref"]),
        "--epsilon", "50", "--store", str(store),
    )  # fmt: skip
    assert res.exit_code == 4 and "refused" in res.output and "Traceback" not in res.output
    assert _runs(store, trained["dataset"]) == before
    assert not (trained["tmp"] / "never.csv").exists()


@pytest.mark.parametrize("case", ["missing_model", "wrong_header", "no_threshold", "both", "huge_epsilon"])
def test_bad_inputs_exit_2_without_traceback(trained, case: str) -> None:
    store, tmp = trained["store"], trained["tmp"]
    data, model = str(trained["new"]), f"{MODEL}@champion"
    extra = ["--threshold", "-10"]
    if case == "missing_model":
        model = "no-such-model@champion"
    elif case == "wrong_header":
        bad = tmp / "bad.csv"
        pl.read_csv(trained["new"], infer_schema=False).rename({"age": "Age"}).write_csv(bad)
        data = str(bad)
    elif case == "no_threshold":
        extra = []
    elif case == "both":
        extra += ["--fpr", "0.1"]
    else:
        extra = ["--fpr", "0.1", "--reference", data, "--epsilon", "1000"]
    res = _invoke("score", "--model", model, "--data", data, "-o", str(tmp / "x.csv"), "--store", str(store), *extra)
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and "Traceback" not in res.output
    if case == "wrong_header":
        assert "'Age' for 'age'" in res.output


def test_a_data_table_whose_rows_all_fail_is_scored_empty_after_the_dp_threshold(trained) -> None:
    """--data is read with the total reader after the DP threshold is released: rows that fail
    the schema's checks get an empty score and stay in the output; what they hold never decides
    whether the threshold is charged, the exit status or the message (privacy rule 8)."""
    store, tmp = trained["store"], trained["tmp"]
    bad = tmp / "words.csv"
    pl.read_csv(trained["new"], infer_schema=False).with_columns(pl.lit("abc").alias("age")).write_csv(bad)
    before = {r.run_id for r in _runs(store, trained["dataset"])}
    out = tmp / "words_scored.csv"
    res = _invoke(
        "score", "--model", f"{MODEL}@champion", "--data", str(bad), "-o", str(out),
        "--fpr", "0.05", "--reference", str(trained["ref"]), "--epsilon", "0.25", "--store", str(store),
    )  # fmt: skip
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "DP threshold" in text and "Traceback" not in text, text
    assert "300" not in _without_paths(text, tmp) and "'age'" not in text  # no exact count or column verdict
    new_runs = [r for r in _runs(store, trained["dataset"]) if r.run_id not in before]
    assert [(r.status, list(r.events)) for r in new_runs] == [("settled", [PureDPEvent(0.25)])]
    scored = pl.read_csv(out, infer_schema=False)
    assert scored.height == 300 and scored["loglik"].null_count() == 300 and scored["anomaly"].null_count() == 300
    report = _curator_report(text)
    assert report["rows_unscored"] == 300 and report["rows_scored"] == 0 and report["label"].startswith("CURATOR")
    assert report["validation"]["columns"]["age"][0]["check"] == "type"


def test_a_row_that_fails_its_checks_keeps_its_place_with_an_empty_score(trained) -> None:
    """score answers every row: one that fails the schema's checks (an age past the public
    bounds) is kept with an empty loglik and anomaly, the others are scored; the message
    carries no count (they are in the curator-only report) and advises no quarantine."""
    store, tmp = trained["store"], trained["tmp"]
    bad = tmp / "one_old.csv"
    rows = pl.read_csv(trained["new"], infer_schema=False)
    rows.with_columns(pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("999")).otherwise("age").alias("age")).write_csv(
        bad
    )
    out = tmp / "n3.csv"
    before = _runs(store, trained["dataset"])
    res = _invoke("score", "--model", f"{MODEL}@champion", "--data", str(bad), "-o", str(out),
                  "--threshold", "-30", "--store", str(store))  # fmt: skip
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "epsilon spent 0" in text, text
    assert "1 row" not in text and "quarantine" not in _without_paths(text, tmp) and "empty loglik" in text
    scored = pl.read_csv(out)
    assert scored.height == rows.height and scored["age"][3] == 999
    assert scored["loglik"].is_null().arg_true().to_list() == [3] and scored["anomaly"][3] is None
    report = _curator_report(text)
    assert report["rows_unscored"] == 1 and report["rows_scored"] == rows.height - 1
    assert report["rows_flagged"] == int(scored["anomaly"].sum())
    quarantine = Path(text.split("curator-only ")[1].split()[0].rstrip(".")).parent / "scored_quarantine.csv"
    assert pl.read_csv(quarantine)["_privflow_row"].to_list() == [3]
    assert _runs(store, trained["dataset"]) == before  # a public threshold: no ledger run


def test_generate_refuses_a_table_the_disk_cannot_hold(trained, monkeypatch) -> None:
    import shutil as sh

    from privflow.core import machine

    usage = sh.disk_usage(trained["tmp"])
    monkeypatch.setattr(machine.shutil, "disk_usage", lambda _p: usage._replace(free=10_000_000))  # 10 MB free
    out = trained["tmp"] / "huge.csv"
    res = _invoke(
        "generate", "--model", f"{MODEL}@champion", "-n", "1000000", "-o", str(out), "--store", str(trained["store"])
    )
    assert res.exit_code == 2 and "need at least 30.0 MB" in res.output and "10.0 MB free" in res.output, res.output
    assert not out.exists() and not out.with_name(out.name + ".part").exists()
    small = trained["tmp"] / "small.csv"  # 100 rows fit in 10 MB
    res = _invoke(
        "generate", "--model", f"{MODEL}@champion", "-n", "100", "-o", str(small), "--store", str(trained["store"])
    )
    assert res.exit_code == 0 and pl.read_csv(small).height == 100, res.output
    assert "replacing" not in res.output
    # writing over an existing table says so (fuzzing round 6: it was replaced without a word)
    res = _invoke(
        "generate", "--model", f"{MODEL}@champion", "-n", "50", "-o", str(small), "--store", str(trained["store"])
    )
    assert res.exit_code == 0 and "replacing the file that was there" in res.output and pl.read_csv(small).height == 50


def test_a_disk_that_fills_while_generating_is_a_user_error_and_leaves_no_table(trained, monkeypatch) -> None:
    """The pre-flight's room check is a lower bound: a disk that fills during the write (ENOSPC)
    exits 2 with advice, not 'internal error ... a bug', and no partial table keeps the name."""
    import errno

    import privflow.serving.sampler as sampler

    real = sampler.iter_samples

    def fills_up(*args, **kwargs):
        it = real(*args, **kwargs)
        yield next(it)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sampler, "iter_samples", fills_up)
    out = trained["tmp"] / "full.parquet"
    res = _invoke("generate", "--model", f"{MODEL}@champion", "-n", "40000", "-o", str(out),
                  "--store", str(trained["store"]))  # fmt: skip
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "out of disk space" in text and "No space left on device" in text, text
    assert "internal error" not in text and "Traceback" not in text
    assert not out.exists() and not out.with_name(out.name + ".part").exists()
