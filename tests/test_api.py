"""The Python API (privflow/api.py) on a small slice of the Adult demo: fit, sample, score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from privflow.api import Synthesizer, fit
from privflow.data.schema import Schema
from privflow.data.validation import validate


def _no_prefect(*args: object, **kwargs: object) -> None:
    raise AssertionError("fit reached Prefect's engine or server")


def test_fit_sample_score_on_an_adult_slice(tmp_path: Path, demo_dir: Path, monkeypatch, new_store: Path) -> None:
    """With no PREFECT_API_URL, fit runs in this process as `privflow run` does: no Prefect
    client or temporary server (benchmarks/results/overhead.md: its start-up)."""
    import prefect.client.orchestration as orchestration
    from prefect.server.api.server import SubprocessASGIServer

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(orchestration, "get_client", _no_prefect)
    monkeypatch.setattr(SubprocessASGIServer, "start", _no_prefect)
    rows = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=1500)
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = 1500
    schema = Schema.model_validate(doc)
    synth = fit(
        rows,
        schema,
        epsilon=2.0,
        delta=1e-5,
        store=new_store,
        model_name="privflow-adult-apitest",
        model={"name": "maf", "blocks": 1, "hidden": 8},
        train={"epochs": 1, "batch_size": 256},
        evaluate={"synthetic_rows": 200, "utility": False, "privacy_risk": False, "report": False},
    )
    assert isinstance(synth, Synthesizer) and synth.epsilon is not None and synth.epsilon <= 2.0 * 1.0001

    table = synth.sample(300, seed=3)
    assert table.height == 300 and table.columns == schema.names
    assert synth.sample(50, seed=3).equals(synth.sample(50, seed=3))  # a public seed reproduces the draw
    assert synth.sample(np.int64(5), seed=np.int64(4)).equals(synth.sample(5, seed=4))  # numpy integers too
    valid, report = validate(table, schema, "quarantine", tmp_path / "q.csv")
    assert valid.height == 300, report

    ll = synth.score(valid, seed=0)
    assert np.array_equal(synth.score(valid, seed=np.int64(0)), ll)
    assert ll.shape == (300,) and np.isfinite(ll).all()
    # the same model loaded back from the registry scores the same rows identically
    again = Synthesizer.load(f"{synth.summary.model_name}/{synth.summary.model_version}", store=new_store)
    assert np.allclose(again.score(valid, seed=0), ll, atol=1e-4)


@pytest.mark.usefixtures("prefect_server")
def test_score_adds_the_target_heads_log_probability(tmp_path: Path, demo_dir: Path, new_store: Path) -> None:
    """With a target head, a row's log-likelihood is the flow's density of the other columns plus
    log p(target | them): changing only the target moves the score by exactly the head's difference."""
    from privflow.data.target_head import TargetCodec, conditional_loglik

    rows = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=1200)
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = 1200
    schema = Schema.model_validate(doc)
    synth = fit(
        rows,
        schema,
        epsilon=2.0,
        delta=1e-5,
        store=new_store,
        model_name="privflow-adult-headtest",
        prefect=True,  # as a Prefect flow (the test session's server)
        model={"name": "maf", "blocks": 1, "hidden": 8},
        train={"epochs": 1, "batch_size": 256, "min_effective_batch": 0},
        evaluate={"synthetic_rows": 100, "utility": False, "privacy_risk": False, "report": False},
    )
    assert isinstance(synth.codec, TargetCodec) and synth.head is not None
    table = synth.sample(200, seed=1)
    flipped = table.with_columns(
        pl.when(pl.col("income") == "<=50K")
        .then(pl.lit(">50K"))
        .otherwise(pl.lit("<=50K"))
        .cast(table["income"].dtype)
        .alias("income")
    )
    assert (flipped["income"] != table["income"]).all()
    delta = synth.score(flipped, seed=0) - synth.score(table, seed=0)
    expected = conditional_loglik(synth.codec, flipped) - conditional_loglik(synth.codec, table)
    np.testing.assert_allclose(delta, expected, atol=1e-4)
    assert np.abs(expected).max() > 0  # the head's term is not constant
