"""The target head as a torch module: a softmax regression with the flows' training interface.

``log_prob(x)`` on an encoded batch x = [features (p columns) | class index], so that the one
DP-SGD trainer (``privacy.dp_sgd.train``: Poisson sampling, per-example clipping, noise,
EMA) trains it exactly as it trains a flow. The released head is its weights in numpy
(``privflow.target_head.TargetHead``). Zero initial weights: the untrained head predicts
uniform classes, and its start depends on nothing but its shape (public).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class SoftmaxHead(nn.Module):
    """log p(class | features) = log_softmax(features @ W^T + b)[class]."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        if features < 1 or classes < 2:
            raise ValueError(f"a head needs >= 1 feature and >= 2 classes, got {features} and {classes}")
        self.features = features
        self.classes = classes
        self.linear = nn.Linear(features, classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def log_prob(self, x: Tensor) -> Tensor:
        """[n] log-probability of each row's class (last column) given its features."""
        logp = torch.log_softmax(self.linear(x[:, : self.features]), dim=1)
        return logp.gather(1, x[:, self.features :].long())[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        return self.log_prob(x)


__all__ = ["SoftmaxHead"]
