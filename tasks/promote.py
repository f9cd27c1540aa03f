"""promote: move the registry alias (e.g. `champion`) to a new version only when a DP
comparison says it is better, with the comparison's privacy cost in the ledger.

The criterion is the one the selection stage uses (DP-GAN note, Boob et al. 2018, section
4): the per-row validation log-likelihood clipped to the public bounds [low, high] of
`SelectConfig`. Here it is a difference between two models on the same rows,

    S(D) = sum_{x in V(D)} clip(log p_new(x)) - clip(log p_champion(x)),

and each term lies in [-(high - low), high - low]: adding or removing one row moves S by at
most high - low, which is both its L1 and its L2 sensitivity. S is released once with the
Laplace (pure epsilon) or the Gaussian mechanism (privacy/mechanisms/), reserved in the
dataset's ledger under the promotion's own id before any row is read, and the alias moves
only if the noisy S is positive. It is a SUM, not a mean: dividing by the private row count
would leak it. The decision, its reason, the noisy margin and the epsilon spent are tags on
the new model version; the previous champion keeps its version number and stays loadable
as `models:/NAME/VERSION`.

With no champion yet, the first version becomes champion without any comparison: no row is
read and nothing is spent.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect import task
from prefect.runtime import task_run

from privflow.models import build_flow
from privflow.privacy.calibration import gaussian_noise_for_epsilon
from privflow.privacy.events import Event
from privflow.privacy.ledger import Ledger
from privflow.privacy.mechanisms import gaussian_event, gaussian_mechanism, laplace_event, laplace_mechanism
from privflow.codec import Codec
from privflow.config import RunConfig
from privflow.curator import curator_dir
from privflow.errors import BudgetExceeded
from privflow.schema import Schema
from privflow.tasks._options import PRIVATE

TAG = "privflow.promotion"


@dataclass(frozen=True)
class PromotionSettings:
    """Public settings of the comparison (its own small epsilon, apart from training's).

    `delta` is used by the Gaussian mechanism only (the Laplace release is pure epsilon-DP).
    """

    epsilon: float = 0.05
    mechanism: Literal["laplace", "gaussian"] = "laplace"
    delta: float = 1e-7
    alias: str = "champion"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"promotion epsilon must be a finite positive number, got {self.epsilon!r}")
        if self.mechanism not in ("laplace", "gaussian"):
            raise ValueError(f"promotion mechanism must be 'laplace' or 'gaussian', got {self.mechanism!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"promotion delta must lie in (0, 1), got {self.delta!r}")

    def noise_multiplier(self) -> float:
        """Noise scale / sensitivity: 1/epsilon for Laplace; the analytic Gaussian calibration."""
        if self.mechanism == "laplace":
            return 1.0 / self.epsilon
        return gaussian_noise_for_epsilon(self.epsilon, self.delta)

    def event(self) -> Event:
        """The privacy event of one comparison."""
        nm = self.noise_multiplier()
        return laplace_event(nm) if self.mechanism == "laplace" else gaussian_event(nm)


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


# -- the statistic (pure; tested against a brute-force add/remove check) ---------------------


def mixture_loglik(per_checkpoint: np.ndarray) -> np.ndarray:
    """log of the equal-weight mixture of k checkpoints: logsumexp over k minus log k.

    The released sampler draws equal shares from its checkpoints (privflow/sampler.py), so
    this is the density of what a version actually releases. Input [k, rows]; output [rows].
    """
    ll = np.asarray(per_checkpoint, dtype=np.float64)
    if ll.ndim != 2 or ll.shape[0] < 1:
        raise ValueError(f"need [checkpoints, rows], got shape {ll.shape}")
    top = np.max(ll, axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    return safe + np.log(np.mean(np.exp(ll - safe), axis=0))


def margin_statistic(ll_new: np.ndarray, ll_old: np.ndarray, low: float, high: float) -> tuple[float, float]:
    """(S, sensitivity): S = sum_i clip(ll_new_i) - clip(ll_old_i), clipped to [low, high].

    One row adds or removes one term in [-(high-low), high-low], so the sensitivity (L1 and
    L2 alike for a scalar) is high - low. NaN/-inf count as `low`, +inf as `high`, so a broken
    model cannot raise it.
    """
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got low={low}, high={high}")
    a = np.asarray(ll_new, dtype=np.float64)
    b = np.asarray(ll_old, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two 1-d arrays of equal length, got {a.shape} and {b.shape}")

    def clip(v: np.ndarray) -> np.ndarray:
        return np.clip(np.nan_to_num(v, nan=low, posinf=high, neginf=low), low, high)

    return float(np.sum(clip(a) - clip(b))), float(high - low)


def release_margin(statistic: float, sensitivity: float, settings: PromotionSettings) -> float:
    """The noisy margin: S plus exact (OpenDP) Laplace or Gaussian noise scaled to the sensitivity.

    The fourth argument is ignored (kept so older callers still run): no caller-supplied
    generator can reach the noise, which comes from the exact samplers' OS entropy.
    """
    nm = settings.noise_multiplier()
    if settings.mechanism == "laplace":
        return float(laplace_mechanism(np.array([statistic]), sensitivity, nm)[0])
    return float(gaussian_mechanism(np.array([statistic]), sensitivity, nm)[0])


# -- registry helpers ------------------------------------------------------------------------


@dataclass
class LoadedVersion:
    """A registered generator's public description and its flows (eval mode, CPU)."""

    version: str
    schema: Schema
    flows: list[torch.nn.Module]


def alias_holder(client: MlflowClient, name: str, alias: str) -> str | None:
    """The version the alias points to, or None when the model or the alias does not exist."""
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def load_version(name: str, version: str) -> LoadedVersion:
    """Rebuild a registered version's flows from its artifacts (meta.json + checkpoints).

    Reads the artifacts directly instead of `mlflow.pyfunc.load_model`, so the bundled copies
    of `models/` and `privflow/` are not put on sys.path of this process.
    """
    import mlflow.artifacts

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp))
        art = root / "artifacts"
        meta = json.loads((art / "meta.json").read_text())
        schema = Schema.model_validate(meta["schema"])
        codec = Codec.from_schema(schema)
        flows = []
        for key in meta["checkpoints"]:
            flow = build_flow(meta["model"]["name"], codec.cardinalities, **meta["model"]["config"])
            flow.load_state_dict(torch.load(art / f"{key}.pt", map_location="cpu", weights_only=True))
            flows.append(flow.eval())
    return LoadedVersion(version, schema, flows)


def comparable(a: Schema, b: Schema) -> bool:
    """Two versions can be scored on the same encoded rows only if their codecs agree."""
    ca, cb = Codec.from_schema(a), Codec.from_schema(b)
    return [(f.name, f.kind, f.cardinality) for f in ca.features] == [(f.name, f.kind, f.cardinality) for f in cb.features]


def version_loglik(flows: list[torch.nn.Module], x: np.ndarray, batch: int = 4096) -> np.ndarray:
    """Per-row log-density of a version (mixture of its checkpoints) on encoded rows."""
    from privflow.privacy.noise import dequantization_noise, log_prob_with, secret_generator

    data = torch.as_tensor(x, dtype=torch.float32)
    per = np.empty((len(flows), len(data)))
    gen = secret_generator()  # dequantization noise on private rows: never the global torch RNG
    with torch.no_grad():
        for k, flow in enumerate(flows):
            parts = [
                log_prob_with(flow, chunk, dequantization_noise(flow, len(chunk), chunk, gen))
                for chunk in (data[i : i + batch] for i in range(0, len(data), batch))
            ]
            per[k] = torch.cat(parts).double().numpy() if parts else np.empty(0)
    return mixture_loglik(per) if len(data) else np.empty(0)


def record(client: MlflowClient, decision: PromotionDecision) -> PromotionDecision:
    """Tag the candidate with the decision; on promotion, move the alias and tag the old champion."""
    for key, value in decision.tags().items():
        client.set_model_version_tag(decision.model_name, decision.candidate_version, key, value)
    if decision.promoted:
        client.set_registered_model_alias(decision.model_name, decision.alias, decision.candidate_version)
        if decision.champion_version is not None and decision.champion_version != decision.candidate_version:
            client.set_model_version_tag(
                decision.model_name, decision.champion_version, f"{TAG}.superseded_by", decision.candidate_version
            )
    return decision


def ledger_id(base: str, attempt: int) -> str:
    """The promotion's ledger run id; a retried attempt reruns the mechanism, so it gets its own."""
    return base if attempt <= 1 else f"{base}#attempt{attempt}"


# -- the task --------------------------------------------------------------------------------


@task(name="promote", retries=1, retry_delay_seconds=2, **PRIVATE)
def promote_if_better(
    model_name: str,
    candidate_version: str,
    config: RunConfig,
    settings: PromotionSettings,
    ledger_path: str,
    promotion_id: str,
) -> PromotionDecision:
    """Decide and record whether `settings.alias` moves to `candidate_version`.

    Reads rows only after the ledger reserved the comparison under `promotion_id` (a retried
    attempt reserves again under its own id: the mechanism reruns, so it is counted again).
    Refuses to compare, keeping the champion, when the budget cannot hold the comparison or
    the two versions encode rows differently.
    """
    from privflow.io import read_table
    from privflow.validation import validate
    from privflow.tasks.encode import encode_rows

    client = MlflowClient()
    alias = settings.alias
    champion = alias_holder(client, model_name, alias)
    base = dict(model_name=model_name, candidate_version=candidate_version, champion_version=champion, alias=alias)
    if champion is None:
        return record(client, PromotionDecision(True, f"no version held '{alias}': the first one takes it at no cost", **base))
    if champion == candidate_version:
        return record(client, PromotionDecision(True, f"already holds '{alias}'", **base))

    schema = Schema.from_yaml(config.schema_path)
    new, old = load_version(model_name, candidate_version), load_version(model_name, champion)
    if not (comparable(new.schema, schema) and comparable(old.schema, schema)):
        reason = f"version {champion} encodes rows differently (schema changed): not compared, '{alias}' kept"
        return record(client, PromotionDecision(False, reason, **base))

    ledger = Ledger(ledger_path)
    dataset = schema.dataset.name
    event = settings.event()
    lid = ledger_id(promotion_id, int(task_run.run_count or 1))
    try:
        ledger.reserve(dataset, lid, [event], {"promote": f"{settings.mechanism} epsilon={settings.epsilon:g}"})
    except BudgetExceeded as exc:
        return record(client, PromotionDecision(False, f"comparison refused by the ledger, '{alias}' kept: {exc}", **base))

    try:
        run_dir = curator_dir(Path(config.store).resolve(), promotion_id)
        # Rows failing the schema's checks are dropped (a per-row filter, so the margin's
        # sensitivity holds); the comparison never stops on them, so no count is released.
        df, _ = validate(read_table(config.data), schema, config.policy, run_dir / "promote_quarantine.csv",
                         gate=lambda _failing: False)
        _, x_val = encode_rows.fn(df, Codec.from_schema(schema), config.select.validation_fraction, config.train.seed)
        lo, hi = config.select.score_low, config.select.score_high
        statistic, sensitivity = margin_statistic(version_loglik(new.flows, x_val), version_loglik(old.flows, x_val), lo, hi)
        noisy = release_margin(statistic, sensitivity, settings)  # exact sampler, OS entropy
    except BaseException:
        ledger.abandon(lid)  # rows may have been read: the reservation stays counted
        raise
    ledger.settle(lid, [event])
    promoted = noisy > 0.0
    verdict = "better" if promoted else "not better"
    reason = (
        f"noisy clipped validation log-likelihood margin {noisy:+.4g} nats (sum over rows, "
        f"{settings.mechanism} noise, sensitivity {sensitivity:g}) vs version {champion}: {verdict}"
    )
    decision = PromotionDecision(
        promoted, reason, **base, noisy_margin=noisy,
        epsilon=settings.epsilon,
        delta=settings.delta if settings.mechanism == "gaussian" else 0.0,
        mechanism=settings.mechanism,
        ledger_run_id=lid,
    )
    return record(client, decision)


__all__ = [
    "LoadedVersion",
    "PromotionDecision",
    "PromotionSettings",
    "alias_holder",
    "comparable",
    "ledger_id",
    "load_version",
    "margin_statistic",
    "mixture_loglik",
    "promote_if_better",
    "release_margin",
    "version_loglik",
]
