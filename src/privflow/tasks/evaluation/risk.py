"""Empirical privacy-risk diagnostics: distance to closest record and a likelihood-based
membership-inference test.

Both are sanity checks for the data owner, not privacy guarantees: the (epsilon, delta)
from the ledger is the guarantee; these only flag gross memorisation (a synthetic row much
closer to training rows than to unseen rows, or a model that scores its training rows much
higher than unseen rows, cf. the likelihood-ratio attacks bounded by DP). Not differentially
private themselves: for the curator only, never released.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from sklearn.metrics import roc_auc_score, roc_curve

from privflow.data.features import check_columns, feature_matrix
from privflow.data.schema import Schema

ONEHOT_SCALE = float(np.sqrt(0.5))  # a category mismatch costs 1 in squared distance


def nearest_distances(queries: np.ndarray, reference: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Euclidean distance from each query row to its nearest reference row (exact, chunked).

    The nearest row is found from the expanded |q|^2 - 2 q.r + |r|^2 (one matrix product).
    """
    if reference.shape[0] == 0:
        return np.full(queries.shape[0], np.inf)
    ref_sq = np.einsum("ij,ij->i", reference, reference)
    out = np.empty(queries.shape[0])
    for s in range(0, queries.shape[0], chunk):
        q = queries[s : s + chunk]
        d2 = np.einsum("ij,ij->i", q, q)[:, None] - 2.0 * q @ reference.T + ref_sq[None, :]
        nearest = reference[d2.argmin(axis=1)]
        # recompute the winner's distance directly: exact 0 for a copy, no cancellation error
        out[s : s + chunk] = np.sqrt(((q - nearest) ** 2).sum(axis=1))
    return out


@dataclass(frozen=True)
class DCRResult:
    """Distances from synthetic rows to their closest train and closest holdout row."""

    to_train: np.ndarray
    to_holdout: np.ndarray

    def metrics(self) -> dict[str, float]:
        """Medians, the share of synthetic rows closer to train than to holdout (ties count
        one half; about 0.5 when the generator does not favour its training rows), and the
        share of exact copies of a training row."""
        a, b = self.to_train, self.to_holdout
        closer = float(np.mean((a < b) + 0.5 * (a == b))) if a.size else float("nan")
        return {
            "risk/dcr_train_median": float(np.median(a)) if a.size else float("nan"),
            "risk/dcr_holdout_median": float(np.median(b)) if b.size else float("nan"),
            "risk/dcr_share_closer_to_train": closer,
            "risk/exact_match_train": float(np.mean(a == 0.0)) if a.size else float("nan"),
            "risk/exact_match_holdout": float(np.mean(b == 0.0)) if b.size else float("nan"),
        }


def dcr(
    schema: Schema,
    synthetic: pl.DataFrame,
    train: pl.DataFrame,
    holdout: pl.DataFrame,
    max_synthetic: int = 5_000,
    max_reference: int = 10_000,
    seed: int = 0,
) -> DCRResult:
    """Distance to closest record in the public-bounds encoding (all columns, target included).

    Train and holdout are subsampled to the SAME size (min of both and `max_reference`) so
    that, without memorisation, a synthetic row is equally likely to be nearer either set.
    """
    for df, what in ((synthetic, "synthetic"), (train, "training"), (holdout, "holdout")):
        check_columns(schema, df, what)
    m = min(train.height, holdout.height, max_reference)
    if m == 0 or synthetic.height == 0:
        return DCRResult(to_train=np.empty(0), to_holdout=np.empty(0))  # metrics are NaN
    syn = synthetic.sample(n=min(synthetic.height, max_synthetic), seed=seed)
    tr = train.sample(n=m, seed=seed + 1)
    ho = holdout.sample(n=m, seed=seed + 2)
    enc = [feature_matrix(schema, d, onehot_scale=ONEHOT_SCALE)[0] for d in (syn, tr, ho)]
    return DCRResult(to_train=nearest_distances(enc[0], enc[1]), to_holdout=nearest_distances(enc[0], enc[2]))


def _finite(x: np.ndarray) -> np.ndarray:
    """NaN and -inf log-likelihoods rank lowest (least member-like), +inf highest."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return np.nan_to_num(x, nan=-np.finfo(np.float64).max, neginf=-np.finfo(np.float64).max)


def tpr_at_fpr(y: np.ndarray, s: np.ndarray, fpr_target: float) -> float:
    """Largest true-positive rate at a threshold whose false-positive rate is <= fpr_target."""
    fpr, tpr, _ = roc_curve(y, s)
    ok = fpr <= fpr_target + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


@dataclass(frozen=True)
class MIAResult:
    """Likelihood-threshold membership inference: score = the model's log-likelihood of a row."""

    auroc: float
    tpr_at_1pct_fpr: float
    members: int
    non_members: int

    def metrics(self) -> dict[str, float]:
        return {"risk/mia_auroc": self.auroc, "risk/mia_tpr_at_1pct_fpr": self.tpr_at_1pct_fpr}


def likelihood_mia(member_loglik: np.ndarray, nonmember_loglik: np.ndarray) -> MIAResult:
    """Threshold attack on per-row log-likelihood (members = training rows, non-members =
    holdout rows): AUROC (0.5 = no signal) and TPR at 1% FPR. NaN if either set is empty."""
    a, b = _finite(member_loglik), _finite(nonmember_loglik)
    if a.size == 0 or b.size == 0:
        return MIAResult(float("nan"), float("nan"), int(a.size), int(b.size))
    y = np.concatenate([np.ones(a.size), np.zeros(b.size)])
    s = np.concatenate([a, b])
    return MIAResult(float(roc_auc_score(y, s)), tpr_at_fpr(y, s, 0.01), int(a.size), int(b.size))
