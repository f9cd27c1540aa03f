"""The target head: p(target | other columns) beside the flow, and the codec that joins them.

Why. A flow is a density over continuous coordinates; a categorical column, dequantized
into an interval, reaches it only through smooth splines, and the conditional law of a
label given the other columns comes out blurred. On Adult the classifiers trained on the
flow's synthetic table scored well below those trained on the real table, and even the
non-private flow, however long or wide, stopped short of them (benchmarks/results/peers.md,
benchmarks/results/label_ceiling.md). When the schema declares a categorical `target`,
privflow therefore factorises the table as

    p(x) = p_flow(x_-t) * p_head(x_t | x_-t)

with the flow over every other column (in the schema or copula codec, as configured) and a
softmax regression for the target on a PUBLIC encoding of the other columns
(`head_features`: numerics scaled by the public bounds through a hat basis of equally spaced
knots, `privflow.data.features.hat_basis`, so that an effect may bend along a number as in a
generalised additive model; one-hot categoricals over the declared lists, missing flags;
nothing fitted on rows). The head is
trained by DP-SGD as its own mechanism (`privacy/mechanisms/dp_head.py`, its own event in
the plan and the ledger). Both factors are proper (conditional) distributions, so the
released model still has an exact log-likelihood: the flow's density of x_-t plus the head's
log-probability of the target's class.

Calibration (post-processing). With DP marginals the target's class rates are released
(`privacy/mechanisms/dp_marginals.py`); the head's biases are shifted so that its average
prediction over the released flow's own samples equals them (`calibration_shift`: the prior
adjustment of Saerens, Latinne & Decaestecker 2002, "Adjusting the outputs of a classifier
to new a priori probabilities", eq. 2.4 iterated). It uses only released objects and public
draws, so it costs nothing, and the synthetic class rate matches the DP one.

`TargetCodec` wraps the flow's codec (over the schema minus the target) and the head with the
interface the sampler, the scorer and promotion already use: `encode` gives the flow's
input, `decode(array, target_u)` adds the target drawn by inverse CDF from one uniform per
row, `target_loglik` gives the head's term of the likelihood. Everything here is numpy: the
released model needs no torch to draw its labels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from privflow.core.errors import DataError
from privflow.data import rules
from privflow.data.codec import Codec
from privflow.data.copula import CopulaCodec, Marginals
from privflow.data.features import block_size, category_codes, compact_features, expand_features, feature_widths
from privflow.data.lowering import lower
from privflow.data.marginal_ranks import rank_features
from privflow.data.schema import Column, Schema

# Calibration stops when every class rate is within this of its target (or after the cap).
_CALIBRATION_TOLERANCE = 1e-6
_CALIBRATION_ITERATIONS = 500


def head_applies(schema: Schema) -> bool:
    """A head needs a categorical target (the schema guarantees it is one, or a boolean, which
    is lowered to one) and at least one other modelled column to condition on."""
    return schema.target is not None and len(lower(schema).columns) > 1


def class_count(col: Column) -> int:
    """The head's classes: the declared categories, then null when the column is nullable."""
    assert col.categories is not None
    return len(col.categories) + (1 if col.nullable else 0)


def target_codes(schema: Schema, df: pl.DataFrame) -> np.ndarray:
    """[n] class index of every row's target (null -> the last class when nullable). Raises on
    a null in a non-nullable target or an undeclared label (validate the table first)."""
    assert schema.target is not None
    col = schema.column(schema.target)
    codes = category_codes(col, df)
    k = len(col.categories or ())
    bad = codes >= (k + 1 if col.nullable else k)
    if col.nullable:
        # category_codes maps null and undeclared labels to k; only null may stay there
        isnull = df.get_column(col.name).is_null().to_numpy()
        bad |= (codes == k) & ~isnull
    if bad.any():
        raise DataError(
            f"Target column '{col.name}': {int(bad.sum())} value(s) are neither a declared category nor an "
            "allowed null; validate the table first."
        )
    return codes


def head_widths(schema: Schema, knots: int = 0) -> list[int]:
    """The head's blocks over `compact_features` of every column but the target: those of
    `feature_widths`, each numeric column's scaled value (not its missing flag) through a hat
    basis of `knots` knots when knots >= 2, so that the head can bend along a number (an effect
    that rises then falls with age, a threshold in capital gain) as a generalised additive model
    does; 0 keeps it linear. From the schema alone."""
    assert schema.target is not None
    if knots == 1 or knots < 0:
        raise ValueError(f"numeric_knots must be 0 (linear) or at least 2, got {knots}")
    return feature_widths(schema, (schema.target,), numeric=-knots)


def head_features(schema: Schema, df: pl.DataFrame, knots: int = 0) -> np.ndarray:
    """[n, p] the head's input: the public encoding of every column but the target."""
    assert schema.target is not None
    return expand_features(compact_features(schema, df, (schema.target,)), head_widths(schema, knots))


def feature_count(schema: Schema, knots: int = 0) -> int:
    """p, the width of `head_features` (from the schema alone)."""
    return sum(block_size(w) for w in head_widths(schema, knots))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    m = np.max(logits, axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    shifted = logits - m
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


@dataclass(frozen=True, eq=False)
class TargetHead:
    """Softmax regression weights: logits = features @ weight + bias ([p, K] and [K]); the features
    are `head_features(schema, df, knots)` (knots 0: numerics enter linearly, as heads released
    before the hat basis do)."""

    target: str
    weight: np.ndarray
    bias: np.ndarray
    knots: int = 0
    ranked: bool = False  # numerics as the DP marginals' CDF (privflow/data/marginal_ranks.py), not the public scale

    def __post_init__(self) -> None:
        w, b = np.asarray(self.weight, dtype=np.float64), np.asarray(self.bias, dtype=np.float64)
        if w.ndim != 2 or b.shape != (w.shape[1],):
            raise ValueError(f"head weight [p, K] and bias [K] do not match: {w.shape}, {b.shape}")
        if not np.all(np.isfinite(w)) or np.any(np.isnan(b)) or np.all(np.isneginf(b)):
            raise ValueError("head weights must be finite (a bias may be -inf for a class of zero released mass)")
        object.__setattr__(self, "weight", w)
        object.__setattr__(self, "bias", b)

    @property
    def classes(self) -> int:
        return int(self.bias.size)

    def log_probs(self, features: np.ndarray) -> np.ndarray:
        """[n, K] log p(class | features)."""
        return _log_softmax(np.asarray(features, dtype=np.float64) @ self.weight + self.bias)

    def compact_log_probs(self, compact: np.ndarray, widths: list[int]) -> np.ndarray:
        """`log_probs` of the expanded features, computed from the compact ones
        (`privflow.data.features.compact_features`): a scalar block adds value x its weight row, a
        one-hot block adds the weight row of its slot (none for an undeclared label), a hat basis
        the linear interpolation between the rows of the two knots around the value (np.interp,
        class by class). No expansion and no [p, K] product: the sampler draws every synthetic
        row's target through this. Logits are accumulated class-major ([K, n]: contiguous rows)."""
        c = np.asarray(compact, dtype=np.float64)
        logits = np.repeat(self.bias[:, None], c.shape[0], axis=1)
        offset = 0
        for j, width in enumerate(widths):
            if width == 0:
                logits += self.weight[offset][:, None] * c[:, j]
                offset += 1
            elif width < 0:
                rows, knots = self.weight[offset : offset - width], np.linspace(0.0, 1.0, -width)
                for k in range(self.classes):
                    logits[k] += np.interp(c[:, j], knots, rows[:, k])  # clamps outside [0, 1] as the basis does
                offset -= width
            else:
                padded = np.hstack([self.weight[offset : offset + width].T, np.zeros((self.classes, 1))])
                logits += padded[:, c[:, j].astype(np.int64)]
                offset += width
        return _log_softmax(logits.T)

    def shifted(self, delta: np.ndarray) -> TargetHead:
        """The same head with `delta` added to its biases."""
        bias = self.bias + np.asarray(delta, dtype=np.float64)
        return TargetHead(self.target, self.weight, bias, self.knots, self.ranked)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the model artifact (-inf biases as None)."""
        return {
            "target": self.target,
            "weight": self.weight.tolist(),
            "bias": [None if np.isneginf(b) else float(b) for b in self.bias],
            "numeric_knots": self.knots,
            "ranked": self.ranked,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetHead:
        bias = np.array([-np.inf if b is None else float(b) for b in data["bias"]], dtype=np.float64)
        knots = int(data.get("numeric_knots", 0))  # heads released before the hat basis: linear
        ranked = bool(data.get("ranked", False))  # ... before the ranks: the public scale
        return cls(str(data["target"]), np.asarray(data["weight"], dtype=np.float64), bias, knots, ranked)


def calibration_shift(log_probs: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """[K] bias shift delta with mean_i softmax(log_probs_i + delta) = rates (a class of rate 0
    gets -inf: it is never drawn). Fixed-point iteration delta_k += log(rate_k / mean p_k), the
    EM of Saerens et al. (2002) for new class priors, which converges for any rates > 0."""
    lp = np.asarray(log_probs, dtype=np.float64)
    r = np.asarray(rates, dtype=np.float64)
    if lp.ndim != 2 or r.shape != (lp.shape[1],) or lp.shape[0] == 0:
        raise ValueError(f"need log_probs [n > 0, K] and rates [K], got {lp.shape} and {r.shape}")
    if np.any(r < 0) or not r.sum() > 0:
        raise ValueError("rates must be >= 0 and not all zero")
    r = r / r.sum()
    live = r > 0
    delta = np.where(live, 0.0, -np.inf)
    for _ in range(_CALIBRATION_ITERATIONS):
        p = np.exp(_log_softmax(lp + delta)).mean(axis=0)
        if np.max(np.abs(p[live] - r[live])) < _CALIBRATION_TOLERANCE:
            break
        with np.errstate(divide="ignore"):
            delta[live] += np.log(r[live]) - np.log(np.maximum(p[live], 1e-300))
        delta[live] -= delta[live].max()  # the softmax ignores a common shift; keep the numbers small
    return delta


def draw_classes(log_probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """[n] class index by inverse CDF: the first k with cumsum(p)_k > u (u uniform in [0, 1))."""
    cdf = np.cumsum(np.exp(log_probs), axis=1)
    cdf[:, -1] = np.inf  # rounding never leaves a row without a class
    return np.argmax(cdf > np.asarray(u, dtype=np.float64)[:, None], axis=1)


def class_labels(col: Column, codes: np.ndarray) -> pl.Series:
    """Class indices -> the target column typed as `validate` returns it (null for the null class)."""
    cats = list(col.categories or ())
    labels = pl.Series(col.name, [*cats, None], dtype=pl.String)
    return labels.gather(np.minimum(codes, len(cats))).cast(pl.Enum(cats)).alias(col.name)


def flow_schema(schema: Schema) -> Schema:
    """The columns the flow models when a head takes the target: all but the target."""
    assert schema.target is not None
    return schema.without(schema.target)


def flow_codec(schema: Schema, codec: Any) -> Any:
    """The flow's codec: `codec` (over the whole schema) restricted to `flow_schema`. A copula
    codec keeps the same DP marginals (the target's is left out), a schema codec is rebuilt."""
    rest = flow_schema(schema)
    if isinstance(codec, CopulaCodec):
        m = codec.marginals  # every flag of the release kept (a release made before one loads as made)
        probs = {k: v for k, v in m.probs.items() if k != schema.target}
        return CopulaCodec(rest, dataclasses.replace(m, probs=probs), codec.space)
    return type(codec).from_schema(rest)


class TargetCodec:
    """The flow's codec (over the schema minus the target) joined with the target head (module
    docstring). `rates`: the target's released class rates (DP marginals), if any."""

    def __init__(self, schema: Schema, inner: Any, head: TargetHead, rates: np.ndarray | None = None) -> None:
        if not head_applies(schema) or head.target != schema.target:
            raise ValueError(f"a target head needs the schema's categorical target, got head for '{head.target}'")
        self.schema = schema
        self.target = schema.target
        self.column = schema.column(schema.target)
        if head.classes != class_count(self.column) or head.weight.shape[0] != feature_count(schema, head.knots):
            raise ValueError(
                f"head of shape {head.weight.shape} does not fit the schema "
                f"({feature_count(schema, head.knots)} features, {class_count(self.column)} classes)"
            )
        if inner.schema.names != flow_schema(schema).names:
            raise ValueError("the inner codec must cover every column but the target")
        if head.ranked and not isinstance(inner, CopulaCodec):
            raise ValueError("a head trained on the marginals' ranks needs a codec with DP marginals")
        self.inner = inner
        self.head = head
        self.rates = None if rates is None else np.asarray(rates, dtype=np.float64)

    @classmethod
    def around(cls, schema: Schema, codec: Any, head: TargetHead) -> TargetCodec:
        """Join `head` with `codec` (a codec over the WHOLE schema); the target's DP marginal,
        when `codec` has one, becomes the calibration rates."""
        rates = None
        if isinstance(codec, CopulaCodec):
            assert schema.target is not None  # a head's schema names its target
            rates = codec.probs[[c.column for c in codec.cells].index(schema.target)]
        return cls(schema, flow_codec(schema, codec), head, rates)

    def with_head(self, head: TargetHead) -> TargetCodec:
        return TargetCodec(self.schema, self.inner, head, self.rates)

    # the flow's side ---------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    @property
    def cardinalities(self) -> list[int | None]:
        return list(self.inner.cardinalities)

    @property
    def marginals(self) -> Marginals | None:
        """The DP marginals the flow's codec was built from (without the target's), if any."""
        return getattr(self.inner, "marginals", None)

    @property
    def uniformize(self) -> Any:
        """The inner copula codec's rank transform (AttributeError, so `hasattr` is False, for a
        schema codec: the sampler then draws no jitter)."""
        return self.inner.uniformize

    def encode(self, df: pl.DataFrame, generator: np.random.Generator | None = None) -> np.ndarray:
        """The flow's input: the rows' other columns through the inner codec."""
        return self.inner.encode(df, generator)

    def log_mass(self, df: pl.DataFrame) -> np.ndarray:
        """The inner copula codec's log cell masses (the flow's discrete reference)."""
        return self.inner.log_mass(df)

    def same_cells(self, other: Any) -> bool:
        return (
            isinstance(other, TargetCodec)
            and other.target == self.target
            and hasattr(self.inner, "same_cells")
            and self.inner.same_cells(other.inner)
        )

    # the target's side -------------------------------------------------------------------------
    def head_log_probs(self, df: pl.DataFrame) -> np.ndarray:
        """[n, K] log p_head(class | the rows' other columns)."""
        rest = (self.target,)
        widths = head_widths(self.schema, self.head.knots)
        compact = compact_features(self.schema, df, rest)
        if self.head.ranked:
            compact = rank_features(compact, self.schema, df, self.inner, rest)
        return self.head.compact_log_probs(compact, widths)

    def sampling_log_probs(self, rest: pl.DataFrame) -> np.ndarray:
        """[n, K] the law the target is drawn from given the rows' other columns: the head's,
        restricted to the classes the schema's conditional rules on the target allow for the row
        (`privflow.data.rules.allowed_classes`; a row no class could meet keeps the head's), so
        such a rule holds by construction. Calibration fits this law to the DP class rates."""
        lp = self.head_log_probs(rest)
        allowed = rules.allowed_classes(self.schema, rest)
        if allowed is None:
            return lp
        masked = np.where(allowed, lp, -np.inf)
        left = np.isfinite(masked).any(axis=1)
        lp[left] = _log_softmax(masked[left])
        return lp

    def target_loglik(self, df: pl.DataFrame) -> np.ndarray:
        """[n] log p_head(target | other columns) of the rows (nats; -inf for a class the
        calibration closed)."""
        return self.head_log_probs(df)[np.arange(df.height), target_codes(self.schema, df)]

    def decode(self, array: np.ndarray, target_u: np.ndarray) -> pl.DataFrame:
        """The flow's draws [n, dim] and one uniform per row -> rows of the whole schema (schema
        order): the other columns by the inner codec, the target drawn from the head given them."""
        u = np.asarray(target_u, dtype=np.float64)
        rest = self.inner.decode(array)
        if u.shape != (rest.height,):
            raise ValueError(f"decode needs one uniform per row: {rest.height} rows, {u.shape} uniforms")
        codes = draw_classes(self.sampling_log_probs(rest), u)
        return rest.with_columns(class_labels(self.column, codes)).select(self.schema.names)


def conditional_loglik(codec: Any, df: pl.DataFrame) -> np.ndarray | float:
    """The head's term of a row's log-likelihood under a released codec: `target_loglik` for a
    `TargetCodec`, 0 for a codec without a head (the flow then models every column)."""
    return codec.target_loglik(df) if isinstance(codec, TargetCodec) else 0.0


__all__ = [
    "TargetCodec",
    "TargetHead",
    "calibration_shift",
    "class_count",
    "class_labels",
    "conditional_loglik",
    "draw_classes",
    "feature_count",
    "flow_codec",
    "flow_schema",
    "head_applies",
    "head_features",
    "head_widths",
    "release_codec",
    "release_parts",
    "target_codes",
]


def release_parts(codec: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(marginals, head) as stored beside a release's weights (JSON-ready), so that
    `release_codec` rebuilds exactly `codec`: the DP marginals of every column (the target's
    included: its class rates) and the calibrated head, each None when absent."""
    if isinstance(codec, TargetCodec):
        inner = codec.marginals
        marginals = None
        if inner is not None and codec.rates is not None:
            probs = {**inner.probs, codec.target: codec.rates}
            full = dataclasses.replace(inner, probs=probs)  # every flag of the release kept
            marginals = full.to_dict()
        return marginals, codec.head.to_dict()
    if isinstance(codec, CopulaCodec):
        return codec.marginals.to_dict(), None
    return None, None


def release_codec(schema: Schema, marginals: Mapping[str, Any] | None, head: Mapping[str, Any] | None = None) -> Any:
    """The codec a released model was trained in, from what is stored beside its weights: the
    schema-only Codec, or the copula codec of its DP marginals (`Marginals.to_dict()`), joined
    with its target head (`TargetHead.to_dict()`) when it has one. A release keeps the schema
    as written (its surface); the codec is the modelled schema's (`privflow.data.lowering.lower`)."""
    schema = lower(schema)
    codec: Any = Codec.from_schema(schema) if marginals is None else CopulaCodec(schema, Marginals.from_dict(marginals))
    if head is None:
        return codec
    return TargetCodec.around(schema, codec, TargetHead.from_dict(head))
