"""Exponential moving average of the parameters (Polyak averaging) over DP-SGD iterates.

Why: each DP step moves the weights by a noisy gradient, so the last iterate (and any one
checkpoint) carries the noise of the last few hundred steps; checkpoints of the same run then
differ by more than the gap between methods, and Report-Noisy-Max chooses among them almost
at random. The average of the iterates keeps the trend and cancels much of the noise
(Polyak & Juditsky 1992; for DP training: De et al. 2022, "Unlocking High-Accuracy
Differentially Private Image Classification through Scale", section 3.2, which reports EMA
as one of the largest single gains; Li et al.'s review lists it among the standard
ingredients). It reads only the released-by-construction noisy iterates, so it is
post-processing: no privacy cost, no change to the event.

The decay warms up as min(decay, (1 + t) / (10 + t)) so that early averages are not
dominated by the random initialisation (the schedule TensorFlow's ExponentialMovingAverage
uses with ``num_updates``). Buffers (e.g. activation-norm statistics) are copied, not
averaged: they are set once before training and never stepped.
"""

from __future__ import annotations

import torch
from torch import nn


class ParameterAverage:
    """EMA of a model's trainable parameters; `state_dict()` is the model's state with them swapped in."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay}")
        self.model = model
        self.decay = float(decay)
        self.updates = 0
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def rate(self) -> float:
        """The decay used at the next update (warm-up schedule, module docstring)."""
        return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """Fold the model's current parameters into the average (call after every optimizer step)."""
        d = self.rate()
        for n, p in self.model.named_parameters():
            if n in self.shadow:
                self.shadow[n].mul_(d).add_(p.detach(), alpha=1.0 - d)
        self.updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the model's state with the averaged parameters in place of the current ones."""
        out = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        for n, v in self.shadow.items():
            out[n] = v.detach().to("cpu", copy=True)
        return out


__all__ = ["ParameterAverage"]
