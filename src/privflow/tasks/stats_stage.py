"""dp_stats: DP per-feature mean and std that initialise the first activation norm (DP-NF App. B.1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from privflow.privacy.accounting.plan import StagePlan
from privflow.privacy.mechanisms import dp_stats
from privflow.privacy.noise import preprocess_private, secret_generator

if TYPE_CHECKING:
    from privflow.data.chunked import DiskRows
    from privflow.models.base import FlowModel

# Public clip for the features the first actnorm sees: the logit map sends [0, 1] into
# roughly [-7, 7], so clipping there bounds each row's contribution without touching most.
STATS_CLIP = 7.0
# Public floor on the released std. The variance is a difference of two noisy moments, so at a
# small budget it can come out near zero; an actnorm that then scales its inputs by 1/0.07
# makes DP-SGD diverge (seen on Adult and pinwheel). Logit-space features spread at least this
# much, so flooring here is post-processing that only removes the harmful tail.
STATS_STD_FLOOR = 0.5
# Public prior the release is shrunk towards by its noise (`mean_std_from_statistics`): mean 0 and
# the spread of the logit of a uniform value, pi / sqrt(3): what a feature known only by its
# bounds looks like in logit space.
STATS_PRIOR_STD = float(np.pi / np.sqrt(3.0))


STATS_CHUNK_ROWS = 65_536  # rows preprocessed at a time: bounded memory on large tables (a few float64 copies)


def preprocessed_statistics(model: FlowModel, x: np.ndarray | DiskRows) -> np.ndarray:
    """The noiseless clipped moments of ``model.preprocess`` output (`mean_std_statistics`), summed
    over chunks of rows; the dequantization noise comes from one secret generator."""
    gen = secret_generator()
    d = int(x.shape[1])
    stats = np.zeros(1 + 2 * d)
    with torch.no_grad():
        for start in range(0, len(x), STATS_CHUNK_ROWS):
            chunk = torch.as_tensor(x[start : start + STATS_CHUNK_ROWS], dtype=torch.float32)
            z = preprocess_private(model, chunk, gen).numpy().astype(np.float64)
            stats += dp_stats.mean_std_statistics(z, STATS_CLIP)
    return stats


def dp_statistics(model: FlowModel, x: np.ndarray | DiskRows, stage: StagePlan) -> tuple[np.ndarray, np.ndarray]:
    """Release the clipped mean/std with the planned Gaussian noise and set the actnorm from them.

    The dequantization noise of `preprocess` comes from a secret generator, not the global
    torch RNG (whose state must not depend on private rows); the release's noise is exact.
    """
    stats = preprocessed_statistics(model, x)
    noisy = dp_stats.release_statistics(stats, stage.noise_multiplier)
    mean, std = dp_stats.mean_std_from_statistics(
        noisy, STATS_CLIP, STATS_STD_FLOOR, stage.noise_multiplier, STATS_PRIOR_STD
    )
    model.init_actnorm(torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32))
    return mean, std
