"""Base distributions against scipy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from privflow.models.priors import MixtureOfGaussians, StandardNormal


def test_standard_normal_matches_scipy():
    z = torch.randn(6, 3)
    ref = stats.multivariate_normal(np.zeros(3), np.eye(3)).logpdf(z.numpy())
    np.testing.assert_allclose(StandardNormal(3).log_prob(z).numpy(), ref, rtol=1e-12)


def test_mixture_matches_scipy_and_samples():
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([0.2, 0.5, 0.3])
    means = torch.randn(3, 2, generator=g) * 3
    stds = torch.rand(3, 2, generator=g) + 0.2
    prior = MixtureOfGaussians(2, 3).double()
    prior.set(w * 4.0, means, stds)  # unnormalised weights are renormalised
    z = torch.randn(10, 2, generator=g) * 3
    ref = np.log(
        sum(
            float(w[k]) * stats.multivariate_normal(means[k].numpy(), np.diag(stds[k].numpy() ** 2)).pdf(z.numpy())
            for k in range(3)
        )
    )
    np.testing.assert_allclose(prior.log_prob(z).numpy(), ref, rtol=1e-10)
    s = prior.sample(20000, torch.Generator().manual_seed(1), dtype=torch.float64)
    np.testing.assert_allclose(s.mean(0).numpy(), (w[:, None] * means).sum(0).numpy(), atol=0.08)


def test_mixture_state_dict_round_trip_with_other_size():
    a = MixtureOfGaussians(2, 3)
    a.set(torch.tensor([1.0, 2.0]), torch.zeros(2, 2), torch.ones(2, 2) * 2)
    b = MixtureOfGaussians(2, 5)
    b.load_state_dict(a.state_dict())
    z = torch.randn(4, 2, dtype=torch.float32)
    torch.testing.assert_close(a.log_prob(z), b.log_prob(z))
    with pytest.raises(ValueError):
        a.set(torch.ones(2), torch.zeros(2, 3), torch.ones(2, 3))
