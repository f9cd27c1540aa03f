"""DP target head: p(target | other columns) by DP-SGD on a softmax regression (privflow/data/target_head.py).

Mechanism. DP-SGD as in ``privacy.dpsgd.dp_sgd`` (Abadi et al. 2016; DP-NF section 3): Poisson
sampling of the rows at rate q = expected batch / the schema's PUBLIC expected_rows, the
per-example gradient of -log p(y_i | f(x_i)) clipped to L2 norm C (flat: the head is one
linear layer), Gaussian noise of std sigma * C added to the sum, Adam on the noisy mean;
the released weights are the exponential moving average of the iterates (post-processing).
f is the public encoding of the other columns (``privflow.data.target_head.head_features``), a
per-row map fixed by the schema, so one row changes one summand: the event is
``PoissonGaussianEvent(q, sigma, steps)``, accounted like the flow's DP-SGD.

Shape (public: from expected_rows and the configuration, never the private row count). A
convex, few-parameter model gains from large batches and few steps (Li et al. 2022, the DP
large-model review's batch-size / noise trade-off): the expected batch is expected_rows / 64,
at least 256, at most a quarter of the table and at most 4,096, and the run takes `steps` (200)
steps. On Adult (32,000 expected rows) that is batches of 500; on German credit (1,000) batches
of 250. The cap bounds a step's memory on large tables, where the noise is negligible anyway:
at 3.2M expected rows and epsilon 0.2 the noise on the averaged gradient, sigma * C / batch, is
2e-4 with batches of 4,096 (8e-5 with the uncapped 50,000), against clipped per-example
gradients of norm up to C = 1.

``noise_for_epsilon`` calibrates a standalone run (the plan gives the head its share of
epsilon like the other small stages, tasks/run_plan.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from privflow.data.chunked import DiskRows
from privflow.privacy.accounting.events import PoissonGaussianEvent
from privflow.privacy.accounting.plan import Remainder, SGDShape, make_plan

if TYPE_CHECKING:
    from privflow.privacy.dpsgd.dp_sgd import TrainSettings

MIN_BATCH = 256
MAX_BATCH = 4096
BATCH_DIVISOR = 64


def head_shape(expected_rows: int, steps: int, batch_size: int | None = None) -> SGDShape:
    """Poisson rate and steps of the head's DP-SGD from the public row count (module docstring);
    `batch_size` overrides the expected batch."""
    if expected_rows < 1 or steps < 1:
        raise ValueError(f"need expected_rows >= 1 and steps >= 1, got {expected_rows} and {steps}")
    if batch_size is None:
        batch = min(max(MIN_BATCH, expected_rows / BATCH_DIVISOR), expected_rows / 4, MAX_BATCH)
    else:
        batch = float(batch_size)
    return SGDShape(min(1.0, max(batch, 1.0) / expected_rows), steps)


def dp_head_event(shape: SGDShape, noise_multiplier: float) -> PoissonGaussianEvent:
    """The head's cost: Poisson-subsampled Gaussian steps."""
    return shape.event(noise_multiplier)


def noise_for_epsilon(epsilon: float, delta: float, shape: SGDShape) -> float:
    """The smallest noise multiplier whose run of `shape` is (epsilon, delta)-DP on its own (PLD,
    within the plan's 1% under the target)."""
    plan = make_plan(epsilon, delta, {}, Remainder("dp_head", shape.event, sigma_range=(0.3, 1e4)))
    return float(plan.stage("dp_head").noise_multiplier)


def head_settings(
    shape: SGDShape,
    expected_rows: int,
    noise_multiplier: float | None,
    lr: float,
    max_grad_norm: float,
    ema_decay: float,
    noise_seed: int | None = None,
) -> TrainSettings:
    """The trainer's settings for the head; `noise_multiplier=None` is the non-private reference."""
    # torch is imported here, not at module top: pre-flight plans this stage without torch.
    from privflow.privacy.dpsgd.dp_sgd import TrainSettings

    return TrainSettings(
        sample_rate=shape.sample_rate,
        steps=shape.steps,
        noise_multiplier=noise_multiplier or 0.0,
        max_grad_norm=max_grad_norm,
        clipping="flat",
        optimizer="adam",
        lr=lr,
        checkpoint_every=shape.steps,
        ema_decay=ema_decay,
        expected_batch_size=shape.sample_rate * expected_rows,
        device="cpu",
        private=noise_multiplier is not None,
        noise_seed=noise_seed,
    )


def train_head(
    rows: np.ndarray | DiskRows,
    widths: list[int],
    classes: int,
    settings: TrainSettings,
) -> tuple[np.ndarray, np.ndarray, PoissonGaussianEvent | None]:
    """Train the head on private rows: (weight [p, K] over the expanded features, bias [K], the
    run's event or None). `rows`: float32 [n, len(widths) + 1], ``privflow.data.features.compact_features``
    of the other columns (blocks `widths`, ``feature_widths``) and each row's class index last;
    trained on as it is, without a copy (rows on disk: each step gathers its Poisson sample).
    Rows are read only here, by the one trainer (its generators are secret: privacy rule 6)."""
    import torch  # not at module top: pre-flight plans this stage without torch

    from privflow.models.softmax_head import SoftmaxHead
    from privflow.privacy.dpsgd.dp_sgd import train

    data: Any = rows if isinstance(rows, DiskRows) else torch.from_numpy(np.asarray(rows, dtype=np.float32))
    if len(data.shape) != 2 or data.shape[1] != len(widths) + 1:
        raise ValueError(f"rows must be [n, {len(widths) + 1}] (compact features and the class), got {data.shape}")
    model = SoftmaxHead(widths, classes)
    result = train(model, data, settings)
    state = result.checkpoints[-1][1]
    weight = state["linear.weight"].double().numpy().T.copy()
    bias = state["linear.bias"].double().numpy().copy()
    if not (np.all(np.isfinite(weight)) and np.all(np.isfinite(bias))):
        raise ArithmeticError("the target head's training diverged (non-finite weights)")
    return weight, bias, result.event


__all__ = [
    "BATCH_DIVISOR",
    "MAX_BATCH",
    "MIN_BATCH",
    "dp_head_event",
    "head_settings",
    "head_shape",
    "noise_for_epsilon",
    "train_head",
]
