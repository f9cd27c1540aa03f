"""promote: move the registry alias (e.g. `champion`) to a new version only when a DP
comparison says it is better, with the comparison's privacy cost in the ledger.

The comparison itself (the clipped log-likelihood margin, its sensitivity and its noisy
release, with its event) is the mechanism `privacy/mechanisms/promotion.py`. This task
reserves its event in the dataset's ledger under the promotion's own id before any row is
read, releases the margin once, and moves the alias only if the noisy margin is positive.
The decision, its reason, the noisy margin and the epsilon spent are tags on the new model
version (tasks/mlflow_store.py); the previous champion keeps its version number and stays
loadable as `models:/NAME/VERSION`.

With no champion yet, the first version becomes champion without any comparison: no row is
read and nothing is spent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import polars as pl
import torch
from mlflow import MlflowClient

from privflow.core.config import RunConfig
from privflow.core.curator import curator_dir
from privflow.core.errors import BudgetExceeded
from privflow.core.steps import first_attempt
from privflow.data.codec import Codec
from privflow.data.copula import CopulaCodec
from privflow.data.io import read_table
from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.data.target_head import TargetCodec, conditional_loglik
from privflow.data.validation import validate
from privflow.privacy.ledger import Ledger, attempt_run_id
from privflow.privacy.mechanisms.promotion import (
    PromotionMechanism,
    difference_statistic,
    margin_statistic,
    mixture_loglik,
    release_margin,
)
from privflow.privacy.noise import dequantization_noise, log_prob_with, secret_generator, secret_seed
from privflow.serving.release import Release
from privflow.tasks.encode import selection_coins

if TYPE_CHECKING:
    from privflow.models.base import LogProbModel
from privflow.tasks.mlflow_store import PROMOTION_TAG, alias_holder, load_version, store_lock
from privflow.tasks.mlflow_store import record_promotion as record

TAG = PROMOTION_TAG


@dataclass(frozen=True)
class PromotionSettings(PromotionMechanism):
    """The comparison's mechanism settings (privacy/mechanisms/promotion.py) and the alias it may move."""

    alias: str = "champion"


class _Versions(TypedDict):
    """The fields of a `PromotionDecision` that name the versions compared, given by keyword."""

    model_name: str
    candidate_version: str
    champion_version: str | None
    alias: str


@dataclass(frozen=True)
class PromotionDecision:
    """What the promotion step decided and why; `epsilon` is what it spent (0 when it read nothing)."""

    promoted: bool
    reason: str
    model_name: str
    candidate_version: str
    champion_version: str | None
    alias: str
    noisy_margin: float | None = None
    epsilon: float = 0.0
    delta: float = 0.0
    mechanism: str | None = None
    ledger_run_id: str | None = None

    def tags(self) -> dict[str, str]:
        """Model-version tags (MLflow tag values are strings)."""
        out = {
            f"{TAG}.promoted": "yes" if self.promoted else "no",
            f"{TAG}.reason": self.reason,
            f"{TAG}.alias": self.alias,
            f"{TAG}.epsilon_spent": f"{self.epsilon:.6g}",
            f"{TAG}.delta_spent": f"{self.delta:.3g}",
            f"{TAG}.compared_with": self.champion_version or "-",
        }
        if self.noisy_margin is not None:
            out[f"{TAG}.noisy_margin_nats"] = f"{self.noisy_margin:.6g}"
        if self.mechanism is not None:
            out[f"{TAG}.mechanism"] = self.mechanism
        if self.ledger_run_id is not None:
            out[f"{TAG}.ledger_run_id"] = self.ledger_run_id
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- scoring versions --------------------------------------------------------------------------


def comparable(a: Schema, b: Schema) -> bool:
    """Two versions can be scored on the same encoded rows only if their codecs agree."""
    ca, cb = Codec.from_schema(lower(a)), Codec.from_schema(lower(b))
    return [(f.name, f.kind, f.cardinality) for f in ca.features] == [
        (f.name, f.kind, f.cardinality) for f in cb.features
    ]


def version_loglik(flows: list[torch.nn.Module], x: np.ndarray, batch: int = 4096) -> np.ndarray:
    """Per-row log-density of a version (mixture of its checkpoints) on encoded rows."""
    data = torch.as_tensor(x, dtype=torch.float32)
    per = np.empty((len(flows), len(data)))
    gen = secret_generator()  # dequantization noise on private rows: never the global torch RNG
    with torch.no_grad():
        for k, flow in enumerate(flows):
            parts = [
                log_prob_with(cast("LogProbModel", flow), chunk, dequantization_noise(flow, len(chunk), chunk, gen))
                for chunk in (data[i : i + batch] for i in range(0, len(data), batch))
            ]
            per[k] = torch.cat(parts).double().numpy() if parts else np.empty(0)
    return mixture_loglik(per) if len(data) else np.empty(0)


# -- the task --------------------------------------------------------------------------------


def _noisy_margin(
    config: RunConfig,
    schema: Schema,
    new: Release,
    old: Release,
    settings: PromotionSettings,
    promotion_id: str,
) -> tuple[float, float]:
    """Read and validate the rows, score both versions, release the margin once: (noisy, sensitivity)."""
    run_dir = curator_dir(Path(config.store).resolve(), promotion_id)
    # Rows failing the schema's checks are dropped (a per-row filter, so the margin's
    # sensitivity holds); the comparison never stops on them, so no count is released.
    df, _ = validate(
        read_table(config.data, max_line_bytes=schema.dataset.max_line_bytes),
        schema,
        config.policy,
        run_dir / "promote_quarantine.csv",
        gate=lambda _failing, _passing: False,
    )
    with contextlib.suppress(OSError):  # nothing set aside (the strict policy): no empty folder left behind
        run_dir.rmdir()
    coins = selection_coins(df, config.select.fraction(schema.dataset.expected_rows), config.train.seed)
    val = df.filter(pl.Series(coins))
    if new.marginals == old.marginals:  # one flow codec: the clipped log-likelihoods, as before
        x_val = new.codec.encode(val, np.random.default_rng(secret_seed()))
        lo, hi = config.select.score_low, config.select.score_high
        ll_new, ll_old = (version_loglik(v.flows, x_val) + conditional_loglik(v.codec, val) for v in (new, old))
        statistic, sensitivity = margin_statistic(ll_new, ll_old, lo, hi)
    else:  # two DP marginals over the same cells: each version in its own codec, same draws
        seed = secret_seed()
        ll_new, ll_old = (copula_loglik(v, schema, val, seed) for v in (new, old))
        statistic, sensitivity = difference_statistic(ll_new, ll_old, config.select.relative_clip)
    return release_margin(statistic, sensitivity, settings), sensitivity  # exact sampler, OS entropy


def copula_loglik(version: Release, schema: Schema, rows: pl.DataFrame, seed: int) -> np.ndarray:
    """A version's per-row log-likelihood in the copula reference (`CopulaCodec.log_mass`): its
    flows on the rows encoded through its own marginals, plus the rows' log cell masses (and its
    target head's term, privflow/data/target_head.py). The encoding draws (positions inside atoms)
    come from `seed`, the same for both versions."""
    codec = version.codec
    x = codec.encode(rows, np.random.default_rng(seed))
    return version_loglik(version.flows, x) + codec.log_mass(rows) + conditional_loglik(codec, rows)


def codecs_comparable(new: Release, old: Release, schema: Schema) -> bool:
    """Both with a target head or both without (the flows then model the same columns), and the
    same marginals (or none), or DP marginals over the same public cells."""
    if (new.head is None) != (old.head is None):
        return False
    if new.marginals == old.marginals:
        return True
    if new.marginals is None or old.marginals is None:
        return False
    a, b = new.codec, old.codec
    # type(a) is type(b), which mypy cannot carry from a union to same_cells' own class
    return isinstance(a, CopulaCodec | TargetCodec) and type(a) is type(b) and a.same_cells(cast(Any, b))


def promote_if_better(
    model_name: str,
    candidate_version: str,
    config: RunConfig,
    settings: PromotionSettings,
    ledger_path: str,
    promotion_id: str,
    attempt: Callable[[], int] = first_attempt,
) -> PromotionDecision:
    """Decide and record whether `settings.alias` moves to `candidate_version`.

    Reads rows only after the ledger reserved the comparison under `promotion_id` and the
    attempt's number, asked of `attempt` when the reservation is made (a retried attempt reserves
    again under its own id: the mechanism reruns, so it is counted again). A retried Prefect task
    gets the same arguments, so `attempt` is a function: under Prefect's engine the task run's
    count (flows/steps.py, `PrefectRunner.attempt`), otherwise 1.
    Refuses to compare, keeping the champion, when the budget cannot hold the comparison or
    the two versions encode rows differently.

    Under the store's lock (`mlflow_store.store_lock`): two runs finishing together on one store
    each compare with the holder of the moment, one after the other (they raced: one reported
    the alias kept while the other had just moved it).
    """
    with store_lock(Path(config.store).resolve()):
        client = MlflowClient()
        alias = settings.alias
        champion = alias_holder(client, model_name, alias)
        base: _Versions = dict(
            model_name=model_name, candidate_version=candidate_version, champion_version=champion, alias=alias
        )
        if champion is None:
            return record(
                client, PromotionDecision(True, f"no version held '{alias}': the first one takes it at no cost", **base)
            )
        if champion == candidate_version:
            return record(client, PromotionDecision(True, f"already holds '{alias}'", **base))

        schema = Schema.from_yaml(config.schema_path)
        new, old = load_version(model_name, candidate_version), load_version(model_name, champion)
        if not (comparable(new.schema, schema) and comparable(old.schema, schema)) or not codecs_comparable(
            new, old, schema
        ):
            reason = (
                f"version {champion} encodes rows differently (schema, or the cells of the DP marginals, differ): "
                f"not compared, '{alias}' kept"
            )
            return record(client, PromotionDecision(False, reason, **base))

        return _compare(config, schema, new, old, settings, ledger_path, promotion_id, attempt(), base)


def _compare(
    config: RunConfig,
    schema: Schema,
    new: Release,
    old: Release,
    settings: PromotionSettings,
    ledger_path: str,
    promotion_id: str,
    attempt: int,
    base: _Versions,
) -> PromotionDecision:
    """Reserve the comparison in the ledger, release the noisy margin once, record the decision."""
    client, alias, champion = MlflowClient(), settings.alias, base["champion_version"]
    ledger = Ledger(ledger_path)
    event = settings.event()
    lid = attempt_run_id(promotion_id, attempt)
    try:
        ledger.reserve(
            schema.dataset.name, lid, [event], {"promote": f"{settings.mechanism} epsilon={settings.epsilon:g}"}
        )
    except BudgetExceeded as exc:
        return record(
            client, PromotionDecision(False, f"comparison refused by the ledger, '{alias}' kept: {exc}", **base)
        )
    try:
        noisy, sensitivity = _noisy_margin(config, schema, new, old, settings, promotion_id)
    except BaseException:
        ledger.abandon(lid)  # rows may have been read: the reservation stays counted
        raise
    ledger.settle(lid, [event])
    promoted = noisy > 0.0
    reason = (
        f"noisy clipped validation log-likelihood margin {noisy:+.4g} nats (sum over rows, "
        f"{settings.mechanism} noise, sensitivity {sensitivity:g}) vs version {champion}: "
        f"{'better' if promoted else 'not better'}"
    )
    return record(
        client,
        PromotionDecision(
            promoted,
            reason,
            **base,
            noisy_margin=noisy,
            epsilon=settings.epsilon,
            delta=settings.delta if settings.mechanism == "gaussian" else 0.0,
            mechanism=settings.mechanism,
            ledger_run_id=lid,
        ),
    )


__all__ = [
    "PromotionDecision",
    "PromotionSettings",
    "alias_holder",
    "comparable",
    "load_version",
    "margin_statistic",
    "mixture_loglik",
    "promote_if_better",
    "record",
    "release_margin",
    "version_loglik",
]
