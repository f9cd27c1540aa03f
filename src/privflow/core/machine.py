"""What this machine can do, checked before anything is spent: the device (`resolve_device`),
data-parallel workers (`check_workers`), memory for a table sampled in memory (`check_memory`),
room on the output's disk (`check_room`) and a store folder that takes new files
(`check_store`). From the machine alone: no row is read, nothing is created.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from privflow.core.errors import ConfigError, DeviceUnavailable, StoreError, byte_size


def existing_ancestor(p: Path) -> Path:
    """`p`, or the nearest folder above it that exists (where creating `p` would start)."""
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def refuses_new_files(folder: Path) -> str | None:
    """Why `folder` takes no new file (a test file made and removed), or None when it does.
    Permission bits alone do not say it: root passes them, and some file systems refuse anyway."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".privflow-write-test-"):
            return None
    except OSError as exc:
        return str(exc.strerror or exc)


def check_room(out: Path, rows: int, columns: int, fewer: str = "Ask for fewer rows (-n)") -> None:
    """Refuse a table that cannot fit on the output's disk, before any row is sampled. The
    sizes are lower bounds (one character and a separator per value in CSV, a quarter byte
    per value in compressed Parquet): a refusal is certain, a pass is not a promise."""
    per_value = 2.0 if Path(out).suffix.lower() == ".csv" else 0.25
    need = float(rows) * max(1, columns) * per_value
    folder = existing_ancestor(Path(out).parent)
    free = shutil.disk_usage(folder).free
    if need > free:
        raise ConfigError(
            f"{rows:,} rows of {columns} columns need at least {byte_size(need)} as {Path(out).suffix.lower()[1:]}, "
            f"more than the {byte_size(free)} free under '{folder}'. {fewer}, or write to a disk with room."
        )


BYTES_PER_SAMPLED_VALUE = 64.0  # peak memory of a value sampled in memory: the encoded batch, the frame, its columns


def available_memory() -> float:
    """Bytes of memory free for a new allocation (Linux: MemAvailable; elsewhere: no limit)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def check_memory(rows: int, columns: int, what: str, fewer: str) -> None:
    """Refuse a table sampled in memory that this machine cannot hold, before any row is drawn."""
    need, free = float(rows) * max(1, columns) * BYTES_PER_SAMPLED_VALUE, available_memory()
    if need > free:
        raise ConfigError(
            f"{what} needs about {byte_size(need)} of memory for {columns} columns, more than this machine has "
            f"free ({byte_size(free)}); {fewer}."
        )


def check_store(store: Path) -> None:
    """The store folder exists and is writable, or can be created (nothing is created here)."""
    p = Path(store)
    if p.exists() and not p.is_dir():
        raise StoreError(f"Store '{p}' is a file, not a folder; pass --store a folder (it is created if missing).")
    if p.is_dir():
        refused = refuses_new_files(p)
        if refused:
            raise StoreError(
                f"Store folder '{p}' is not writable ({refused}); privflow keeps its ledger, MLflow "
                "database and artifacts there. Make it writable or pass --store another folder."
            )
        for name in ("ledger.db", "mlflow.db"):
            f = p / name
            if f.exists() and not os.access(f, os.R_OK | os.W_OK):
                raise StoreError(
                    f"'{f}' in the store is not readable and writable by this user; fix its permissions or pass "
                    "--store another folder."
                )
        return
    ancestor = existing_ancestor(p)
    if ancestor.exists() and not ancestor.is_dir():
        raise StoreError(
            f"Store '{p}' cannot be created: '{ancestor}' is a file, not a folder. Pass --store a folder path."
        )
    refused = "not writable" if not os.access(ancestor, os.W_OK | os.X_OK) else refuses_new_files(ancestor)
    if refused:  # permission bits pass for root, and /proc or a read-only mount refuse anyway
        raise StoreError(
            f"Store folder '{p}' cannot be created: '{ancestor}' takes no new files ({refused}). Pass --store a "
            "folder you can write to."
        )


def nvidia_driver() -> bool:
    """Whether this Linux machine has an NVIDIA driver loaded (without importing torch)."""
    return sys.platform.startswith("linux") and (
        Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()
    )


def resolve_device(choice: str) -> str:
    """'cpu', 'cuda' or 'auto' -> the device training will use; DeviceUnavailable for missing CUDA.

    Without an NVIDIA driver on the machine, CUDA is absent and torch is not imported (its import
    is a large part of a run's start-up: benchmarks/results/overhead.md); with one, torch decides.
    """
    if choice not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device must be auto, cpu or cuda, got '{choice}'.")
    if choice == "cpu":
        return "cpu"
    driver = nvidia_driver()
    cuda = False
    if driver or "torch" in sys.modules:
        import torch

        cuda = bool(torch.cuda.is_available())
    if choice == "auto":
        return "cuda" if cuda else "cpu"
    if not cuda:
        raise DeviceUnavailable(
            f"--device {choice} was requested, but this machine has no usable CUDA device "
            f"({'the NVIDIA driver is present but torch cannot use it' if driver else 'no NVIDIA driver found'}). "
            "Use --device cpu (or auto, which picks CUDA only when it is there)."
        )
    return "cuda"


def check_workers(workers: int, device: str) -> None:
    """`--workers N` can run here: one GPU per worker on CUDA (NCCL refuses two ranks on one
    device), at most one worker per usable CPU otherwise (more only queue for the same cores),
    and torch.distributed present. Imports torch only when N > 1."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}.")
    if workers == 1:
        return
    import torch.distributed

    if not torch.distributed.is_available():
        raise ConfigError("--workers above 1 needs torch.distributed, which this torch build lacks; use --workers 1.")
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if workers > gpus:
            raise ConfigError(
                f"--workers {workers} on --device cuda needs one GPU per worker, and this machine has {gpus}. "
                f"Use --workers {gpus} or fewer, or --device cpu."
            )
        return
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers > cpus:
        raise ConfigError(
            f"--workers {workers} on the CPU needs one core per worker, and this process may use {cpus}. "
            f"Use --workers {cpus} or fewer (each worker runs train.threads torch threads)."
        )


__all__ = [
    "BYTES_PER_SAMPLED_VALUE",
    "available_memory",
    "check_memory",
    "check_room",
    "check_store",
    "check_workers",
    "existing_ancestor",
    "nvidia_driver",
    "refuses_new_files",
    "resolve_device",
]
