"""The one released-model type: `Release`, built by `load_release` from a version's artifact files,
scored by `score_rows` (the API's `Synthesizer.score` and `privflow score` both call it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from privflow.data.codec import Codec
from privflow.data.schema import Schema
from privflow.data.validation import validate
from privflow.models import build_flow
from privflow.serving.release import Release, load_release, score_rows
from privflow.serving.sampler import sample_rows


@pytest.fixture(scope="module")
def release(demo_dir: Path) -> Release:
    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    torch.manual_seed(0)
    flows = [build_flow("maf", Codec.from_schema(schema).cardinalities, blocks=1, hidden=8).eval() for _ in range(2)]
    return Release(schema, flows, model={"name": "maf", "config": {"blocks": 1, "hidden": 8}}, version="4")


@pytest.fixture(scope="module")
def rows(demo_dir: Path, release: Release) -> pl.DataFrame:
    table = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=60)
    return validate(table, release.schema, "strict")[0]


def test_the_artifacts_load_as_the_release_they_were_written_from(tmp_path: Path, release: Release) -> None:
    meta = {"schema": release.schema.model_dump(mode="json"), "model": release.model, "checkpoints": []}
    files: dict[str, Path] = {}
    for k, flow in enumerate(release.flows):
        files[f"checkpoint_{k}"] = tmp_path / f"checkpoint_{k}.pt"
        torch.save(flow.state_dict(), files[f"checkpoint_{k}"])
        meta["checkpoints"].append(f"checkpoint_{k}")
    files["meta"] = tmp_path / "meta.json"
    files["meta"].write_text(json.dumps(meta))
    loaded = load_release(files, "4", {"epsilon": "1.0"})
    assert loaded.schema == release.schema and loaded.version == "4" and loaded.tags == {"epsilon": "1.0"}
    assert loaded.model == release.model and loaded.marginals is None and loaded.head is None
    assert sample_rows(loaded.flows, loaded.codec, 300, seed=5).equals(
        sample_rows(release.flows, release.codec, 300, seed=5)
    )


def test_a_seed_gives_the_same_scores_and_the_api_scores_with_it(release: Release, rows: pl.DataFrame) -> None:
    from privflow.api import Synthesizer

    first, again = score_rows(release, rows, seed=3), score_rows(release, rows, seed=3)
    assert first.shape == (rows.height,) and np.isfinite(first).all()
    np.testing.assert_array_equal(first, again)
    synth = Synthesizer.from_release(release)
    assert synth.schema is release.schema and synth.flows is release.flows and synth.codec is release.codec
    np.testing.assert_array_equal(synth.score(rows, seed=3), first)
    assert score_rows(release, rows.head(0)).shape == (0,)


def test_the_sampler_does_not_import_the_pyfunc() -> None:
    code = (
        "import sys; import privflow.serving.sampler, privflow.serving.release, privflow.serving.local_store; "
        "print(sorted(m for m in ('privflow.serving.pyfunc', 'mlflow', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_save_writes_a_folder_load_reads_back_and_nothing_is_overwritten(tmp_path: Path, release: Release) -> None:
    """`Synthesizer.save(folder)` and `Synthesizer.load(folder)`: the same rows for a seed, the
    version and tags kept; a folder that is not new and empty, or a model that does not name its
    flow, is refused before anything is written."""
    from privflow.api import Synthesizer
    from privflow.core.errors import ConfigError

    release.tags = {"epsilon": "0.9"}
    synth = Synthesizer.from_release(release)
    folder = synth.save(tmp_path / "saved")
    again = Synthesizer.load(folder)
    assert again.schema == synth.schema and again.release.version == "4" and again.release.tags == {"epsilon": "0.9"}
    assert again.sample(200, seed=3).equals(synth.sample(200, seed=3))
    with pytest.raises(ConfigError, match="not an empty folder"):
        synth.save(folder)
    bare = Synthesizer.from_release(Release(release.schema, release.flows))
    with pytest.raises(ConfigError, match="does not name the flow"):
        bare.save(tmp_path / "other")
    assert not (tmp_path / "other").exists()
