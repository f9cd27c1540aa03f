"""Whole models (MAF, DP-HFlow) through the TabularFlow interface."""

from __future__ import annotations

import math

import pytest
import torch

from privflow import models
from privflow.core.config import ModelConfig
from privflow.models import build_flow
from privflow.models.priors import MixtureOfGaussians
from tests.models.conftest import jacobian_logdets, perturb

CARDS = [None, 3, None, 2]  # continuous, categorical(3), continuous, categorical(2)

VARIANTS = [
    ("maf", {}),
    ("maf", {"dequantization": "variational"}),
    ("dphflow", {"linear": "lu"}),
    ("dphflow", {"linear": "lowrank", "rank": 2}),
    ("dphflow", {"linear": "none", "dequantization": "variational"}),
    ("dphflow", {"linear": "lu", "prior": "mog", "mog_components": 3}),
]
IDS = [f"{n}-" + "-".join(f"{v}" for v in kw.values()) for n, kw in VARIANTS]


def _model(name: str, cards=CARDS, seed: int = 0, std: float = 0.3, **kw) -> models.TabularFlow:
    torch.manual_seed(seed)  # initial weights come from the global generator
    m = build_flow(name, cards, blocks=2, hidden=12, spline_bins=5, spline_bound=3.0, **kw).double()
    perturb(m, std, seed)
    return m


def _data(n: int, cards=CARDS, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cols = [torch.rand(n, generator=g) if k is None else torch.randint(0, k, (n,), generator=g).double() for k in cards]
    return torch.stack(cols, 1)


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_transform_inverse_and_logdet(name, kw):
    m = _model(name, **kw)
    v = torch.rand(4, len(CARDS), generator=torch.Generator().manual_seed(1)) * 0.9 + 0.05
    z, logdet = m.transform(v)
    torch.testing.assert_close(m.inverse_transform(z), v, atol=1e-8, rtol=0)
    torch.testing.assert_close(logdet, jacobian_logdets(m.transform, v), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_every_parameter_gets_a_gradient(name, kw):
    fresh = build_flow(name, CARDS, blocks=2, hidden=12, spline_bins=5, **kw).double()
    fresh.log_prob(_data(8)).mean().backward()  # at the identity start every parameter is in the graph
    assert all(p.grad is not None for p in fresh.parameters())
    m = _model(name, **kw)
    m.log_prob(_data(8)).mean().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} gets no gradient"


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_state_dict_round_trip(name, kw, tmp_path):
    m = _model(name, **kw)
    if isinstance(m.prior, MixtureOfGaussians):
        m.set_prior(torch.tensor([0.5, 0.3, 0.1, 0.1]), torch.randn(4, 4), torch.rand(4, 4) + 0.5)
    x = _data(6)
    noise = torch.rand(6, 2)
    torch.save({"config": m.config, "state": m.state_dict()}, tmp_path / "m.pt")
    saved = torch.load(tmp_path / "m.pt")
    m2 = build_flow(**saved["config"]).double()
    m2.load_state_dict(saved["state"])
    torch.testing.assert_close(m2.log_prob(x, noise), m.log_prob(x, noise), atol=0, rtol=0)


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_sample_ranges(name, kw):
    m = _model(name, std=1.0, **kw)  # strongly perturbed: sampling must still be clean
    s = m.sample(300, torch.Generator().manual_seed(0), batch_size=128)
    assert s.shape == (300, 4) and torch.isfinite(s).all()
    cont, cat = s[:, [0, 2]], s[:, [1, 3]]
    assert torch.all((cont >= 0) & (cont <= 1))
    assert torch.equal(cat, torch.floor(cat))
    assert torch.all(cat >= 0) and torch.all(cat[:, 0] <= 2) and torch.all(cat[:, 1] <= 1)
    assert m.sample(0).shape == (0, 4)


def _outside_mass(m, n: int = 100_000) -> float:
    """Monte Carlo reference: probability that the flow puts v outside [0, 1]^d."""
    with torch.no_grad():
        z = m.prior.sample(n, torch.Generator().manual_seed(7), dtype=torch.float64)
        v = m.inverse_transform(z)
    return float(((v < 0) | (v > 1)).any(1).double().mean())


def _grid_integral(m, cards, points: int = 241) -> float:
    """sum_k int exp(log_prob) over [0,1]^2 (codes: over u), integrated in logit space."""
    lm = m.logit
    lo, hi = math.log(lm.alpha / (1 - lm.alpha)), math.log((1 - lm.alpha) / lm.alpha)
    t = torch.linspace(lo, hi, points)
    y = torch.cartesian_prod(t, t)
    v = lm.inverse(y)
    dv_dy = (torch.sigmoid(y) * torch.sigmoid(-y)) / (1 - 2 * lm.alpha)
    x, noise, log_jac = v.clone(), None, torch.log(dv_dy).sum(1)
    if cards[1] is not None:
        k = cards[1]
        code = torch.floor(v[:, 1] * k).clamp(0, k - 1)
        noise = (v[:, 1] * k - code)[:, None]
        x[:, 1] = code
        log_jac = log_jac + math.log(k)  # du = K dv
    with torch.no_grad():
        dens = torch.exp(m.log_prob(x, noise) + log_jac).reshape(points, points)
    return float(torch.trapezoid(torch.trapezoid(dens, t, dim=1), t))


@pytest.mark.parametrize("cards", [[None, None], [None, 3]], ids=["continuous", "mixed"])
def test_density_integrates_to_one(cards):
    m = _model("dphflow", cards=cards, seed=1, std=0.25)
    integral, outside = _grid_integral(m, cards), _outside_mass(m)
    # The logit map only reaches [logit(alpha), logit(1 - alpha)]: the flow's mass beyond it is
    # what sampling clamps onto the bounds, so integral + outside mass = 1.
    assert 0.9 < integral < 0.999
    assert abs(integral + outside - 1.0) < 2e-3


@pytest.mark.parametrize(
    "name,kw",
    [("dphflow", {"linear": "lu"}), ("dphflow", {"linear": "lowrank"}), ("dphflow", {"linear": "none"}), ("maf", {})],
)
def test_set_prior_in_preprocessed_space_is_exact_at_start(name, kw):
    cards = [None, None, None]
    m = build_flow(name, cards, blocks=3, hidden=8, prior="mog", mog_components=2, **kw).double()
    mean, std = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.5, 0.5, 2.0])
    m.init_actnorm(mean, std)
    w, mu, sd = torch.tensor([0.3, 0.7]), torch.randn(2, 3), torch.rand(2, 3) + 0.3
    m.set_prior(w, mu, sd)
    v = torch.rand(5, 3) * 0.8 + 0.1
    y, ld_logit = m.logit(v)
    ref = MixtureOfGaussians(3, 2).double()
    ref.set(w, mu, sd)
    torch.testing.assert_close(m.log_prob(v), ref.log_prob(y) + ld_logit)


def test_preprocess_and_init_actnorm():
    m = build_flow("maf", CARDS, blocks=1, hidden=8).double()
    x = _data(2000)
    u = torch.rand(2000, 2, generator=torch.Generator().manual_seed(4))
    y = m.preprocess(x, u)
    v = x.clone()
    v[:, 1] = (x[:, 1] + u[:, 0]) / 3
    v[:, 3] = (x[:, 3] + u[:, 1]) / 2
    torch.testing.assert_close(y, m.logit(v)[0])
    m.init_actnorm(y.mean(0), y.std(0))
    h, _ = m.first_actnorm()(y)
    torch.testing.assert_close(h.mean(0), torch.zeros(4), atol=1e-10, rtol=0)
    torch.testing.assert_close(h.std(0), torch.ones(4))


def test_no_trainable_module_owns_buffers():
    """opacus' rule: a module with trainable parameters must not own buffers."""
    for name, kw in VARIANTS:
        m = build_flow(name, CARDS, **kw)
        for mod_name, mod in m.named_modules():
            if any(True for _ in mod.parameters(recurse=False)):
                assert list(mod.buffers()) == [], mod_name


def test_build_flow_accepts_model_config_and_rejects_unknown():
    cfg = ModelConfig(name="dphflow", linear="lowrank", prior="mog").model_dump()
    m = build_flow(cardinalities=CARDS, **cfg)
    assert isinstance(m, models.DPHFlow) and m.config["linear"] == "lowrank"
    assert isinstance(build_flow(cardinalities=CARDS, **ModelConfig().model_dump()), models.DPHFlow)  # the default
    with pytest.raises(TypeError):
        build_flow("maf", CARDS, hiden=3)
    with pytest.raises(ValueError):
        build_flow("realnvp", CARDS)


@pytest.mark.parametrize("name,kw", [("dphflow", {"linear": "lu"}), ("maf", {"dequantization": "variational"})])
def test_per_example_gradients_under_vmap(name, kw):
    """log_prob is vmap-compatible: torch.func per-example grads equal a loop of backward()."""
    m = _model(name, **kw)
    x, noise = _data(3), torch.rand(3, 2)
    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p, xi, ni):
        return -torch.func.functional_call(m, p, (xi[None], ni[None]))[0]

    per = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, noise)
    for i in range(3):
        m.zero_grad()
        (-m.log_prob(x[i : i + 1], noise[i : i + 1])[0]).backward()
        for k, p in m.named_parameters():
            torch.testing.assert_close(per[k][i], p.grad, msg=k)


@pytest.mark.parametrize("cards", [[None], [4], [3, 2], [None, 5]], ids=["cont1", "cat1", "cat2", "mixed1"])
@pytest.mark.parametrize(
    "name,kw",
    [
        ("maf", {"dequantization": "variational"}),
        ("dphflow", {"dequantization": "variational", "linear": "lowrank"}),
        ("dphflow", {"linear": "lu"}),
    ],
)
def test_small_shapes(cards, name, kw):
    m = _model(name, cards=cards, **kw)
    x = _data(5, cards)
    lp = m.log_prob(x)
    assert lp.shape == (5,) and torch.isfinite(lp).all()
    lp.sum().backward()
    s = m.sample(50)
    assert s.shape == (50, len(cards)) and torch.isfinite(s).all()
    for j, k in enumerate(cards):
        if k is not None:
            assert torch.equal(s[:, j], torch.floor(s[:, j])) and s[:, j].max() <= k - 1
