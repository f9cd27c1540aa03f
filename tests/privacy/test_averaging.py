"""Parameter averaging: the EMA recursion with its warm-up, and checkpoints that hold it."""

from __future__ import annotations

import pytest
import torch

from privflow.privacy.dpsgd.averaging import ParameterAverage
from privflow.privacy.dpsgd.dp_sgd import train
from tests.privacy.test_dp_sgd import data, settings
from tests.privacy.test_grad_samplers import TinyFlow


def test_average_follows_the_warmed_up_recursion() -> None:
    lin = torch.nn.Linear(3, 2)
    lin.register_buffer("stat", torch.ones(2))
    avg = ParameterAverage(lin, decay=0.9)
    expected = {n: p.detach().clone() for n, p in lin.named_parameters()}
    g = torch.Generator().manual_seed(0)
    for t in range(30):
        with torch.no_grad():
            for p in lin.parameters():
                p.add_(torch.randn(p.shape, generator=g))
            lin.stat.fill_(float(t))
        d = min(0.9, (1 + t) / (10 + t))
        assert avg.rate() == pytest.approx(d)
        avg.update()
        for n, p in lin.named_parameters():
            expected[n] = d * expected[n] + (1 - d) * p.detach()
    state = avg.state_dict()
    for n in expected:
        assert torch.allclose(state[n], expected[n], atol=1e-6)
        assert not torch.allclose(state[n], dict(lin.named_parameters())[n])
    assert torch.equal(state["stat"], lin.stat)  # buffers are copied, not averaged


def test_decay_outside_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="decay"):
        ParameterAverage(torch.nn.Linear(2, 2), 1.0)


def test_checkpoints_hold_the_average_and_zero_decay_keeps_the_iterates() -> None:
    x = data()
    raw_model, avg_model = TinyFlow(4), TinyFlow(4)
    avg_model.load_state_dict(raw_model.state_dict())
    raw = train(raw_model, x, settings(noise_seed=3, ema_decay=0.0))
    avg = train(avg_model, x, settings(noise_seed=3, ema_decay=0.5))
    # same seeds, same iterates: the raw run's last checkpoint is the live model of both runs
    for k, v in raw.checkpoints[-1][1].items():
        assert torch.allclose(v, avg_model.state_dict()[k])
        assert torch.allclose(v, raw_model.state_dict()[k])
    differs = [not torch.allclose(avg.checkpoints[-1][1][k], v) for k, v in raw.checkpoints[-1][1].items()]
    assert any(differs)
    assert [s for s, _ in avg.checkpoints] == [s for s, _ in raw.checkpoints]
    assert avg.event == raw.event  # post-processing: the same privacy event
