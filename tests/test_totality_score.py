"""`privflow score --fpr` is total (privacy rules 7 and 8): with the same table as --data and
--reference, a table D and D plus one bad row (a field too many, a value of the wrong type, a
byte that is not UTF-8) both exit 0, both record one settled quantile run in the ledger, and
print the same messages but for the DP threshold (and the random run id). What is checkable
without reading a row (a missing file, a header that does not fit the schema) still exits 2
before anything is reserved."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from privflow.cli import app
from privflow.privacy.accounting.events import PureDPEvent
from privflow.privacy.ledger import Ledger

MODEL = "privflow-adult"  # the shared trained store's model
DATASET = "adult"
EPSILON = "0.05"
ROWS = 300
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _bad_line(good: bytes, kind: str) -> bytes:
    """One more line for D: a row of the table's columns spoiled in one way."""
    fields = good.split(b",")
    if kind == "a-field-too-many":
        return good + b",extra"
    if kind == "a-value-of-the-wrong-type":
        return b",".join([b"forty", *fields[1:]])  # age is an integer column
    if kind == "a-byte-that-is-not-utf8":
        return good.replace(fields[1], fields[1][:2] + b"\xff" + fields[1][2:], 1)
    raise ValueError(kind)


@pytest.fixture(scope="module")
def setup(trained_store: dict, tmp_path_factory) -> dict:
    """A copy of the shared trained store and D: a few hundred rows of its training table (past
    the row whose age the shared store puts out of bounds), written by the CSV writer."""
    from tests import stores

    tmp = tmp_path_factory.mktemp("totality-score")
    store = stores.copy_store(trained_store["store"], tmp / "store")
    d = tmp / "d.csv"
    pl.read_csv(trained_store["data"], infer_schema=False).slice(1, ROWS).write_csv(d)
    return {"store": store, "tmp": tmp, "d": d.read_bytes()}


def _runs(store: Path) -> list:
    return Ledger(store / "ledger.db").runs(DATASET)


def _score(setup: dict, case: str, table: bytes) -> dict:
    """`privflow score --fpr` in process with `table` as both --data and --reference, in a
    folder of its own: the exit status, the new ledger runs, the message (its folder, the DP
    threshold and the random run ids replaced by placeholders) and the curator folder."""
    store, folder = setup["store"], setup["tmp"] / case
    folder.mkdir()
    data = folder / "table.csv"
    data.write_bytes(table)
    before = {r.run_id for r in _runs(store)}
    res = CliRunner().invoke(
        app,
        ["score", "--model", f"{MODEL}@champion", "--data", str(data), "--reference", str(data),
         "--fpr", "0.05", "--epsilon", EPSILON, "-o", str(folder / "out.csv"), "--store", str(store)],
    )  # fmt: skip
    text = " ".join(res.output.split())
    message = text.replace(str(folder), "<folder>")
    message = re.sub(r"DP threshold: \S+ nats", "DP threshold: <T> nats", message)
    message = re.sub(r"loglik < \S+\)", "loglik < <T>)", message)
    message = UUID.sub("<id>", message)
    new = [r for r in _runs(store) if r.run_id not in before]
    return {"res": res, "text": text, "message": message, "runs": new, "out": folder / "out.csv"}


@pytest.fixture(scope="module")
def clean(setup: dict) -> dict:
    return _score(setup, "d", setup["d"])


def _curator(store: Path, run_id: str) -> dict:
    folder = store.resolve() / "curator" / run_id
    return {
        "scoring": json.loads((folder / "scoring.json").read_text()),
        "reference": json.loads((folder / "reference.json").read_text()),
    }


def test_d_exits_0_with_one_quantile_run(setup: dict, clean: dict) -> None:
    assert clean["res"].exit_code == 0, clean["res"].output
    (run,) = clean["runs"]
    assert run.status == "settled" and list(run.events) == [PureDPEvent(float(EPSILON))]
    scored = pl.read_csv(clean["out"], infer_schema=False)
    assert scored.height == ROWS and scored["loglik"].null_count() == 0
    counts = _curator(setup["store"], run.run_id)
    assert counts["scoring"]["rows_unscored"] == 0 and counts["reference"]["validation"]["failing_rows"] == 0


@pytest.mark.parametrize("kind", ["a-field-too-many", "a-value-of-the-wrong-type", "a-byte-that-is-not-utf8"])
def test_d_plus_one_bad_row_has_the_same_outcome_but_for_dp_figures(setup: dict, clean: dict, kind: str) -> None:
    d: bytes = setup["d"]
    good = d.rstrip(b"\n").rsplit(b"\n", 1)[1]
    got = _score(setup, kind, d + _bad_line(good, kind) + b"\n")
    assert got["res"].exit_code == clean["res"].exit_code == 0, got["res"].output
    assert [(r.status, r.events) for r in got["runs"]] == [(r.status, r.events) for r in clean["runs"]]
    assert len(got["runs"]) == 1
    assert got["message"] == clean["message"]
    assert "Traceback" not in got["text"] and " line " not in got["text"]
    # the bad row stays in its place with an empty score; its count is the curator's alone
    scored = pl.read_csv(got["out"], infer_schema=False)
    assert scored.height == ROWS + 1
    assert scored["loglik"].is_null().to_list() == [False] * ROWS + [True]
    assert scored["anomaly"][ROWS] is None and "_privflow_unreadable" not in scored.columns
    counts = _curator(setup["store"], got["runs"][0].run_id)
    assert counts["scoring"]["rows_unscored"] == 1 and counts["scoring"]["rows_scored"] == ROWS
    assert counts["reference"]["validation"]["failing_rows"] == 1


@pytest.mark.parametrize("case", ["missing-reference", "reference-column-missing", "data-header-wrong"])
def test_a_structural_mistake_exits_2_before_anything_is_reserved(setup: dict, case: str) -> None:
    store, folder = setup["store"], setup["tmp"] / case
    folder.mkdir()
    data = reference = folder / "table.csv"
    data.write_bytes(setup["d"])
    wrong = folder / "wrong.csv"
    if case == "missing-reference":
        reference = folder / "missing.csv"
    elif case == "reference-column-missing":
        pl.read_csv(data, infer_schema=False).drop("hours-per-week").write_csv(wrong)
        reference = wrong
    else:
        pl.read_csv(data, infer_schema=False).rename({"age": "Age"}).write_csv(wrong)
        data = wrong
    before = _runs(store)
    res = CliRunner().invoke(
        app,
        ["score", "--model", f"{MODEL}@champion", "--data", str(data), "--reference", str(reference),
         "--fpr", "0.05", "--epsilon", EPSILON, "-o", str(folder / "out.csv"), "--store", str(store)],
    )  # fmt: skip
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text and "DP threshold" not in text, text
    assert ("Reference file" if "reference" in case else "Data file") in text
    assert _runs(store) == before and not (folder / "out.csv").exists()


def test_a_bad_fpr_exits_2_before_anything_is_reserved(setup: dict) -> None:
    store, folder = setup["store"], setup["tmp"] / "bad-fpr"
    folder.mkdir()
    data = folder / "table.csv"
    data.write_bytes(setup["d"])
    before = _runs(store)
    res = CliRunner().invoke(
        app,
        ["score", "--model", f"{MODEL}@champion", "--data", str(data), "--reference", str(data),
         "--fpr", "1.5", "--epsilon", EPSILON, "-o", str(folder / "out.csv"), "--store", str(store)],
    )  # fmt: skip
    assert res.exit_code == 2 and "--fpr" in res.output, res.output
    assert _runs(store) == before and not (folder / "out.csv").exists()
