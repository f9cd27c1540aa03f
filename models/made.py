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


class IncrementalMADE:
    """Autoregressive inversion of a MADE at the cost of about one forward pass.

    In pass i of a sequential inversion only output block i is needed, and it depends on
    hidden units of degree <= i, which see inputs x[:i] only. A hidden unit of degree m is
    therefore final once x[:m] is known: pass i computes just the units of degree i (every
    hidden layer) and output block i, instead of the whole network (d full passes). Hidden
    units are reordered by degree so that each pass writes one contiguous slice. Same masked
    weights, so the result equals ``made(x, context)[:, i]`` up to float rounding. Built from
    the current weights: make a new one after the weights change.
    """

    def __init__(self, made: MADE, context: Tensor | None = None) -> None:
        linears = [m for m in made.net if isinstance(m, MaskedLinear)]
        acts = [m for m in made.net if not isinstance(m, MaskedLinear)]
        d = self.d = made.features
        self.p = made.out_per_feature
        self.act = acts[0] if acts else (lambda t: t)
        # degree of each hidden unit, read back from the first mask (inputs it sees)
        deg = linears[0].mask[:, :d].sum(1).long()
        order = torch.argsort(deg, stable=True)
        counts = torch.bincount(deg, minlength=d).tolist()
        bounds = [0]
        for c in counts[:d]:
            bounds.append(bounds[-1] + c)
        self.bounds = bounds  # units of degree i: [bounds[i], bounds[i + 1]) after reordering
        w = [(m.weight * m.mask.to(m.weight)).detach() for m in linears]
        b = [m.bias.detach() for m in linears]
        w = [
            wk[order] if k == 0 else (wk[:, order] if k == len(w) - 1 else wk[order][:, order])
            for k, wk in enumerate(w)
        ]
        b = [bk[order] if k < len(b) - 1 else bk for k, bk in enumerate(b)]
        self.hidden = w[0].shape[0]
        # Everything is kept transposed (features / units first, examples last): each pass
        # then reads and writes contiguous rows, and every product is [k, m] @ [m, n], n large.
        self.w_in = w[0][:, :d].contiguous()  # [hidden, d]
        if context is not None and made.context_features:
            self.base = (context[:1] @ w[0][:, d:].T + b[0]).T.contiguous()  # [hidden, 1]
        else:
            self.base = b[0].reshape(-1, 1)
        self.w_mid = [wk.contiguous() for wk in w[1:-1]]  # [hidden, hidden]
        self.b_mid = [bk.reshape(-1, 1) for bk in b[1:-1]]
        self.w_out = [w[-1][i * self.p : (i + 1) * self.p].contiguous() for i in range(d)]  # [P, hidden]
        self.b_out = [b[-1][i * self.p : (i + 1) * self.p, None] for i in range(d)]  # [P, 1]

    def start(self, n: int, like: Tensor) -> list[Tensor]:
        """Hidden states, transposed (one [hidden, n] per hidden layer), filled pass by pass."""
        return [torch.zeros(self.hidden, n, dtype=like.dtype, device=like.device) for _ in range(1 + len(self.w_mid))]

    def step(self, i: int, x_t: Tensor, hs: list[Tensor]) -> Tensor:
        """Output block i as [out_per_feature, n], given the inputs transposed, x_t [d, n], with
        rows :i final (rows i: are ignored). The context is the same for every example."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        if hi > lo:
            base = self.base[lo:hi]
            pre = torch.addmm(base, self.w_in[lo:hi, :i], x_t[:i]) if i else base.expand(-1, x_t.shape[1])
            hs[0][lo:hi] = self.act(pre)
            for k, (wk, bk) in enumerate(zip(self.w_mid, self.b_mid, strict=True)):
                # units of degree i see units of degree <= i only (the rest of the row is masked)
                hs[k + 1][lo:hi] = self.act(torch.addmm(bk[lo:hi], wk[lo:hi, :hi], hs[k][:hi]))
        h = self.bounds[i + 1]  # output block i sees hidden units of degree <= i only
        return torch.addmm(self.b_out[i], self.w_out[i][:, :h], hs[-1][:h])
