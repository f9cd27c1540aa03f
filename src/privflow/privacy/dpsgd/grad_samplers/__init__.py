"""Per-example gradients for the flow layers, registered with opacus (one file per layer type).

Importing this package registers the grad samplers of MaskedLinear, LULinear (DP-HFlow
eq. 3), LowRankLinear (eq. 4), BlockEmbedding and ActNorm in opacus' GRAD_SAMPLERS, and
the fast clipping ops of nn.Linear, MaskedLinear, LULinear, ActNorm and BlockEmbedding
(``registry.GHOST_OPS``).
"""

from __future__ import annotations

import opacus.grad_sample.linear  # noqa: F401  (opacus' own nn.Linear sampler)

from privflow.privacy.dpsgd.grad_samplers import (  # noqa: F401
    actnorm,
    block_embedding,
    linear,
    low_rank,
    lu_linear,
    masked_linear,
    small,
)
from privflow.privacy.dpsgd.grad_samplers.registry import FREE_NUMEL, GHOST_OPS, Call, free_numel
from privflow.privacy.dpsgd.grad_samplers.tape import Tape, grad_sample, materialise, param_layers

__all__ = ["Call", "FREE_NUMEL", "GHOST_OPS", "Tape", "free_numel", "grad_sample", "materialise", "param_layers"]
