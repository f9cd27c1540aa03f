"""Per-example gradients of the flow layers against torch.func (vmap of grad), in float64.

Covers each grad sampler (MaskedLinear, LULinear eq. 3, LowRankLinear eq. 4, ActNorm,
BlockEmbedding), a layer used 1 or 3 times in one forward (the shared MADE case: the
per-example gradient is the sum over uses), the log-determinant output, the fast ghost ops
(squared norms, per-row stats, weighted sums), opacus' own hooks on a shared layer, and the
torch.func fallback for a layer with no grad sampler.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from privflow.models.layers import ActNorm, BlockEmbedding, LowRankLinear, LULinear, MaskedLinear
from privflow.privacy.dpsgd.clipping.per_unit import row_stats
from privflow.privacy.dpsgd.grad_samplers import GHOST_OPS, Tape, materialise

torch.set_num_threads(1)
DT = torch.float64
TOL = 1e-6


# ---------------------------------------------------------------- a small flow with every layer type
def made_masks(d: int, e: int, hidden: int, out_per_dim: int) -> tuple[Tensor, Tensor]:
    """MADE masks (Germain et al. 2015): inputs z (degrees 1..d) and a block embedding (degree 0)."""
    deg_in = torch.cat([torch.arange(1, d + 1), torch.zeros(e, dtype=torch.long)])
    deg_h = torch.arange(hidden) % max(1, d - 1) + 1
    deg_out = torch.arange(1, d + 1).repeat_interleave(out_per_dim)
    return (deg_h[:, None] >= deg_in[None, :]).float(), (deg_out[:, None] > deg_h[None, :]).float()


class TinyFlow(nn.Module):
    """ActNorm, then per block: LU linear, an affine MADE shared by all blocks and conditioned
    on a block embedding; then a low-rank linear map and an nn.Linear perturbation."""

    def __init__(self, d: int = 4, hidden: int = 8, blocks: int = 3, e: int = 2, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.d, self.blocks = d, blocks
        self.act = ActNorm(d)
        self.emb = BlockEmbedding(blocks, e)
        m1, m2 = made_masks(d, e, hidden, 2)
        self.made = nn.ModuleList([MaskedLinear(d + e, hidden, m1), MaskedLinear(hidden, 2 * d, m2)])
        self.lus = nn.ModuleList([LULinear(d, seed=j) for j in range(blocks)])
        self.low = LowRankLinear(d, rank=1)
        self.head = nn.Linear(d, d)
        with torch.no_grad():  # move every parameter off its (often zero) initial value
            for p in self.parameters():
                p.add_(0.3 * torch.randn_like(p))

    def log_prob(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        z, total = self.act(x)
        for j in range(self.blocks):
            z, ld = self.lus[j](z)
            total = total + ld
            q = self.emb(torch.full((n,), j, dtype=torch.long, device=x.device))
            h = torch.tanh(self.made[0](torch.cat([z, q], 1)))
            out = self.made[1](h).reshape(n, self.d, 2)
            s = torch.tanh(out[..., 0])
            z = z * torch.exp(s) + out[..., 1]
            total = total + s.sum(1)
        z, ld = self.low(z)
        z = z + 0.1 * torch.tanh(self.head(z))
        return total + ld - 0.5 * (z**2).sum(1) - 0.5 * self.d * math.log(2 * math.pi)


class _LogProb(nn.Module):
    """Wraps a model so that torch.func.functional_call can call its log_prob."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.log_prob(x)


def func_per_example(model: nn.Module, x: Tensor) -> dict[str, Tensor]:
    """Independent reference: vmap over examples of grad of -log_prob(x_i)."""
    wrap = _LogProb(model)
    params = {k: v.detach() for k, v in wrap.named_parameters()}
    per = vmap(grad(lambda p, xi: -functional_call(wrap, p, (xi[None],)).sum()), in_dims=(None, 0))(params, x)
    return {k[len("model.") :]: v for k, v in per.items()}


# ---------------------------------------------------------------- single layers used `uses` times
class Harness(nn.Module):
    """Applies ``layer`` `uses` times, chained, with a smooth per-example loss that also uses the logdets."""

    def __init__(self, layer: nn.Module, uses: int, d_in: int, d_out: int, seed: int) -> None:
        super().__init__()
        self.layer, self.uses = layer, uses
        g = torch.Generator().manual_seed(seed)
        self.back = torch.randn(d_out, d_in, generator=g, dtype=DT) / math.sqrt(d_out)  # feeds output to next use
        self.c = torch.randn(d_out, generator=g, dtype=DT)
        self.cld = float(torch.randn((), generator=g))

    def log_prob(self, x: Tensor) -> Tensor:
        total = torch.zeros(x.shape[0], dtype=x.dtype)
        h = x
        for _ in range(self.uses):
            out = self.layer(h)
            if isinstance(out, tuple):
                out, ld = out
                total = total + self.cld * ld
            total = total + (self.c * torch.sin(out)).sum(1)
            h = torch.tanh(out) @ self.back + x
        return total


def _random_mask(out: int, inp: int, g: torch.Generator, structured: bool) -> Tensor:
    if structured:  # MADE-like: few distinct rows
        deg_in = torch.randint(0, 3, (inp,), generator=g)
        deg_out = torch.randint(0, 4, (out,), generator=g)
        return (deg_out[:, None] > deg_in[None, :]).float()
    return (torch.rand(out, inp, generator=g) < 0.6).float()


def build(kind: str, seed: int) -> tuple[nn.Module, int, int]:
    g = torch.Generator().manual_seed(seed)
    d_in = int(torch.randint(2, 7, (1,), generator=g))
    d_out = int(torch.randint(2, 7, (1,), generator=g))
    if kind in ("masked", "masked_made"):
        layer: nn.Module = MaskedLinear(d_in, d_out, _random_mask(d_out, d_in, g, kind == "masked_made"))
    elif kind == "linear":
        layer = nn.Linear(d_in, d_out)
    elif kind == "lu":
        layer, d_out = LULinear(d_in, seed=seed), d_in
    elif kind == "lowrank":
        layer, d_out = LowRankLinear(d_in, rank=1 + seed % 2, seed=seed), d_in
    elif kind == "actnorm":
        layer, d_out = ActNorm(d_in), d_in
    else:
        raise AssertionError(kind)
    layer = layer.to(DT)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=DT))
    return layer, d_in, d_out


def tape_calls(model: nn.Module, layer: nn.Module, x: Tensor):
    with Tape([layer]) as tape:
        loss = -model.log_prob(x)
        tape.backward(loss.sum())
    return tape.calls[layer]


KINDS = ["masked", "masked_made", "linear", "lu", "lowrank", "actnorm"]


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch"])
@pytest.mark.parametrize("uses", [1, 3])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", KINDS)
def test_grad_sampler_matches_torch_func(
    kind: str, seed: int, uses: int, kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-example gradients, ghost norms, row statistics and weighted sums against torch.func,
    with the fused CPU kernels and without them (``torch``: the operations CUDA runs)."""
    from privflow.privacy.dpsgd import cpu_kernels

    if not kernels:
        monkeypatch.setattr(cpu_kernels, "usable", lambda *tensors: False)
    layer, d_in, d_out = build(kind, seed)
    model = Harness(layer, uses, d_in, d_out, seed)
    n = 3 + seed
    x = torch.randn(n, d_in, dtype=DT, generator=torch.Generator().manual_seed(100 + seed))
    ref = func_per_example(model, x)
    calls = tape_calls(model, layer, x)
    assert len(calls) == uses
    got = materialise(layer, calls)
    for name, p in layer.named_parameters():
        torch.testing.assert_close(got[p], ref[f"layer.{name}"], atol=TOL, rtol=TOL)

    ops = GHOST_OPS.get(type(layer))
    if ops is None:
        return
    assert ops.applicable(layer, calls)
    sq = ops.sq_norms(layer, calls)
    for name, p in layer.named_parameters():
        r = ref[f"layer.{name}"].reshape(n, -1).pow(2).sum(1)
        torch.testing.assert_close(sq[p], r, atol=TOL, rtol=TOL)
    stats = ops.unit_stats(layer, calls)
    whole = ops.materialise(layer, calls)
    part = ops.materialise(layer, calls, slice(1, 3))
    for name, p in layer.named_parameters():
        r = ref[f"layer.{name}"]
        l1, s2 = row_stats(r)
        torch.testing.assert_close(stats[p][0], l1, atol=TOL, rtol=TOL)
        torch.testing.assert_close(stats[p][1], s2, atol=TOL, rtol=TOL)
        torch.testing.assert_close(whole[p], r, atol=TOL, rtol=TOL)
        torch.testing.assert_close(part[p], r[1:3], atol=TOL, rtol=TOL)
    _check_free_entries(ops, layer, calls, ref, n)
    g = torch.Generator().manual_seed(seed)
    for per_row in (False, True):
        weights = {
            p: torch.rand((n, p.shape[0]) if per_row else (n,), generator=g, dtype=DT) for p in layer.parameters()
        }
        ws = ops.weighted_sum(layer, calls, weights)
        for name, p in layer.named_parameters():
            r = ref[f"layer.{name}"]
            w = weights[p]
            expect = (r * w.reshape(w.shape + (1,) * (r.dim() - w.dim()))).sum(0)
            torch.testing.assert_close(ws[p], expect, atol=TOL, rtol=TOL)


def _check_free_entries(ops, layer: nn.Module, calls, ref: dict[str, Tensor], n: int) -> None:
    """free_entries, put back at free_index parameter by parameter, is the whole per-example
    gradient: every entry it leaves out is structurally zero."""
    index = ops.free_index(layer)
    free = ops.free_entries(layer, calls, slice(0, n))
    start = 0
    for name, p in layer.named_parameters():
        idx = index[p] if index[p] is not None else torch.arange(p.numel())
        part = free[:, start : start + idx.numel()]
        full = torch.zeros(n, p.numel(), dtype=DT).index_copy_(1, idx, part)
        torch.testing.assert_close(full.reshape(ref[f"layer.{name}"].shape), ref[f"layer.{name}"], atol=TOL, rtol=TOL)
        start += idx.numel()
    assert free.shape == (n, start)


def _made_mask(d_in: int, groups: int, rows: int, runs: bool, g: torch.Generator) -> Tensor:
    """A MADE-style mask (nested rows) whose groups of equal rows have `rows` rows each, as
    consecutive runs (MADE's feature-major output layer) or interleaved (its hidden layers)."""
    deg_in = torch.randint(0, groups, (d_in,), generator=g)
    deg_out = torch.arange(groups).repeat_interleave(rows) if runs else torch.arange(groups).repeat(rows)
    return (deg_out[:, None] >= deg_in[None, :]).float()


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch"])
@pytest.mark.parametrize("uses", [1, 3])
@pytest.mark.parametrize("runs", [True, False])
def test_masked_staircase_ops_match_torch_func(
    runs: bool, uses: int, kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups of >= 8 equal mask rows: per-row statistics and free entries are formed row by
    row on the staircase columns in the fused CPU kernels, or (``torch``: the path CUDA takes)
    group by group (``linear._staircase_slabs``), group sums by reshape when the groups are
    runs; all against torch.func."""
    from privflow.privacy.dpsgd import cpu_kernels
    from privflow.privacy.dpsgd.grad_samplers.linear import _STAIRCASE_MIN_ROWS, mask_layout

    if not kernels:
        monkeypatch.setattr(cpu_kernels, "usable", lambda *tensors: False)

    g = torch.Generator().manual_seed(3)
    d_in, groups, rows = 7, 4, _STAIRCASE_MIN_ROWS + 1
    mask = _made_mask(d_in, groups, rows, runs, g)
    layer = MaskedLinear(d_in, groups * rows, mask).to(DT)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=DT))
    layout = mask_layout(layer, layer.mask)
    assert layout.cols is not None and bool(layout.run) == runs
    assert GHOST_OPS[MaskedLinear]._layout(layer) is layout  # the staircase path is the one tested
    model = Harness(layer, uses, d_in, groups * rows, 3)
    n = 6
    x = torch.randn(n, d_in, dtype=DT, generator=g)
    ref = func_per_example(model, x)
    calls = tape_calls(model, layer, x)
    ops = GHOST_OPS[MaskedLinear]
    sq = ops.sq_norms(layer, calls)
    stats = ops.unit_stats(layer, calls)
    for name, p in layer.named_parameters():
        r = ref[f"layer.{name}"]
        torch.testing.assert_close(sq[p], r.reshape(n, -1).pow(2).sum(1), atol=TOL, rtol=TOL)
        l1, s2 = row_stats(r)
        torch.testing.assert_close(stats[p][0], l1, atol=TOL, rtol=TOL)
        torch.testing.assert_close(stats[p][1], s2, atol=TOL, rtol=TOL)
    _check_free_entries(ops, layer, calls, ref, n)


@pytest.mark.parametrize("seed", range(3))
def test_block_embedding_both_call_forms(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    blocks, dim, n = 2 + seed, 3, 5

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = BlockEmbedding(blocks, dim).to(DT)
            self.idx = torch.randint(0, blocks, (n,), generator=g)

        def log_prob(self, x: Tensor) -> Tensor:
            total = (torch.sin(self.emb(self.idx) * x)).sum(1)
            for j in range(blocks):  # the int form, called once per block
                total = total + (torch.tanh(self.emb(j, x.shape[0]) * x) * (j + 1)).sum(1)
            return total

    model = Model()
    x = torch.randn(n, dim, dtype=DT, generator=g)
    # reference per example with the matching index row
    ref = torch.stack([func_per_example(_IndexFix(model, i), x[i : i + 1])["emb.weight"][0] for i in range(n)])
    calls = tape_calls(model, model.emb, x)
    assert len(calls) == blocks + 1
    torch.testing.assert_close(materialise(model.emb, calls)[model.emb.weight], ref, atol=TOL, rtol=TOL)
    # the fast clipping ops, every call form at once (calls land in the same and in other rows)
    ops, w = GHOST_OPS[BlockEmbedding], model.emb.weight
    assert ops.applicable(model.emb, calls)
    torch.testing.assert_close(ops.sq_norms(model.emb, calls)[w], ref.pow(2).sum((1, 2)), atol=TOL, rtol=TOL)
    l1, s2 = row_stats(ref)
    torch.testing.assert_close(ops.unit_stats(model.emb, calls)[w][0], l1, atol=TOL, rtol=TOL)
    torch.testing.assert_close(ops.unit_stats(model.emb, calls)[w][1], s2, atol=TOL, rtol=TOL)
    weight = torch.rand(n, generator=g, dtype=DT)
    rows = torch.rand(n, blocks, generator=g, dtype=DT)
    for by in (weight, rows):  # one weight per example, then per example and row
        want = (ref * by.reshape(by.shape + (1,) * (ref.dim() - by.dim()))).sum(0)
        torch.testing.assert_close(ops.weighted_sum(model.emb, calls, {w: by})[w], want, atol=TOL, rtol=TOL)


class _IndexFix(nn.Module):
    """The BlockEmbedding model restricted to example i (so vmap sees that example's index)."""

    def __init__(self, model: nn.Module, i: int) -> None:
        super().__init__()
        self.emb = model.emb
        self.idx = model.idx[i : i + 1]  # a plain tensor: the model itself is not a submodule

    def log_prob(self, x: Tensor) -> Tensor:
        blocks = self.emb.blocks
        total = (torch.sin(self.emb(self.idx) * x)).sum(1)
        for j in range(blocks):
            total = total + (torch.tanh(self.emb(j, x.shape[0]) * x) * (j + 1)).sum(1)
        return total


def test_whole_flow_with_shared_made_matches_torch_func() -> None:
    model = TinyFlow(d=4, hidden=8, blocks=3).to(DT)
    x = torch.randn(6, 4, dtype=DT)
    ref = func_per_example(model, x)
    layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    with Tape(layers) as tape:
        loss = -model.log_prob(x)
        tape.backward(loss.sum())
    assert len(tape.calls[model.made[0]]) == 3 and len(tape.calls[model.emb]) == 3
    names = {p: n for n, p in model.named_parameters()}
    for m in layers:
        for p, g in materialise(m, tape.calls[m]).items():
            torch.testing.assert_close(g, ref[names[p]], atol=TOL, rtol=TOL)


def test_opacus_hooks_accumulate_a_layer_called_three_times() -> None:
    """opacus 1.6 GradSampleModule + our MaskedLinear sampler: the per-example gradient of a
    layer used 3 times is the sum over uses (single-output layers; see _common for logdet)."""
    from opacus.grad_sample import GradSampleModule

    layer, d_in, d_out = build("masked_made", 7)
    model = Harness(layer, 3, d_in, d_out, 7)
    x = torch.randn(5, d_in, dtype=DT)
    ref = func_per_example(model, x)

    class Fwd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: Tensor) -> Tensor:
            return model.log_prob(x)

    gsm = GradSampleModule(Fwd(), loss_reduction="sum")
    (-gsm(x)).sum().backward()
    torch.testing.assert_close(layer.weight.grad_sample, ref["layer.weight"], atol=TOL, rtol=TOL)
    torch.testing.assert_close(layer.bias.grad_sample, ref["layer.bias"], atol=TOL, rtol=TOL)
    gsm._close()


def test_functorch_fallback_for_unregistered_layer() -> None:
    class Scale(nn.Module):  # no grad sampler registered: handled by torch.func
        def __init__(self, d: int) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(d, dtype=DT))

        def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
            return x * torch.exp(self.w), self.w.sum().expand(x.shape[0])

    layer = Scale(3)
    model = Harness(layer, 2, 3, 3, 1)
    x = torch.randn(4, 3, dtype=DT)
    ref = func_per_example(model, x)
    got = materialise(layer, tape_calls(model, layer, x))
    torch.testing.assert_close(got[layer.w], ref["layer.w"], atol=TOL, rtol=TOL)


def test_step_memo_is_per_layer_and_per_recorded_tensors() -> None:
    """The stacks a step computes for the norms are reused for the clipped sum: per layer (the
    ops object is shared by every layer of its type, and a step visits all layers for the norms
    before any clipped sum), and recomputed for new recorded tensors (the next step)."""
    from privflow.privacy.dpsgd.grad_samplers._common import StepMemo

    memo: StepMemo[int] = StepMemo()
    computed: list[int] = []

    def compute(v: int):
        return lambda: computed.append(v) or v

    first, second = nn.Linear(1, 1), nn.Linear(1, 1)
    t1, t2 = torch.zeros(2), torch.zeros(2)
    assert memo.get(first, [t1], compute(1)) == 1
    assert memo.get(second, [t2], compute(2)) == 2
    assert memo.get(first, [t1], compute(3)) == 1 and memo.get(second, [t2], compute(4)) == 2
    assert memo.get(first, [t1.clone()], compute(5)) == 5  # equal values, another tensor: a new step
    assert computed == [1, 2, 5]
