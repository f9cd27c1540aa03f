"""MADE: masked autoencoder for distribution estimation (Germain et al. 2015).

Output block i (the parameters of dimension i) depends only on inputs x[:i] in the
ordering x[0] < x[1] < ... < x[d-1]. An optional context vector (DP-HFlow's block embedding
q(j), "Conditional Spline Flow") is connected to every hidden unit of the first layer, so one
network serves all blocks. Built only from ``MaskedLinear`` so per-example gradients have a
grad sampler.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from privflow.models.layers import MaskedLinear

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def hidden_degrees(features: int, hidden: int, context: bool = False) -> Tensor:
    """Deterministic hidden degrees cycled over the units.

    Without context: 1..d-1 (0 when d = 1). With context: 0..d-1, where degree-0 units see
    only the context; they are what lets the first dimension's output depend on the context
    (with degrees >= 1 only, output 1 would be a constant bias, unconditioned on q(j)).
    """
    if features == 1:
        return torch.zeros(hidden, dtype=torch.long)
    if context:
        return torch.arange(hidden) % features
    return torch.arange(hidden) % (features - 1) + 1


class MADE(nn.Module):
    """Autoregressive network x[n, d] (+ context[n, c]) -> parameters [n, d, out_per_feature].

    Masks (Germain et al. eq. 12-13): hidden unit of degree m sees inputs with degree <= m;
    output of dimension i (degree i) sees hidden units with degree < i. Context columns are
    unmasked. ``zero_init_output`` starts the flow at the identity (zero raw parameters).
    """

    def __init__(
        self,
        features: int,
        hidden: int,
        out_per_feature: int,
        context_features: int = 0,
        hidden_layers: int = 2,
        activation: str = "relu",
        zero_init_output: bool = True,
    ) -> None:
        super().__init__()
        if hidden_layers < 1:
            raise ValueError("MADE needs at least one hidden layer")
        self.features = features
        self.out_per_feature = out_per_feature
        self.context_features = context_features
        in_deg = torch.arange(1, features + 1)
        h_deg = hidden_degrees(features, hidden, context_features > 0)

        first = (h_deg[:, None] >= in_deg[None, :]).float()
        if context_features:
            first = torch.cat([first, torch.ones(hidden, context_features)], dim=1)
        layers: list[nn.Module] = [MaskedLinear(features + context_features, hidden, first)]
        act = _ACTIVATIONS[activation]
        for _ in range(hidden_layers - 1):
            layers += [act(), MaskedLinear(hidden, hidden, (h_deg[:, None] >= h_deg[None, :]).float())]
        out_deg = in_deg.repeat_interleave(out_per_feature)  # feature-major: unit k -> feature k // P
        layers += [act(), MaskedLinear(hidden, features * out_per_feature, (out_deg[:, None] > h_deg[None, :]).float())]
        self.net = nn.Sequential(*layers)
        if zero_init_output:
            with torch.no_grad():
                self.net[-1].weight.zero_()
                self.net[-1].bias.zero_()

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if self.context_features:
            if context is None:
                raise ValueError("this MADE needs a context input")
            x = torch.cat([x, context], dim=1)
        out = self.net(x)
        return out.reshape(x.shape[0], self.features, self.out_per_feature)
