"""train: DP-SGD / DP-Adam with Poisson sampling on the flow, with a progress bar; in one process,
or data-parallel over `train.workers` processes under torchrun (privacy/dpsgd/distributed.py), the same
trainer and the same privacy event either way. It reports the start of each epoch to a
watcher (privflow/core/events.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from privflow.core import events
from privflow.core.config import TrainConfig
from privflow.data.chunked import DiskRows
from privflow.privacy.accounting.events import PoissonGaussianEvent
from privflow.privacy.accounting.plan import SGDShape, StagePlan
from privflow.privacy.dpsgd.distributed import train_data_parallel
from privflow.privacy.dpsgd.dp_sgd import TrainResult, TrainSettings, train


def settings_for(cfg: TrainConfig, stage: StagePlan | None, shape: SGDShape | None = None) -> TrainSettings:
    """Trainer settings from the config and the planned DP-SGD event; with no stage, the
    non-private reference run of the same `shape` (no clipping, no noise)."""
    if stage is None:
        assert shape is not None, "a non-private run needs the planned shape"
        sample_rate, steps, noise, private = shape.sample_rate, shape.steps, 0.0, False
    else:
        event = stage.event
        if not isinstance(event, PoissonGaussianEvent):
            raise TypeError(f"the train stage must plan a PoissonGaussianEvent, got {event!r}")
        sample_rate, steps, noise, private = event.sample_rate, event.steps, event.noise_multiplier, True
    return TrainSettings(
        sample_rate=sample_rate,
        steps=steps,
        noise_multiplier=noise,
        max_grad_norm=cfg.max_grad_norm,
        clipping=cfg.clipping,
        sparsity=cfg.sparsity,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        checkpoint_every=cfg.checkpoint_every,
        ema_decay=cfg.ema_decay,
        expected_batch_size=float(cfg.batch_size),
        device=cfg.device,  # resolved by the trainer (privacy/dp_sgd.resolve_device)
        seed=cfg.seed,
        private=private,
        workers=cfg.workers,
    )


def train_flow_model(
    model: torch.nn.Module, x: np.ndarray | DiskRows, settings: TrainSettings, show_progress: bool = True
) -> TrainResult:
    """Run exactly the planned number of DP steps; checkpoints every k steps. With
    ``settings.workers > 1`` the steps run data-parallel in worker processes (the rows pass
    through an owner-only temporary folder that is removed afterwards)."""
    # rows on disk (a streamed run, privflow/data/chunked.py) stay there: each step gathers its sample
    data: Any = x if isinstance(x, DiskRows) else torch.as_tensor(x, dtype=torch.float32)
    columns = [
        TextColumn("[bold]DP training" if settings.private else "[bold]Training (not private)"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        bar = progress.add_task("train", total=settings.steps, loss=float("nan"))

        def on_step(step: int, loss: float) -> None:
            progress.update(bar, completed=step, loss=loss)
            following = epoch_of(step + 1, settings.sample_rate)
            if step < settings.steps and following > epoch_of(step, settings.sample_rate):
                events.report(f"epoch {following}")  # the next step starts it

        events.report("epoch 1")  # to a watcher (core/events.py): training has started
        if settings.workers > 1:
            return train_data_parallel(model, data, settings, on_step)
        return train(model, data, settings, on_step=on_step)


def epoch_of(step: int, sample_rate: float) -> int:
    """The epoch (from 1) that DP-SGD step `step` (from 1) belongs to: an epoch is 1 / sample_rate
    steps, the steps that sample as many rows as the table holds in expectation. At most one
    epoch begins per step (sample_rate <= 1), so each is reported once (core/events.py)."""
    return math.floor((step - 1) * sample_rate) + 1


@contextmanager
def cpu_threads(threads: int) -> Iterator[None]:
    """Run a block with `threads` torch intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
