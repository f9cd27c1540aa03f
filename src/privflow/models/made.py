"""MADE: masked autoencoder for distribution estimation (Germain et al. 2015).

Output block i (the parameters of dimension i) depends only on inputs x[:i] in the
ordering x[0] < x[1] < ... < x[d-1]. An optional context vector (DP-HFlow's block embedding
q(j), "Conditional Spline Flow") is connected to every hidden unit of the first layer, so one
network serves all blocks. Built only from ``MaskedLinear`` so per-example gradients have a
grad sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

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
        output = MaskedLinear(hidden, features * out_per_feature, (out_deg[:, None] > h_deg[None, :]).float())
        layers += [act(), output]
        self.net = nn.Sequential(*layers)
        if zero_init_output:
            with torch.no_grad():
                output.weight.zero_()
                output.bias.zero_()

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if self.context_features:
            if context is None:
                raise ValueError("this MADE needs a context input")
            x = torch.cat([x, context], dim=1)
        out = self.net(x)
        return out.reshape(x.shape[0], self.features, self.out_per_feature)


def _in_place(act: nn.Module | None) -> Callable[[Tensor], Tensor]:
    """The activation applied in place (the hidden states live in preallocated buffers)."""
    if act is None:
        return lambda t: t
    if isinstance(act, nn.ReLU):
        return torch.relu_
    if isinstance(act, nn.Tanh):
        return torch.tanh_
    if isinstance(act, nn.ELU):
        return lambda t: F.elu_(t, act.alpha)
    return lambda t: t.copy_(act(t))


class IncrementalMADE:
    """Autoregressive inversion of a MADE at the cost of about one forward pass.

    In pass i of a sequential inversion only output block i is needed, and it depends on
    hidden units of degree <= i, which see inputs x[:i] only. A hidden unit of degree m is
    therefore final once x[:m] is known: pass i computes just the units of degree i (every
    hidden layer) and output block i, instead of the whole network (d full passes). Hidden
    units are reordered by degree so that each pass writes one contiguous slice.

    Everything is transposed (features / units first, examples last: each pass reads and writes
    contiguous rows, and every product is [k, m] @ [m, n], n large) and augmented by a leading
    row of ones, so that each layer of a pass is one matrix product written straight into its
    buffer with the bias as the first weight column (no bias broadcast, no temporary). Same
    masked weights, so outputs equal ``made(x, context)[:, i]`` up to float rounding. Built from
    the current weights: make a new one after the weights change.

    ``contexts`` [c, context_features]: one first-layer bias per context row (DP-HFlow's block
    embeddings), picked by ``step(..., context=j)``. ``out_rows``: the rows of a pass's output,
    each (index of the block's output unit or -1 for none, scale, offset): row = scale * unit +
    offset, folded into the last layer (default: the block's units in order, unscaled).
    """

    def __init__(
        self,
        made: MADE,
        contexts: Tensor | None = None,
        out_rows: Sequence[tuple[int, float, float]] | None = None,
    ) -> None:
        linears = [m for m in made.net if isinstance(m, MaskedLinear)]
        acts = [m for m in made.net if not isinstance(m, MaskedLinear)]
        d = self.d = made.features
        p = made.out_per_feature
        self.act = _in_place(acts[0] if acts else None)
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
        if made.context_features:
            if contexts is None:
                raise ValueError("this MADE needs a context input")
            first_bias = contexts.detach() @ w[0][:, d:].T + b[0]  # [c, hidden]
        else:
            first_bias = b[0][None]
        self.w_in = [torch.cat([fb[:, None], w[0][:, :d]], dim=1) for fb in first_bias]  # [hidden, 1 + d]
        self.w_mid = [torch.cat([bk[:, None], wk], dim=1) for wk, bk in zip(w[1:-1], b[1:-1], strict=True)]
        rows = [(r, 1.0, 0.0) for r in range(p)] if out_rows is None else list(out_rows)
        w_out = torch.cat([b[-1][:, None], w[-1]], dim=1).view(d, p, -1)  # [d, p, 1 + hidden]
        w_out = torch.cat([w_out, torch.zeros_like(w_out[:, :1])], dim=1)  # unit p: a row of zeros
        unit = torch.tensor([p if r < 0 else r for r, _, _ in rows], device=w_out.device)
        scale = torch.tensor([sc for _, sc, _ in rows]).to(w_out)[:, None]
        w_out = w_out[:, unit] * scale
        w_out[:, :, 0] += torch.tensor([sh for _, _, sh in rows]).to(w_out)  # times the row of ones
        self.w_out = list(w_out.unbind())  # [len(out_rows), 1 + hidden] per block

    def start(self, n: int, like: Tensor, out: Tensor) -> Tensor:
        """Buffers of one inversion of n examples; returns the inputs x_a [1 + d, n] (row 0 = 1;
        pass i reads rows 1 .. i, the caller writes row 1 + i after it). Every pass writes its
        output block into ``out`` [len(out_rows), n]. The hidden states, [1 + hidden, n] per
        hidden layer with row 0 = 1, are filled pass by pass; each pass's slices of weights and
        buffers are made here once (a slice costs about as much as a small product's launch)."""
        bufs = [
            torch.empty(1 + size, n, dtype=like.dtype, device=like.device)
            for size in [self.d] + [self.hidden] * (1 + len(self.w_mid))
        ]
        for t in bufs:
            t[0] = 1.0
        x_a, hs = bufs[0], bufs[1:]
        self.passes = []
        for i in range(self.d):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            # units of degree i see inputs x[:i], then units of degree <= i only (none: hi == lo)
            first = ([w[lo:hi, : 1 + i] for w in self.w_in], x_a[: 1 + i], hs[0][1 + lo : 1 + hi])
            mid = [(w[lo:hi, : 1 + hi], hs[k][: 1 + hi], hs[k + 1][1 + lo : 1 + hi]) for k, w in enumerate(self.w_mid)]
            # output block i sees hidden units of degree <= i only
            last = (self.w_out[i][:, : 1 + hi], hs[-1][: 1 + hi], out)
            self.passes.append((hi > lo, first, mid, last))
        return x_a

    def step(self, i: int, context: int = 0) -> Tensor:
        """Output block i into ``start``'s out, once x_a's rows 1 .. i are final."""
        units, (w_in, x, h), mid, (w, h_last, out) = self.passes[i]
        if units:
            self.act(torch.mm(w_in[context], x, out=h))
            for w_k, h_in, h_out in mid:
                self.act(torch.mm(w_k, h_in, out=h_out))
        return torch.mm(w, h_last, out=out)
