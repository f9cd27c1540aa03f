"""The one DP-SGD trainer run data-parallel: two CPU processes (gloo, torchrun) against one.

With the same test-only seeds, two processes give the single-process run's weights,
checkpoints and losses up to float summation order (per-layer clipping with Adam and EMA;
the non-private baseline), and the first step of a sparsified run; the event is the
single-process one (one event, global q, steps counted once). The noise is added once: with
a huge noise multiplier and production seeding (no test seed: rank 0's OS entropy, shared
by broadcast), the update's spread is one Gaussian draw, not two and not none. The rows
pass through an owner-only folder that is gone afterwards; a failing or hanging torchrun
becomes WorkersFailed and leaves no folder behind. Pre-flight refuses an impossible
--workers before anything starts.

Not flaky by construction: every torchrun has a timeout, its rendezvous takes a free port
from the OS (``--standalone``: localhost:0), and all seeded comparisons are deterministic.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from privflow.cli import app
from privflow.core.errors import ConfigError
from privflow.models import build_flow
from privflow.preflight import check_workers
from privflow.privacy.accounting.events import PoissonGaussianEvent
from privflow.privacy.dpsgd.distributed import PROGRESS, WorkersFailed, train_data_parallel
from privflow.privacy.dpsgd.dp_sgd import Replica, TrainResult, TrainSettings, dp_sgd_event, train

CARD = [None, 3, None, 4]  # categorical columns: the dequantization noise is split across ranks too
ROWS = 240
TIMEOUT = 240.0


def table(n: int = ROWS) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.stack(
        [
            torch.rand(n, generator=g),
            torch.randint(0, 3, (n,), generator=g).float(),
            torch.rand(n, generator=g),
            torch.randint(0, 4, (n,), generator=g).float(),
        ],
        1,
    )


def flow() -> torch.nn.Module:
    torch.manual_seed(3)
    return build_flow("dphflow", CARD, blocks=1, hidden=8)


def settings(**kw: object) -> TrainSettings:
    base: dict = dict(
        sample_rate=0.2,
        steps=6,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        clipping="per_layer",
        checkpoint_every=3,
        ema_decay=0.9,
        expected_batch_size=48.0,
        lr=2e-2,
        noise_seed=7,
    )
    base.update(kw)
    return TrainSettings(**base)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def in_folder(folder: Path) -> list[tuple[str, int]]:
    """(name, permission bits) of the launcher's folder and its files, while workers run."""
    found = []
    for sub in folder.iterdir():
        found.append((sub.name, stat.S_IMODE(sub.stat().st_mode)))
        found += [(f"{sub.name}/{f.name}", stat.S_IMODE(f.stat().st_mode)) for f in sub.iterdir()]
        if (sub / "tmp").is_dir():  # the workers' TMPDIR: what torchrun and torch put there
            found += [(f"{sub.name}/tmp/{f.name}", stat.S_IMODE(f.stat().st_mode)) for f in (sub / "tmp").iterdir()]
    return found


def two_and_one(tmp: Path, name: str, s: TrainSettings) -> dict:
    """The same settings in one process and in two (torchrun); the two-process run's folder
    is looked at from its progress callback, while the workers run."""
    one_model, two_model = flow(), flow()
    start = weights(two_model)
    one = train(one_model, table(), s)
    seen: list[tuple[int, float]] = []
    folder = tmp / name
    folder.mkdir()
    modes: list[list[tuple[str, int]]] = []

    def on_step(step: int, loss: float) -> None:
        seen.append((step, loss))
        modes.append(in_folder(folder))

    two = train_data_parallel(two_model, table(), replace(s, workers=2), on_step, timeout=TIMEOUT, folder=folder)
    return {
        "one": one,
        "two": two,
        "one_model": weights(one_model),
        "two_model": weights(two_model),
        "start": start,
        "seen": seen,
        "modes": modes,
        "folder": folder,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("workers")
    torch.set_num_threads(1)
    huge = settings(
        steps=1,
        optimizer="sgd",
        lr=1.0,
        ema_decay=0.0,
        clipping="per_unit",
        noise_multiplier=1e6,
        expected_batch_size=10.0,
        noise_seed=None,
    )
    model = flow()
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    start = weights(model)
    noisy = train_data_parallel(model, table(), replace(huge, workers=2), timeout=TIMEOUT)
    return {
        "per_layer": two_and_one(tmp, "per_layer", settings()),
        "nonprivate": two_and_one(tmp, "nonprivate", settings(private=False, noise_multiplier=0.0, steps=4)),
        "sparsify": two_and_one(tmp, "sparsify", settings(clipping="sparsify", steps=3)),
        "huge": {"settings": huge, "start": start, "end": weights(model), "trained": trained, "result": noisy},
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", ["per_layer", "nonprivate"])
def test_two_processes_equal_one_process(runs: dict, case: str) -> None:
    run = runs[case]
    one, two = run["one"], run["two"]
    assert isinstance(two, TrainResult) and two.steps == one.steps
    assert max_diff(run["two_model"], run["one_model"]) < 1e-5  # the caller's model holds the final weights
    assert max_diff(run["two_model"], run["start"]) > 1e-3  # and it trained
    assert [s for s, _ in two.checkpoints] == [s for s, _ in one.checkpoints]
    for (_, a), (_, b) in zip(two.checkpoints, one.checkpoints, strict=True):
        assert max_diff(a, b) < 1e-5  # EMA checkpoints too
    assert two.losses == pytest.approx(one.losses, rel=1e-5)
    assert run["seen"] == list(enumerate(two.losses, start=1))  # the caller's progress callback, every step
    assert two.nonfinite_examples == one.nonfinite_examples == 0


@pytest.mark.slow
def test_one_event_with_the_global_rate_and_steps_counted_once(runs: dict) -> None:
    s = settings()
    event = runs["per_layer"]["two"].event
    assert event == runs["per_layer"]["one"].event == dp_sgd_event(s) == PoissonGaussianEvent(0.2, 1.0, 6)
    assert runs["nonprivate"]["two"].event is None  # the non-private baseline spends nothing


@pytest.mark.slow
def test_sparsified_run_shares_the_batch_and_trains(runs: dict) -> None:
    """Each rank draws its own sparsification masks, so the runs agree in distribution only;
    the first step's loss is computed before any mask (same weights, same coins, same rows)."""
    one, two = runs["sparsify"]["one"], runs["sparsify"]["two"]
    assert two.losses[0] == pytest.approx(one.losses[0], rel=1e-6)
    assert all(math.isfinite(v) for v in two.losses) and two.event == one.event


@pytest.mark.slow
def test_noise_is_added_once_per_step(runs: dict) -> None:
    """SGD, lr 1, one step, sigma = 1e6: the update is -(clipped sum + noise) / B with the
    clipped sum (at most |batch| C) negligible, so update / (sigma C / B) is one standard
    normal draw per coordinate: spread 1 (noise on rank 0 only), not sqrt(2) (on both), not 0."""
    huge = runs["huge"]
    s: TrainSettings = huge["settings"]
    start, end = huge["start"], huge["end"]
    update = torch.cat([(end[k].double() - start[k].double()).flatten() for k in huge["trained"]])
    assert update.numel() > 300
    ratio = float(update.std()) / (s.noise_multiplier * s.max_grad_norm / s.expected_batch_size)
    assert 0.85 < ratio < 1.15, ratio
    assert huge["result"].event == PoissonGaussianEvent(s.sample_rate, 1e6, 1)


@pytest.mark.slow
def test_rows_pass_through_an_owner_only_folder_that_is_removed(runs: dict) -> None:
    run = runs["per_layer"]
    seen = run["modes"][0]
    (job, job_mode), *files = seen
    assert job.startswith("privflow-workers-") and job_mode == 0o700
    assert {name.split("/")[1] for name, _ in files} >= {"rows.npy", "job.pt"}
    assert all(mode == 0o600 for name, mode in files if name.split("/")[1] in ("rows.npy", "job.pt"))
    # torchrun's log folders go to the job's own TMPDIR, owner-only, and leave with it (they were
    # left in the system's $TMPDIR after every run: fuzzing round 6)
    assert (f"{job}/tmp", 0o700) in files
    assert any(name.startswith(f"{job}/tmp/torchelastic_") for name, _ in files), files
    assert list(run["folder"].iterdir()) == []  # gone after the run


def fake_python(tmp: Path, body: str) -> str:
    """An executable standing in for the interpreter torchrun would start."""
    path = tmp / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o700)
    return str(path)


def test_failing_workers_raise_and_leave_no_rows(tmp_path: Path) -> None:
    python = fake_python(tmp_path, f'echo "{PROGRESS} 1 2.5"; echo "worker exploded" >&2; exit 3')
    folder = tmp_path / "jobs"
    folder.mkdir()
    seen: list[tuple[int, float]] = []
    with pytest.raises(WorkersFailed, match="worker exploded"):
        train_data_parallel(
            flow(),
            table(),
            settings(workers=2),
            lambda s, v: seen.append((s, v)),
            python=python,
            folder=folder,
            timeout=60,
        )
    assert seen == [(1, 2.5)] and list(folder.iterdir()) == []


def test_hanging_workers_are_stopped_at_the_timeout(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "sleep 60")
    folder = tmp_path / "jobs"
    folder.mkdir()
    with pytest.raises(WorkersFailed, match="timeout"):
        train_data_parallel(flow(), table(), settings(workers=2), python=python, folder=folder, timeout=1.0)
    assert list(folder.iterdir()) == []


def test_the_trainer_refuses_workers_it_was_not_launched_with() -> None:
    with pytest.raises(ValueError, match="workers"):
        train(flow(), table(), settings(workers=2))
    with pytest.raises(ValueError, match="workers >= 2"):
        train_data_parallel(flow(), table(), settings())
    with pytest.raises(ValueError):
        settings(workers=0)


def test_ranks_keep_disjoint_rows_that_cover_the_sample() -> None:
    rows = torch.tensor([0, 3, 4, 7, 8, 9, 15])
    kept = [rows[Replica(r, 3).keeps(rows)] for r in range(3)]
    assert sorted(torch.cat(kept).tolist()) == rows.tolist()
    assert all(set(a.tolist()).isdisjoint(b.tolist()) for i, a in enumerate(kept) for b in kept[i + 1 :])
    assert Replica().keeps(rows) is None  # one process keeps the whole sample


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_preflight_checks_the_number_of_workers() -> None:
    check_workers(1, "cpu")
    check_workers(min(2, _usable_cpus()), "cpu")
    with pytest.raises(ConfigError, match="one core per worker"):
        check_workers(_usable_cpus() + 1, "cpu")
    with pytest.raises(ConfigError, match="one GPU per worker"):
        check_workers(max(2, torch.cuda.device_count() + 1), "cuda")
    with pytest.raises(ConfigError, match="at least 1"):
        check_workers(0, "cpu")


@pytest.mark.parametrize("workers", ["0", "many"])
def test_run_refuses_impossible_workers_before_anything_starts(tmp_path: Path, demo_dir: Path, workers: str) -> None:
    count = str(_usable_cpus() + 1) if workers == "many" else workers
    store = tmp_path / "store"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--data",
            str(demo_dir / "adult_train.csv"),
            "--schema",
            str(demo_dir / "adult.yaml"),
            "--workers",
            count,
            "--device",
            "cpu",
            "--store",
            str(store),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "workers" in result.output and "Traceback" not in result.output
    assert not (store / "ledger.db").exists()  # nothing reserved
