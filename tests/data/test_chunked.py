"""privflow/data/chunked.py: Parquet read in chunks, row matrices on disk, and when a run streams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from privflow.core.config import RunConfig
from privflow.core.errors import DataError
from privflow.data.chunked import DiskRows, parquet_chunks, scratch, streamed
from privflow.data.schema import Schema


def test_disk_rows_read_back_what_was_appended(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    blocks = [rng.normal(size=(k, 3)).astype(np.float32) for k in (5, 0, 17, 1)]
    rows = DiskRows(tmp_path / "x.f32", 3)
    for b in blocks:
        rows.append(b)
    whole = np.concatenate(blocks)
    assert rows.shape == (23, 3) and len(rows) == 23 and rows.dtype == torch.float32
    np.testing.assert_array_equal(rows[:], whole)
    np.testing.assert_array_equal(rows[4:9], whole[4:9])
    np.testing.assert_array_equal(rows[20:99], whole[20:])
    assert rows[30:40].shape == (0, 3)
    idx = np.array([22, 0, 7, 7, 3])
    np.testing.assert_array_equal(rows[idx], whole[idx])
    np.testing.assert_array_equal(rows[torch.tensor(idx)], whole[idx])
    assert rows[np.array([], dtype=np.int64)].shape == (0, 3)
    np.testing.assert_array_equal(rows[np.array([-1, -23, 5])], whole[[-1, -23, 5]])  # as numpy indexes
    with pytest.raises(IndexError):
        rows[np.array([23])]
    with pytest.raises(IndexError):
        rows[0:10:2]
    with pytest.raises(ValueError, match=r"\[k, 3\]"):
        rows.append(np.zeros((2, 4)))
    assert (tmp_path / "x.f32").stat().st_mode & 0o077 == 0  # private working data: owner only
    with open(tmp_path / "x.f32", "r+b") as f:  # cut short behind its back: an error, not garbage
        f.truncate(4 * 3 * 20)
    with pytest.raises(OSError, match="shorter"):
        rows[np.array([21])]


def test_training_from_disk_equals_training_from_memory(tmp_path: Path) -> None:
    """The trainer gathers each Poisson sample from the file: with the same (test-only) seeds
    the steps, and so the checkpoints, are the same as from a tensor."""
    from privflow.models.softmax_head import SoftmaxHead
    from privflow.privacy.dpsgd.dp_sgd import TrainSettings, train

    rng = np.random.default_rng(1)
    x = np.column_stack([rng.random((600, 2)), rng.integers(0, 2, 600)]).astype(np.float32)
    rows = DiskRows(tmp_path / "h.f32", 3)
    rows.append(x[:250])
    rows.append(x[250:])
    settings = TrainSettings(
        sample_rate=0.1, steps=12, noise_multiplier=1.0, max_grad_norm=1.0, lr=0.05, checkpoint_every=4, noise_seed=7
    )
    a = train(SoftmaxHead([0, 0], 2), torch.from_numpy(x), settings)
    b = train(SoftmaxHead([0, 0], 2), rows, settings)
    assert [s for s, _ in a.checkpoints] == [s for s, _ in b.checkpoints] == [4, 8, 12]
    for (_, sa), (_, sb) in zip(a.checkpoints, b.checkpoints, strict=True):
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)
    assert a.event == b.event


def test_parquet_chunks_give_the_table_in_order(tmp_path: Path) -> None:
    df = pl.DataFrame({"a": list(range(2500)), "b": ["x", "", None, "y", "z"] * 500})
    path = tmp_path / "t.parquet"
    df.write_parquet(path, row_group_size=700)
    chunks = list(parquet_chunks(path, 1000))
    assert [c.height for c in chunks] == [1000, 1000, 500]
    got = pl.concat(chunks)
    assert got["a"].to_list() == df["a"].to_list()
    assert got["b"].null_count() == 1000  # the empty strings read as nulls, as read_table does
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="does not parse as Parquet"):
        list(parquet_chunks(tmp_path / "bad.parquet"))


def _config(data: Path, expected: int, **stream: object) -> tuple[RunConfig, Schema]:
    schema = Schema.model_validate(
        {
            "dataset": {"name": "s", "expected_rows": expected},
            "columns": [{"name": "a", "type": "numeric", "bounds": [0, 1]}],
        }
    )
    return RunConfig.build(data=data, schema_path=Path("s.yaml"), stream=stream), schema


def test_auto_streams_a_large_parquet_table_only(tmp_path: Path) -> None:
    """auto decides from public facts: the format and the schema's expected_rows."""
    pq, csv = tmp_path / "t.parquet", tmp_path / "t.csv"
    pl.DataFrame({"a": [0.5]}).write_parquet(pq)
    pl.DataFrame({"a": [0.5]}).write_csv(csv)
    assert streamed(*_config(pq, 2_000_000))
    assert not streamed(*_config(pq, 1_000_000))  # at auto_rows: read whole
    assert not streamed(*_config(csv, 2_000_000))
    assert streamed(*_config(pq, 100, auto_rows=50))
    assert streamed(*_config(csv, 10, enabled=True))  # asked for: pre-flight then checks the format
    assert not streamed(*_config(pq, 2_000_000, enabled=False))


def test_scratch_is_removed_however_the_block_ends(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), scratch(tmp_path / "work") as work:
        DiskRows(work / "x.f32", 2).append(np.ones((3, 2)))
        raise RuntimeError("a failed stage")
    assert not (tmp_path / "work").exists()
