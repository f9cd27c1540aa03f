"""dp_prior: the DP mixture-of-Gaussians base distribution (DP-EM, DP-NF App. B.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privflow.data.chunked import DiskRows
from privflow.privacy.accounting.events import GaussianEvent, RepeatedEvent
from privflow.privacy.accounting.plan import StagePlan
from privflow.privacy.mechanisms import dp_mog
from privflow.privacy.noise import preprocess_private, secret_generator

if TYPE_CHECKING:
    from privflow.models.base import FlowModel

# DP-EM runs on features standardised by the DP statistics; a public box of +-4 keeps
# the sufficient statistics bounded while covering nearly all standardised mass.
PRIOR_CLIP = 4.0


def _standardised(model: FlowModel, x: np.ndarray | DiskRows, mean: np.ndarray, std: np.ndarray) -> Any:
    """The preprocessed rows standardised by the DP statistics, once (DP-EM reads them every
    iteration): in memory, or for rows on disk (a streamed run) into a file beside them, chunk by
    chunk. The dequantization noise comes from one secret generator, never the global torch RNG."""
    gen = secret_generator()

    def block(rows: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            z = preprocess_private(model, torch.as_tensor(rows, dtype=torch.float32), gen).numpy().astype(np.float64)
        return (z - mean) / std

    if not isinstance(x, DiskRows):
        return block(np.asarray(x))
    out = DiskRows(x.path.with_name("prior.f32"), len(mean))
    for start in range(0, len(x), dp_mog.EM_CHUNK_ROWS):
        out.append(block(x[start : start + dp_mog.EM_CHUNK_ROWS]))
    return out


def dp_prior(
    model: FlowModel, x: np.ndarray | DiskRows, mean: np.ndarray, std: np.ndarray, stage: StagePlan, components: int
) -> dp_mog.MoGParams:
    """Fit the prior on the DP-standardised features and install it as the flow's base;
    returns the mixture in the preprocessed space."""
    event = stage.event
    assert isinstance(event, RepeatedEvent) and isinstance(event.event, GaussianEvent), event
    z = _standardised(model, x, mean, std)
    params = dp_mog.dp_em_mog(z, components, event.count, PRIOR_CLIP, event.event.noise_multiplier)
    # Back to the preprocessed space (post-processing with the released DP statistics);
    # set_prior carries it through the first actnorm into the base space.
    means, stds = params.means * std + mean, params.stds * std
    model.set_prior(*(torch.as_tensor(a, dtype=torch.float32) for a in (params.weights, means, stds)))
    return dp_mog.MoGParams(params.weights, means, stds)
