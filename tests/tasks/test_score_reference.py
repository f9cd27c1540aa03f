"""`privflow score --fpr`: the reference file's structure is checked before the ledger reserves
(a user's mistake is charged nothing), and what one reference row holds never decides the
outcome (privacy rules 7 and 8). An untrained flow stands in for the registered version."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from privflow.core.errors import DataError
from privflow.data.codec import Codec
from privflow.data.schema import Schema
from privflow.models import build_flow
from privflow.privacy.accounting.events import PureDPEvent
from privflow.privacy.ledger import Ledger
from privflow.privacy.mechanisms.dp_quantile import DPQuantile
from privflow.serving.release import Release
from privflow.tasks import score as score_task


@pytest.fixture
def released(demo_dir: Path) -> Release:
    import torch

    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    torch.manual_seed(0)
    flow = build_flow("maf", Codec.from_schema(schema).cardinalities, blocks=1, hidden=8).eval()
    return Release(schema, [flow], version="3")


@pytest.fixture
def refs(tmp_path: Path, demo_dir: Path) -> dict[str, Path]:
    """A clean reference, the same with one malformed line (a field too many), and one whose
    header does not match the schema."""
    clean, broken, wrong = tmp_path / "ref.csv", tmp_path / "ref_broken.csv", tmp_path / "ref_wrong.csv"
    rows = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=40)
    rows.write_csv(clean)
    lines = clean.read_text().splitlines(keepends=True)
    broken.write_text("".join([*lines[:10], lines[10].rstrip("\n") + ",extra\n", *lines[11:]]))
    rows.rename({"age": "Age"}).write_csv(wrong)
    return {"clean": clean, "broken": broken, "wrong": wrong}


def _runs(store: Path) -> list:
    path = store / "ledger.db"
    return Ledger(path).runs() if path.exists() else []


@pytest.mark.parametrize("which", ["clean", "broken"])
def test_a_malformed_reference_line_is_a_failing_row_not_a_refusal(
    tmp_path: Path, released: Release, refs: dict[str, Path], which: str
) -> None:
    store = tmp_path / "store"
    got = score_task.dp_threshold(released, refs[which], DPQuantile(0.1, 0.25, -200.0, 10.0), store)
    (run,) = _runs(store)
    assert run.status == "settled" and list(run.events) == [PureDPEvent(0.25)]
    assert got.epsilon == 0.25 and -200.0 <= got.threshold <= 10.0


def test_a_reference_header_mistake_is_refused_before_the_ledger_reserves(
    tmp_path: Path, released: Release, refs: dict[str, Path]
) -> None:
    store = tmp_path / "store"
    Ledger(store / "ledger.db").ensure_dataset("adult", 5.0, 1e-6)
    with pytest.raises(DataError, match="does not match the schema"):
        score_task.dp_threshold(released, refs["wrong"], DPQuantile(0.1, 0.25, -200.0, 10.0), store)
    with pytest.raises(DataError, match="Reference file"):
        score_task.dp_threshold(released, tmp_path / "missing.csv", DPQuantile(0.1, 0.25, -200.0, 10.0), store)
    assert _runs(store) == []  # nothing reserved, so no 'abandoned' entry either


@pytest.fixture
def cli(monkeypatch, tmp_path: Path, released: Release, refs: dict[str, Path]):
    """`privflow score` in process, with the registry lookup patched to the stand-in version."""
    import privflow.preflight
    from privflow.cli import app

    monkeypatch.setattr(privflow.preflight, "check_registry", lambda *a, **k: None)
    monkeypatch.setattr(score_task, "load_model", lambda spec, store: ("privflow-adult", released))
    data = tmp_path / "new.csv"
    data.write_bytes(refs["clean"].read_bytes())

    def invoke(reference: Path, store: Path):
        return CliRunner().invoke(
            app,
            ["score", "--model", "privflow-adult@champion", "--data", str(data), "-o", str(tmp_path / "out.csv"),
             "--fpr", "0.1", "--reference", str(reference), "--epsilon", "0.25", "--score-low", "-200",
             "--store", str(store)],
        )  # fmt: skip

    return invoke


def test_score_cli_exits_alike_with_a_malformed_reference_line(tmp_path: Path, cli, refs: dict[str, Path]) -> None:
    outcomes = []
    for which in ("clean", "broken"):
        store = tmp_path / f"store-{which}"
        res = cli(refs[which], store)
        assert "Traceback" not in res.output and "line" not in res.output.replace("(ledger run", ""), res.output
        outcomes.append((res.exit_code, [(r.status, r.events) for r in _runs(store)]))
    assert outcomes[0] == outcomes[1] == (0, [("settled", (PureDPEvent(0.25),))])


def test_score_cli_reference_header_mistake_exits_2_and_charges_nothing(
    tmp_path: Path, cli, refs: dict[str, Path]
) -> None:
    store = tmp_path / "store"
    res = cli(refs["wrong"], store)
    assert res.exit_code == 2 and "Reference file" in res.output and "'Age' for 'age'" in res.output, res.output
    assert _runs(store) == [] and not (tmp_path / "out.csv").exists()
