"""evaluate: diagnostics for the data owner (NOT differentially private; never released)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch
from prefect import task

from privflow.codec import Codec
from privflow.config import EvaluateConfig
from privflow.schema import Schema
from privflow.tasks._options import PRIVATE
from privflow.tasks.evaluation.report import EvaluationResult, evaluate
from privflow.tasks.select import row_loglik

_MIA_ROWS = 4000  # rows per side for the membership test: enough for a stable AUROC


@task(name="evaluate", **PRIVATE)
def evaluate_run(
    schema: Schema,
    codec: Codec,
    model: torch.nn.Module,
    real_train: pl.DataFrame,
    x_train: np.ndarray,
    x_holdout: np.ndarray,
    real_test: pl.DataFrame | None,
    synthetic: pl.DataFrame,
    cfg: EvaluateConfig,
    out_dir: Path,
) -> EvaluationResult:
    """Fidelity, utility, likelihood and privacy-risk diagnostics, with an HTML report."""
    loglik = None
    if cfg.likelihood or cfg.privacy_risk:
        rng = np.random.default_rng(0)
        loglik = {
            "train": row_loglik(model, x_train[rng.permutation(len(x_train))[:_MIA_ROWS]]),
            "holdout": row_loglik(model, x_holdout[rng.permutation(len(x_holdout))[:_MIA_ROWS]]),
        }
        if real_test is not None:
            loglik["test"] = row_loglik(model, codec.encode(real_test, rng))
    test = real_test if real_test is not None else real_train.head(0)
    return evaluate(schema, real_train, test, synthetic, cfg, out_dir, loglik=loglik)
