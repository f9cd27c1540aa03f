"""DPDDP training over two CPU processes (gloo, launched with torchrun) against one process.

Checks that the accountant counts the global batch once (q = global expected batch /
public rows, one event for the run, on rank 0 only), that the local batches add up to the
single-process Poisson batches, and that the two-process model matches the one-process
model trained with the same seeds (test-only seeded noise and sampling); the first step is
also checked against an independent torch.func reference. The launcher reserves in the
ledger before spawning, settles with rank 0's event, abandons after a started failure and
releases when nothing started. gloo under load can fail to rendezvous: each torchrun has a
timeout and one retry under a fresh run id and folder.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from privflow.errors import BudgetExceeded
from privflow.privacy.accountant import PLDAccountant
from privflow.privacy.distributed import (
    DistributedSettings,
    WorkersFailed,
    fresh_seed,
    global_poisson_mask,
    launch,
    per_example_gradients,
    planned_event,
    write_job,
)
from privflow.privacy.events import PoissonGaussianEvent, event_from_dict
from privflow.privacy.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
CARD = [None, None, None, None]
MODEL = {"name": "maf", "config": {"blocks": 1, "hidden": 8}}
PUBLIC_ROWS = 200


DATASET = "toy"


def _job(tmp: Path, name: str, settings: DistributedSettings, data: Path) -> Path:
    job = {"data": str(data), "cardinalities": CARD, "model": MODEL, "settings": settings, "out": str(tmp / name)}
    return write_job(tmp / f"{name}.json", job)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _ledger(tmp: Path, budget: float = 1e6) -> Path:
    path = tmp / "ledger.sqlite"
    Ledger(path).ensure_dataset(DATASET, budget, 1e-5)
    return path


def _torchrun(tmp: Path, name: str, settings: DistributedSettings, data: Path, nproc: int) -> Path:
    """Launch through the ledger; one retry (fresh folder and run id) if gloo fails under load."""
    ledger = _ledger(tmp)
    last: Exception | None = None
    for attempt in range(2):
        folder = f"{name}" if attempt == 0 else f"{name}_retry"
        job = _job(tmp, folder, settings, data)
        try:
            launch(job, nproc, ledger_path=ledger, dataset=DATASET, run_id=f"{folder}", timeout=240, env=_env())
            return tmp / folder
        except (WorkersFailed, subprocess.TimeoutExpired) as exc:
            last = exc
    raise AssertionError(f"torchrun failed twice: {last}")


def _outputs(folder: Path, world: int) -> tuple[dict, list[dict]]:
    result = torch.load(folder / "result.pt", weights_only=False)
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
    return result, ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ddp")
    rng = np.random.default_rng(0)
    x = rng.beta(2.0, 3.0, size=(PUBLIC_ROWS, len(CARD))).astype(np.float32)
    data = tmp / "x.npy"
    np.save(data, x)
    common = dict(
        steps=6,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        lr=5e-2,
        optimizer="adam",
        checkpoint_every=3,
        seed=3,
        sampling_seed=11,
    )
    settings = DistributedSettings.for_rows(PUBLIC_ROWS, 40, noise_seed=5, **common)
    sgd_one_step = DistributedSettings.for_rows(
        PUBLIC_ROWS, 40, noise_seed=5, **{**common, "steps": 1, "optimizer": "sgd"}
    )
    folders = {
        "two": _torchrun(tmp, "two", settings, data, 2),
        "one": _torchrun(tmp, "one", settings, data, 1),
        "two_sgd": _torchrun(tmp, "two_sgd", sgd_one_step, data, 2),
    }
    return {"tmp": tmp, "x": x, "settings": settings, "sgd": sgd_one_step, "folders": folders, "data": data}


@pytest.mark.slow
def test_accountant_counts_the_global_batch_once(runs: dict) -> None:
    settings: DistributedSettings = runs["settings"]
    result, ranks = _outputs(runs["folders"]["two"], 2)
    assert settings.sample_rate == pytest.approx(40 / PUBLIC_ROWS)
    event = event_from_dict(result["event"])
    assert event == PoissonGaussianEvent(40 / PUBLIC_ROWS, 1.0, 6)  # global q, one event, 6 steps (not 12)
    assert ranks[0]["accountant_history"] == [[1.0, 40 / PUBLIC_ROWS, 6]]
    assert ranks[1]["accountant_history"] == [] and ranks[1]["event"] is None
    # the run costs what a single process with the same (q, sigma, steps) costs
    single = event_from_dict(_outputs(runs["folders"]["one"], 1)[0]["event"])
    assert single == event
    assert PLDAccountant().epsilon([event], 1e-5) == pytest.approx(PLDAccountant().epsilon([single], 1e-5))


@pytest.mark.slow
def test_local_batches_partition_the_global_poisson_batch(runs: dict) -> None:
    _, two = _outputs(runs["folders"]["two"], 2)
    _, one = _outputs(runs["folders"]["one"], 1)
    per_step = [a + b for a, b in zip(two[0]["local_batch_sizes"], two[1]["local_batch_sizes"], strict=True)]
    assert per_step == one[0]["local_batch_sizes"]
    gen = torch.Generator().manual_seed(11)
    expected = [int(global_poisson_mask(PUBLIC_ROWS, 40 / PUBLIC_ROWS, gen).sum()) for _ in range(6)]
    assert per_step == expected
    assert all(r["replica_max_abs_diff"] == 0.0 for r in two)  # replicas stay identical


@pytest.mark.slow
def test_two_processes_match_one_process(runs: dict) -> None:
    two, _ = _outputs(runs["folders"]["two"], 2)
    one, _ = _outputs(runs["folders"]["one"], 1)
    assert two["state"].keys() == one["state"].keys()
    diff = max(float((two["state"][k] - one["state"][k]).abs().max()) for k in two["state"])
    assert diff < 1e-4
    assert [s for s, _ in two["checkpoints"]] == [3, 6]


@pytest.mark.slow
def test_first_step_matches_an_independent_reference(runs: dict) -> None:
    """One SGD step recomputed here: torch.func per-example grads, flat clipping, opacus' noise draw."""
    from torch.func import functional_call, grad, vmap

    from privflow.models import build_flow

    settings: DistributedSettings = runs["sgd"]
    torch.manual_seed(settings.seed)
    model = build_flow(MODEL["name"], CARD, **MODEL["config"])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.as_tensor(runs["x"])
    coins = global_poisson_mask(PUBLIC_ROWS, settings.sample_rate, torch.Generator().manual_seed(11))
    batch = x[coins]

    def loss(p: dict, row: torch.Tensor) -> torch.Tensor:
        return -functional_call(model, p, (row.unsqueeze(0),), {}, strict=False, tie_weights=True).sum()

    model.forward = model.log_prob  # functional_call drives forward
    per = vmap(grad(loss), in_dims=(None, 0))(params, batch)
    norms = torch.stack([per[n].reshape(len(batch), -1).norm(dim=1) for n in names], dim=1).norm(dim=1)
    factor = (settings.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
    noise_gen = torch.Generator().manual_seed(5)
    expected = {}
    for n in names:  # opacus draws noise parameter by parameter, in the optimizer's order
        total = torch.einsum("i,i...", factor, per[n])
        noise = torch.normal(
            0.0, settings.noise_multiplier * settings.max_grad_norm, params[n].shape, generator=noise_gen
        )
        expected[n] = params[n] - settings.lr * (total + noise) / settings.expected_batch_size
    got, _ = _outputs(runs["folders"]["two_sgd"], 2)
    for n in names:
        assert torch.allclose(got["state"][n], expected[n], atol=1e-5), n
    # the noise is in the update: without it the weights land elsewhere
    noiseless = {
        n: params[n] - settings.lr * torch.einsum("i,i...", factor, per[n]) / settings.expected_batch_size
        for n in names
    }
    assert max(float((got["state"][n] - noiseless[n]).abs().max()) for n in names) > 1e-3


def test_per_example_gradients_sum_to_the_batch_gradient() -> None:
    from privflow.models import build_flow

    torch.manual_seed(0)
    model = build_flow(MODEL["name"], CARD, **MODEL["config"])
    x = torch.rand(7, len(CARD))
    per = per_example_gradients(model, x)
    model.zero_grad()
    (-model.log_prob(x).sum()).backward()
    for p in model.parameters():
        assert per[p].shape == (7, *p.shape)
        assert torch.allclose(per[p].sum(0), p.grad, atol=1e-5)
    empty = per_example_gradients(model, x[:0])
    assert all(g.shape == (0, *p.shape) for p, g in empty.items())


def test_settings_take_the_public_row_count_and_fresh_entropy() -> None:
    s = DistributedSettings.for_rows(32561, 512, steps=10, noise_multiplier=1.1, max_grad_norm=1.0)
    assert s.sample_rate == pytest.approx(512 / 32561) and s.expected_batch_size == 512.0
    assert s.noise_seed is None and s.sampling_seed is None
    assert len({fresh_seed() for _ in range(8)}) == 8
    with pytest.raises(ValueError):
        DistributedSettings(sample_rate=0.0, steps=1, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0)


@pytest.mark.slow
def test_launch_settles_the_ledger_with_rank_zeros_event(runs: dict) -> None:
    ledger = Ledger(runs["tmp"] / "ledger.sqlite")
    records = {r.run_id: r for r in ledger.runs(DATASET)}
    two = records[runs["folders"]["two"].name]
    assert two.status == "settled"
    assert list(two.events) == [PoissonGaussianEvent(40 / PUBLIC_ROWS, 1.0, 6)] == [planned_event(runs["settings"])]
    assert all(r.status in ("settled", "failed") for r in records.values())  # a retried attempt stays counted


def test_launch_refuses_over_budget_before_spawning(tmp_path: Path) -> None:
    settings = DistributedSettings.for_rows(PUBLIC_ROWS, 40, steps=50, noise_multiplier=0.5, max_grad_norm=1.0)
    ledger = _ledger(tmp_path, budget=0.01)
    job = _job(tmp_path, "refused", settings, tmp_path / "x.npy")
    with pytest.raises(BudgetExceeded):
        launch(job, 2, ledger_path=ledger, dataset=DATASET, run_id="r1", python="/nonexistent/python")
    assert not (tmp_path / "refused").exists()  # no worker was started
    assert Ledger(ledger).runs(DATASET) == []


def test_launch_releases_when_no_worker_started(tmp_path: Path) -> None:
    settings = DistributedSettings.for_rows(PUBLIC_ROWS, 40, steps=2, noise_multiplier=1.0, max_grad_norm=1.0)
    ledger = _ledger(tmp_path)
    job = _job(tmp_path, "nostart", settings, tmp_path / "x.npy")
    with pytest.raises(OSError):
        launch(job, 2, ledger_path=ledger, dataset=DATASET, run_id="r2", python=str(tmp_path / "no-python"))
    [record] = Ledger(ledger).runs(DATASET)
    assert record.status == "released" and Ledger(ledger).spent(DATASET)[0] == 0.0


@pytest.mark.slow
def test_launch_abandons_when_workers_fail_after_starting(tmp_path: Path) -> None:
    """The worker writes its marker, then fails to read the (missing) rows: the run stays counted."""
    settings = DistributedSettings.for_rows(PUBLIC_ROWS, 40, steps=2, noise_multiplier=1.0, max_grad_norm=1.0)
    ledger = _ledger(tmp_path)
    job = _job(tmp_path, "broken", settings, tmp_path / "missing.npy")
    with pytest.raises(WorkersFailed):
        launch(job, 1, ledger_path=ledger, dataset=DATASET, run_id="r3", timeout=240, env=_env())
    [record] = Ledger(ledger).runs(DATASET)
    assert record.status == "failed" and list(record.events) == [planned_event(settings)]
    assert Ledger(ledger).spent(DATASET)[0] > 0
