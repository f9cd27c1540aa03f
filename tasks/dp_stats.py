"""dp_stats: DP per-feature mean and std that initialise the first activation norm (DP-NF App. B.1)."""

from __future__ import annotations

import numpy as np
import torch
from prefect import task

from privflow.privacy.mechanisms import dp_stats
from privflow.privacy.noise import preprocess_private
from privflow.privacy.plan import StagePlan
from privflow.tasks._options import PRIVATE

# Public clip for the features the first actnorm sees: the logit map sends [0, 1] into
# roughly [-7, 7], so clipping there bounds each row's contribution without touching most.
STATS_CLIP = 7.0
# Public floor on the released std. The variance is a difference of two noisy moments, so at a
# small budget it can come out near zero; an actnorm that then scales its inputs by 1/0.07
# makes DP-SGD diverge (seen on Adult and pinwheel). Logit-space features spread at least this
# much, so flooring here is post-processing that only removes the harmful tail.
STATS_STD_FLOOR = 0.5


@task(name="dp_stats", **PRIVATE)
def dp_statistics(model: torch.nn.Module, x: np.ndarray, stage: StagePlan) -> tuple[np.ndarray, np.ndarray]:
    """Release the clipped mean/std with the planned Gaussian noise and set the actnorm from them.

    The dequantization noise of `preprocess` comes from a secret generator, not the global
    torch RNG (whose state must not depend on private rows); the release's noise is exact.
    """
    with torch.no_grad():
        z = preprocess_private(model, torch.as_tensor(x, dtype=torch.float32)).numpy().astype(np.float64)
    mean, std = dp_stats.dp_mean_std(z, STATS_CLIP, stage.event.noise_multiplier, std_floor=STATS_STD_FLOOR)
    model.init_actnorm(torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32))
    return mean, std
