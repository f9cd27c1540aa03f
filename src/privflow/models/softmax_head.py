"""The target head as a torch module: a softmax regression with the flows' training interface.

``log_prob(x)`` on an encoded batch x = [compact features | class index], so that the one
DP-SGD trainer (``privacy.dpsgd.dp_sgd.train``: Poisson sampling, per-example clipping, noise,
EMA) trains it exactly as it trains a flow. The compact features are
``privflow.data.features.compact_features`` (one column per block: a scaled number, a missing flag or
a category's slot index); the one-hot and hat-basis expansion happens per batch inside ``forward``, so a table
of millions of rows is held at about a tenth of the expanded matrix's size. The released head
is its weights in numpy (``privflow.data.target_head.TargetHead``), over the expanded features.
Zero initial weights: the untrained head predicts uniform classes, and its start depends on
nothing but its shape (public).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from privflow.data.features import block_size


class SoftmaxHead(nn.Module):
    """log p(class | features) = log_softmax(expand(compact) @ W^T + b)[class]."""

    def __init__(self, widths: Sequence[int], classes: int) -> None:
        super().__init__()
        self.widths = [int(w) for w in widths]
        self.features = sum(block_size(w) for w in self.widths)
        if self.features < 1 or classes < 2:
            raise ValueError(f"a head needs >= 1 feature and >= 2 classes, got {self.features} and {classes}")
        self.classes = classes
        self.linear = nn.Linear(self.features, classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def expand(self, compact: Tensor) -> Tensor:
        """Compact features [n, blocks] -> the linear layer's input [n, features]: scalar blocks as
        they are (width 0), scalars through an m-knot hat basis (width -m), slot indices one-hot (an
        index equal to the block's width gives zeros), as ``privflow.data.features.expand_features``
        does in numpy."""
        parts = []
        for j, width in enumerate(self.widths):
            column = compact[:, j]
            if width == 0:
                parts.append(column[:, None])
            elif width < 0:
                centres = torch.linspace(0.0, 1.0, -width, dtype=compact.dtype, device=compact.device)
                z = column.clamp(0.0, 1.0)[:, None]
                parts.append((1.0 - (z - centres).abs() * (-width - 1)).clamp_(min=0.0))
            else:
                slots = torch.zeros(column.shape[0], width + 1, dtype=compact.dtype, device=compact.device)
                parts.append(slots.scatter_(1, column.long()[:, None], 1.0)[:, :width])
        return torch.cat(parts, dim=1)

    def log_prob(self, x: Tensor) -> Tensor:
        """[n] log-probability of each row's class (last column) given its compact features."""
        blocks = len(self.widths)
        logp = torch.log_softmax(self.linear(self.expand(x[:, :blocks])), dim=1)
        return logp.gather(1, x[:, blocks:].long())[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        return self.log_prob(x)


__all__ = ["SoftmaxHead"]
