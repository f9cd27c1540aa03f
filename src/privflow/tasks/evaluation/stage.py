"""evaluate: diagnostics for the data owner (NOT differentially private; never released)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import torch

from privflow.core.config import EvaluateConfig
from privflow.data.codec import Codec
from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.tasks.evaluation.report import EvaluationResult, evaluate
from privflow.tasks.select import row_loglik

if TYPE_CHECKING:
    from privflow.data.copula import CopulaCodec
    from privflow.data.target_head import TargetCodec

_MIA_ROWS = 4000  # rows per side for the membership test: enough for a stable AUROC


def _some_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """Up to _MIA_ROWS distinct row indices, sorted, drawn without a permutation of all n (the
    rows may be millions, on disk: privflow/data/chunked.py)."""
    return np.sort(rng.choice(n, size=min(n, _MIA_ROWS), replace=False))


def evaluate_run(
    schema: Schema,
    codec: Codec | CopulaCodec | TargetCodec,
    model: torch.nn.Module,
    real_train: pl.DataFrame,
    x_train: np.ndarray,
    x_holdout: np.ndarray,
    real_test: pl.DataFrame | None,
    synthetic: pl.DataFrame,
    cfg: EvaluateConfig,
    out_dir: Path,
) -> EvaluationResult:
    """Fidelity, utility, likelihood and privacy-risk diagnostics, with an HTML report, on the
    modelled columns (`privflow.data.lowering.lower`: a date as its day number), as the validated
    and the sampled frames hold them."""
    loglik, t0 = None, time.perf_counter()
    if cfg.likelihood or cfg.privacy_risk:
        rng = np.random.default_rng(0)
        loglik = {
            "train": row_loglik(model, x_train[_some_rows(len(x_train), rng)]),
            "holdout": row_loglik(model, x_holdout[_some_rows(len(x_holdout), rng)]),
        }
        if real_test is not None:
            loglik["test"] = row_loglik(model, codec.encode(real_test, rng))
    seconds = time.perf_counter() - t0
    # None, not an empty table, when no --test-data was given: the report says which it was
    result = evaluate(lower(schema), real_train, real_test, synthetic, cfg, out_dir, loglik=loglik)
    if loglik is None:
        return result
    return replace(result, timings={"log-likelihoods": seconds, **result.timings})
