"""DP target head (privacy/mechanisms/dp_head.py): its public shape, its calibrated event checked
by a second accountant, the trainer's clipped per-example gradients against microbatches, and
the non-private head against scikit-learn's logistic regression."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from privflow.models.softmax_head import SoftmaxHead
from privflow.privacy.accounting.accountant import PLDAccountant, RDPAccountant
from privflow.privacy.dpsgd.clipping import clipped_gradient_sum, model_layers
from privflow.privacy.mechanisms import dp_head


@pytest.mark.parametrize(
    ("rows", "batch"),
    [(32_000, 500.0), (1_000, 250.0), (100, 25.0), (1_000_000, 4_096.0)],
)
def test_shape_from_the_public_row_count(rows: int, batch: float) -> None:
    shape = dp_head.head_shape(rows, 200)
    assert shape.steps == 200
    assert shape.sample_rate * rows == pytest.approx(batch)
    assert dp_head.head_shape(rows, 50, batch_size=64).sample_rate == pytest.approx(min(1.0, 64 / rows))


def test_noise_meets_epsilon_and_a_second_accountant_agrees() -> None:
    shape = dp_head.head_shape(32_000, 200)
    sigma = dp_head.noise_for_epsilon(0.2, 1e-5, shape)
    event = dp_head.dp_head_event(shape, sigma)
    eps = PLDAccountant().epsilon([event], 1e-5)
    assert 0.2 * 0.99 <= eps <= 0.2
    # RDP is an upper bound on the same loss: never below PLD, and not far above here
    rdp = RDPAccountant().epsilon([event], 1e-5)
    assert eps <= rdp <= 1.5 * eps
    assert dp_head.noise_for_epsilon(0.4, 1e-5, shape) < sigma


def test_clipped_per_example_gradients_match_microbatches() -> None:
    torch.manual_seed(0)
    head = SoftmaxHead([0, 4, 0], 3)  # a scalar, a one-hot block of 4 slots, a scalar
    with torch.no_grad():
        head.linear.weight.normal_()
        head.linear.bias.normal_()
    slots = torch.randint(0, 5, (16, 1)).float()  # 4 is the width: an all-zero block
    x = torch.cat([torch.rand(16, 1), slots, torch.rand(16, 1), torch.randint(0, 3, (16, 1)).float()], dim=1)
    res = clipped_gradient_sum(head, x, clipping="flat", max_grad_norm=0.3, method="fast", layers=model_layers(head))
    expected = {p: torch.zeros_like(p) for p in head.parameters()}
    for i in range(16):
        head.zero_grad()
        (-head.log_prob(x[i : i + 1]).sum()).backward()
        grads = [p.grad.clone() for p in head.parameters()]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        for p, g in zip(head.parameters(), grads, strict=True):
            expected[p] += g * min(1.0, 0.3 / float(norm))
    for p in head.parameters():
        torch.testing.assert_close(res.grads[p], expected[p], rtol=1e-5, atol=1e-6)


def test_nonprivate_head_agrees_with_logistic_regression() -> None:
    rng = np.random.default_rng(0)
    n, p = 6000, 4
    f = rng.random((n, p))
    w = np.array([3.0, -2.0, 0.0, 1.5])
    y = (rng.random(n) < 1 / (1 + np.exp(-(f @ w - 1.2)))).astype(int)
    shape = dp_head.head_shape(n, 400)
    weight, bias, event = dp_head.train_head(
        np.column_stack([f, y]), [0] * p, 2, dp_head.head_settings(shape, n, None, 0.05, 1.0, 0.0)
    )
    assert event is None
    ours = f @ (weight[:, 1] - weight[:, 0]) + (bias[1] - bias[0])
    ref = LogisticRegression(C=1e4, max_iter=1000).fit(f, y).decision_function(f)
    assert np.corrcoef(ours, ref)[0, 1] > 0.99


def test_private_head_records_its_event_and_learns() -> None:
    rng = np.random.default_rng(1)
    n = 8000
    f = rng.random((n, 3))
    y = (f[:, 0] > 0.5).astype(int)
    shape = dp_head.head_shape(n, 200)
    sigma = dp_head.noise_for_epsilon(1.0, 1e-5, shape)
    settings = dp_head.head_settings(shape, n, sigma, 0.02, 1.0, 0.95, noise_seed=3)
    weight, bias, event = dp_head.train_head(np.column_stack([f, y]), [0, 0, 0], 2, settings)
    assert event == dp_head.dp_head_event(shape, sigma)
    assert weight[0, 1] - weight[0, 0] > 1.0  # the informative feature's weight is learnt under the noise


def test_the_head_expands_compact_features_as_the_release_does() -> None:
    """The torch head trains on compact features; the released numpy head scores the expanded
    matrix of `privflow.data.features`: both must see the same numbers."""
    from privflow.data.features import compact_features, expand_features, feature_matrix, feature_widths
    from privflow.data.schema import Schema

    schema = Schema.model_validate(
        {
            "dataset": {"name": "h"},
            "target": "y",
            "columns": [
                {"name": "a", "type": "numeric", "bounds": [0, 10], "nullable": True},
                {"name": "c", "type": "categorical", "categories": ["p", "q", "r"], "nullable": True},
                {"name": "y", "type": "categorical", "categories": ["0", "1"]},
            ],
        }
    )
    df = pl.DataFrame(
        {"a": [1.0, None, 9.5, 20.0], "c": ["p", None, "r", "q"], "y": ["0", "1", "1", "0"]},
        schema={"a": pl.Float64, "c": pl.String, "y": pl.String},
    )
    rest = ("y",)
    compact, widths = compact_features(schema, df, rest), feature_widths(schema, rest)
    expected = feature_matrix(schema, df, exclude=rest)[0]
    np.testing.assert_array_equal(expand_features(compact, widths), expected)
    head = SoftmaxHead(widths, 2)
    np.testing.assert_array_equal(head.expand(torch.from_numpy(compact)).numpy(), expected.astype(np.float32))
    assert head.features == expected.shape[1] == 6  # a, a__missing, c=p, c=q, c=r, c=(missing)
    hats = [-4 if w == 0 and j == 0 else w for j, w in enumerate(widths)]  # `a` through 4 hats
    head = SoftmaxHead(hats, 2)
    np.testing.assert_allclose(
        head.expand(torch.from_numpy(compact)).numpy(), expand_features(compact, hats), rtol=1e-6, atol=1e-7
    )
    assert head.features == 9
