"""The events a run reports to a watcher (privflow/core/events.py): one line each in the file
PRIVFLOW_EVENTS names, nothing without it; the hold PRIVFLOW_EVENTS_HOLD names; and the trainer's
"epoch k" lines, each epoch once, at its start (tasks/train.py). A real run's events, and signals
sent on them, are tested through `privflow run` in tests/cli/test_bad_inputs.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from privflow.core import events
from privflow.privacy.dpsgd.dp_sgd import TrainResult, TrainSettings
from privflow.tasks import train as train_task


@pytest.fixture()
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events"
    monkeypatch.setenv(events.EVENTS_ENV, str(path))
    monkeypatch.delenv(events.HOLD_ENV, raising=False)
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_without_the_variable_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(events.EVENTS_ENV, raising=False)
    monkeypatch.delenv(events.HOLD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    events.report("epoch 1")
    assert list(tmp_path.iterdir()) == []


def test_each_event_is_one_line_appended_in_order(log: Path) -> None:
    log.write_text("reserved earlier\n")  # appended to, never truncated
    events.report("reserved r-1")
    events.report("epoch\n2 ")  # whitespace inside an event cannot split its line
    assert _lines(log) == ["reserved earlier", "reserved r-1", "epoch 2"]


def test_a_file_that_cannot_be_written_never_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(events.EVENTS_ENV, str(tmp_path))  # a folder: open() fails
    monkeypatch.delenv(events.HOLD_ENV, raising=False)
    events.report("epoch 1")
    assert list(tmp_path.iterdir()) == []


def test_the_hold_waits_at_the_named_event_only(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[str] = []
    monkeypatch.setattr(events, "_hold", lambda: held.append(_lines(log)[-1]))
    monkeypatch.setenv(events.HOLD_ENV, "epoch 2")
    for event in ("reserved r-1", "epoch 1", "epoch 2", "epoch 3"):
        events.report(event)
    assert held == ["epoch 2"]  # after its line is written: a watcher that sees the line finds the run held


@pytest.mark.parametrize(("sample_rate", "steps"), [(1.0, 3), (0.25, 10), (0.3, 17), (0.07, 50), (0.5, 1), (0.5, 0)])
def test_the_trainer_reports_each_epoch_once_at_its_start(
    log: Path, monkeypatch: pytest.MonkeyPatch, sample_rate: float, steps: int
) -> None:
    """Steps run by a stand-in trainer: each "epoch k" line comes before the first step of epoch k."""
    ran: list[tuple[int, int]] = []  # (step, lines written before it)

    def fake_train(model, data, settings, on_step):  # noqa: ANN001, ANN202
        for step in range(1, settings.steps + 1):
            ran.append((step, len(_lines(log))))
            on_step(step, 0.0)
        return TrainResult(event=None)

    monkeypatch.setattr(train_task, "train", fake_train)
    settings = TrainSettings(sample_rate=sample_rate, steps=steps, noise_multiplier=1.0, max_grad_norm=1.0)
    train_task.train_flow_model(torch.nn.Linear(2, 2), np.zeros((4, 2), np.float32), settings, False)
    epochs = [train_task.epoch_of(step, sample_rate) for step in range(1, steps + 1)]
    last = epochs[-1] if epochs else 1
    assert _lines(log) == [f"epoch {k}" for k in range(1, last + 1)]
    for step, before in ran:  # epoch k's line is the k-th: written before its first step, not after
        assert before == train_task.epoch_of(step, sample_rate)
