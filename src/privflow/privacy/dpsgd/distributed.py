"""Data-parallel DP-SGD: THE trainer (``privacy.dpsgd.dp_sgd.train``) run by W processes under torchrun.

    train_data_parallel(model, rows, settings)   # settings.workers = W > 1

``dp_sgd.train`` holds the step and its ``Replica`` (module docstring there): one Poisson
sample of the whole table per step from coins every rank draws alike, each rank's clipped
per-example gradient sum from the same clipping code, noise added once (rank 0, before one
all-reduce), the same optimizer step on every rank. This module only starts and ends the
processes:

1. The launcher writes the encoded rows, the model (its initial weights, after the DP
   statistics) and the settings to a fresh folder that only the curator's user can read
   (``tempfile.mkdtemp``: mode 0700, under $TMPDIR; files 0600). The folder is removed when
   the run ends, however it ends: no cache keeps rows.
2. ``python -m torch.distributed.run --standalone`` starts W workers (this module's
   ``main``): the rendezvous is a TCP store on a free loopback port chosen by the OS, gloo on
   CPU, NCCL on GPU (one GPU per worker, ``cuda:LOCAL_RANK``).
3. Rank 0 reports each step on stdout (the launcher drives the caller's ``on_step``: the
   progress bar), checks at the end that every replica holds rank 0's weights, and writes
   the ``TrainResult`` and the final weights; the launcher loads them into ``model``.

Privacy: the run's event is ``dp_sgd_event(settings)``, ``PoissonGaussianEvent(q, sigma,
steps)`` with the global q, whatever W: the caller records it once, exactly as for one
process. The ledger is the caller's (flows/pipeline.py reserves the whole plan before any row
is read, hence before any worker starts, and settles, abandons or releases the run exactly
as for one process: a failure here happens inside the DP-SGD mechanism and keeps the
reservation counted). Seeds: rank 0 draws them from the OS CSPRNG and broadcasts them; they
never touch a file.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from privflow.privacy.dpsgd.dp_sgd import Replica, TrainResult, TrainSettings, resolve_device, train

PROGRESS = "privflow-step"  # rank 0's progress lines on stdout: "privflow-step <step> <loss>"
COLLECTIVE_TIMEOUT_S = 1800.0  # a collective that waits longer than this fails the run


class WorkersFailed(RuntimeError):
    """The worker processes exited with an error, or ran past the launcher's timeout."""


@contextmanager
def _private_folder(parent: str | Path | None = None) -> Iterator[Path]:
    """A fresh owner-only folder (0700) for rows handed to the workers; removed on exit."""
    path = Path(tempfile.mkdtemp(prefix="privflow-workers-", dir=parent))
    try:
        os.chmod(path, 0o700)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _owner_only(path: Path) -> Iterator[IO[bytes]]:
    """Create `path` (which must not exist) readable and writable by its owner alone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        yield fh


def _command(workers: int, folder: Path, python: str | None) -> list[str]:
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # c10d rendezvous on a free port the OS picks (localhost:0)
        "--nnodes=1",
        f"--nproc-per-node={workers}",
        "-m",
        "privflow.privacy.dpsgd.distributed",
        "--job",
        str(folder),
    ]


def _stop(proc: subprocess.Popen) -> None:
    """End torchrun and its workers (their own session, so a terminal's Ctrl-C reaches only us)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def train_data_parallel(
    model: nn.Module,
    data: Tensor,
    settings: TrainSettings,
    on_step: Callable[[int, float], None] | None = None,
    *,
    timeout: float | None = None,
    python: str | None = None,
    folder: str | Path | None = None,
) -> TrainResult:
    """``dp_sgd.train(model, data, settings, on_step)`` over ``settings.workers`` processes.

    Same result (module docstring): the checkpoints, losses and event of the run, and
    ``model`` holds the final weights. `timeout` (seconds, None: none) ends the workers and
    raises ``WorkersFailed``; `folder`: where the owner-only temporary folder is made
    (default $TMPDIR); `python`: the interpreter the workers run (default this one).
    """
    if settings.workers < 2:
        raise ValueError("train_data_parallel needs settings.workers >= 2; call dp_sgd.train for one process")
    with _private_folder(folder) as job:
        with _owner_only(job / "rows.npy") as fh:
            np.save(fh, data.detach().to("cpu", torch.float32).numpy())
        with _owner_only(job / "job.pt") as fh:
            torch.save(
                {
                    "model": model.to("cpu"),
                    "settings": settings,
                    "threads": torch.get_num_threads(),
                    "collective_timeout": min(timeout or COLLECTIVE_TIMEOUT_S, COLLECTIVE_TIMEOUT_S),
                },
                fh,
            )
        # torchrun's log folders and torch's caches go to a temporary folder of the job's, removed
        # with it (otherwise they would be left in $TMPDIR after every run)
        (job / "tmp").mkdir(mode=0o700)
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "TMPDIR": str(job / "tmp")}
        proc = subprocess.Popen(
            _command(settings.workers, job, python),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _stop(proc)

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        tail: collections.deque[str] = collections.deque(maxlen=60)
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(PROGRESS + " "):
                    _, step, loss = line.split()
                    if on_step is not None:
                        on_step(int(step), float(loss))
                else:
                    tail.append(line)
            code = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            _stop(proc)  # an interrupt or an error in on_step leaves no worker behind
        if expired.is_set():
            raise WorkersFailed(f"the {settings.workers} workers ran past the {timeout:g} s timeout and were stopped")
        if code != 0 or not (job / "result.pt").exists():
            raise WorkersFailed(f"torchrun exited with status {code}:\n{''.join(tail)[-4000:]}")
        out = torch.load(job / "result.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(out["state"])
    return out["result"]


def _weights(model: nn.Module) -> Tensor:
    return torch.cat([v.detach().reshape(-1).double() for v in model.state_dict().values() if v.is_floating_point()])


def run_worker(job: Path) -> None:
    """One torchrun worker: join the group (gloo on CPU, NCCL on GPU), train, and on rank 0
    report progress and write the result (see the module docstring)."""
    spec: dict[str, Any] = torch.load(job / "job.pt", map_location="cpu", weights_only=False)
    settings: TrainSettings = spec["settings"]
    device = resolve_device(settings.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    torch.set_num_threads(int(spec["threads"]))
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        timeout=timedelta(seconds=float(spec["collective_timeout"])),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        replica = Replica.of_process_group()
        data = torch.from_numpy(np.load(job / "rows.npy", mmap_mode="c"))  # each rank reads its rows only
        model: nn.Module = spec["model"]

        def report(step: int, loss: float) -> None:
            print(f"{PROGRESS} {step} {loss!r}", flush=True)

        result = train(model, data, replace(settings, device=str(device)), report, replica)
        mine = _weights(model)
        lead = mine.clone()
        dist.broadcast(lead, 0)
        if not torch.equal(mine, lead):
            raise RuntimeError(f"rank {replica.rank}'s weights differ from rank 0's after the same reduced steps")
        if replica.rank == 0:
            state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
            with _owner_only(job / "result.part") as fh:
                torch.save({"result": result, "state": state}, fh)
            os.replace(job / "result.part", job / "result.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point (started by ``train_data_parallel``, never by hand)."""
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m privflow.privacy.dpsgd.distributed")
    parser.add_argument("--job", required=True, type=Path, help="the launcher's owner-only job folder")
    run_worker(parser.parse_args(argv).job)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["PROGRESS", "WorkersFailed", "run_worker", "train_data_parallel"]
