"""The synthetic table's randomness: an explicit generator, never torch's global RNG."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from privflow.data.codec import Codec
from privflow.data.schema import Schema
from privflow.models import build_flow
from privflow.serving.sampler import sample_rows


@pytest.fixture(scope="module")
def flow_and_codec(demo_dir):
    codec = Codec.from_schema(Schema.from_yaml(demo_dir / "adult.yaml"))
    torch.manual_seed(0)
    flow = build_flow("maf", codec.cardinalities, blocks=1, hidden=8).eval()
    return flow, codec


def test_same_seed_same_table_whatever_the_global_rng(flow_and_codec) -> None:
    flow, codec = flow_and_codec
    tables = []
    for draws in (0, 1, 12345):  # e.g. draws counted by a private row count
        torch.manual_seed(7)
        torch.rand(draws)
        tables.append(sample_rows([flow], codec, 200, seed=99))
    assert all(t.equals(tables[0]) for t in tables)


def test_sampling_leaves_the_global_rng_alone(flow_and_codec) -> None:
    flow, codec = flow_and_codec
    torch.manual_seed(3)
    before = torch.random.get_rng_state().clone()
    sample_rows([flow], codec, 50)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_without_a_seed_each_table_is_fresh(flow_and_codec) -> None:
    flow, codec = flow_and_codec
    torch.manual_seed(5)
    a = sample_rows([flow], codec, 200)
    torch.manual_seed(5)
    b = sample_rows([flow], codec, 200)
    assert isinstance(a, pl.DataFrame) and not a.equals(b)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_write_samples_streams_the_same_rows_as_sample_rows(flow_and_codec, tmp_path, suffix) -> None:
    from privflow.data.io import read_table
    from privflow.serving.sampler import write_samples

    flow, codec = flow_and_codec
    out = write_samples([flow, flow], codec, 301, tmp_path / f"s{suffix}", seed=4, batch=64)
    assert not list(tmp_path.glob("*.part"))
    got = pl.read_csv(out) if suffix == ".csv" else pl.read_parquet(out)
    want = sample_rows([flow, flow], codec, 301, seed=4, batch=64)
    assert got.height == 301 and got.columns == want.columns
    for col in codec.schema.columns:
        if col.type == "integer":
            assert got.schema[col.name].is_integer()  # never 39.0
        assert got.get_column(col.name).cast(pl.String).to_list() == want.get_column(col.name).cast(pl.String).to_list()
    assert read_table(out).height == 301


def test_write_samples_leaves_the_global_rng_alone(flow_and_codec, tmp_path) -> None:
    from privflow.serving.sampler import write_samples

    flow, codec = flow_and_codec
    with torch.random.fork_rng():  # leave later tests the global state they had before
        torch.manual_seed(3)
        before = torch.random.get_rng_state().clone()
        write_samples([flow], codec, 50, tmp_path / "a.csv", batch=16)
        assert torch.equal(torch.random.get_rng_state(), before)


def test_iter_samples_yields_batches_of_at_most_batch_rows(flow_and_codec) -> None:
    from privflow.serving.sampler import iter_samples

    flow, codec = flow_and_codec
    sizes = [f.height for f in iter_samples([flow], codec, 100, seed=1, batch=32)]
    assert sizes == [32, 32, 32, 4]


def test_rows_do_not_depend_on_the_number_of_workers(flow_and_codec) -> None:
    flow, codec = flow_and_codec
    one = sample_rows([flow, flow], codec, 250, seed=8, batch=40, workers=1)
    three = sample_rows([flow, flow], codec, 250, seed=8, batch=40, workers=3)
    assert one.equals(three)


@pytest.fixture(scope="module")
def copula_flow_and_codec(demo_dir):
    """The default release's path: a flow over the copula codec of (hand-made) marginals."""
    import numpy as np

    from privflow.data.copula import CopulaCodec, Marginals, schema_cells

    schema = Schema.from_yaml(demo_dir / "adult.yaml")
    cells = schema_cells(schema, grid_bins=64)
    marginals = Marginals({c.column: np.arange(1.0, c.n_cells + 1.0) for c in cells}, grid_bins=64)
    codec = CopulaCodec.from_marginals(schema, marginals)
    torch.manual_seed(0)
    flow = build_flow("dphflow", codec.cardinalities, blocks=2, hidden=16).eval()
    return flow, codec


def test_copula_rows_depend_only_on_seed_and_batch(copula_flow_and_codec, tmp_path) -> None:
    from privflow.serving.sampler import write_samples

    flow, codec = copula_flow_and_codec
    one = sample_rows([flow, flow], codec, 230, seed=5, batch=50, workers=1)
    three = sample_rows([flow, flow], codec, 230, seed=5, batch=50, workers=3)
    assert one.equals(three) and one.height == 230
    assert one.equals(sample_rows([flow, flow], codec, 230, seed=5, batch=50, workers=2))
    written = pl.read_csv(write_samples([flow, flow], codec, 230, tmp_path / "c.csv", seed=5, batch=50))
    for name in one.columns:
        assert written.get_column(name).cast(pl.String).to_list() == one.get_column(name).cast(pl.String).to_list()


def test_sampling_works_with_gradients_enabled(copula_flow_and_codec) -> None:
    """The sampler switches autograd off itself (inference mode): a caller in grad mode gets
    the same rows, and its grad mode is left as it was."""
    flow, codec = copula_flow_and_codec
    with torch.no_grad():
        quiet = sample_rows([flow], codec, 40, seed=2, batch=16)
    assert torch.is_grad_enabled()
    assert sample_rows([flow], codec, 40, seed=2, batch=16).equals(quiet)
    assert torch.is_grad_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_flow_on_cuda_samples_the_cpu_rows(copula_flow_and_codec) -> None:
    """The flow's inverse on the GPU (`generate --device cuda`): the draws stay on the CPU's one
    generator, so the same seed gives the CPU's table up to float rounding (the CPU and the GPU
    round differently, so a value on a cell's edge may land in the next cell)."""
    import copy

    flow, codec = copula_flow_and_codec
    cpu = sample_rows([flow], codec, 3000, seed=6, batch=700)
    gpu = sample_rows([copy.deepcopy(flow).to("cuda")], codec, 3000, seed=6, batch=700, workers=2)
    assert gpu.columns == cpu.columns and gpu.height == cpu.height
    for name in cpu.columns:
        a, b = cpu.get_column(name), gpu.get_column(name)
        assert (a == b).mean() >= 0.99, name
