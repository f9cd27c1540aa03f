"""The empirical privacy audit: one DP-SGD run with gradient canaries (privacy/audit.py).

Trains the configured flow exactly as `fit` does (same model, same DP statistics for the
actnorm initialisation, same trainer and settings from the plan), with m canaries inserted,
and reports the one-run lower bound on epsilon beside the accountant's claim for the DP-SGD
stage. A curator's check of a configuration, never a release: no ledger entry, nothing in
MLflow; the report goes to ``<store>/audits/<id>.json`` and the model is discarded.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from prefect import flow

from privflow.core.config import RunConfig
from privflow.data.codec import Codec
from privflow.data.io import read_table
from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.data.validation import validate
from privflow.privacy import audit
from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.dpsgd.dp_sgd import dp_sgd_event
from privflow.tasks.encode import encode_rows
from privflow.tasks.fit import Spend, initial_model, initialise
from privflow.tasks.run_plan import run_plan
from privflow.tasks.train import cpu_threads, settings_for, train_flow_model


@dataclass(frozen=True)
class AuditReport:
    audit_id: str
    dataset: str
    mutation: str
    canaries: int
    included: int
    guesses: int
    correct: int
    confidence: float
    delta: float
    epsilon_lower_bound: float
    claimed_epsilon: float  # the accountant's epsilon of the (unmutated) DP-SGD stage alone
    run_epsilon: float  # the configured total of the run (all stages)
    noise_multiplier: float
    sample_rate: float
    steps: int
    passed: bool  # lower bound <= claimed epsilon
    report_path: str


@flow(name="privacy-audit")
def audit_pipeline(
    config: RunConfig,
    canaries: int = 1000,
    mutation: str = "none",
    guesses: int | None = None,
    confidence: float = 0.95,
    show_progress: bool = False,
    seed: int | None = None,
) -> AuditReport:
    """Train once with canaries and bound epsilon from below. `guesses` (r) defaults to m / 5,
    half members (highest scores), half non-members (lowest). `seed`: TEST ONLY (coins,
    canary sampling and the trainer's noise); None draws everything from the OS CSPRNG."""
    if mutation not in audit.MUTATIONS:
        raise ValueError(f"mutation must be one of {audit.MUTATIONS}, got {mutation!r}")
    r = guesses if guesses is not None else max(2, canaries // 5)
    k_pos, k_neg = (r + 1) // 2, r // 2
    schema = Schema.from_yaml(config.schema_path)
    codec = Codec.from_schema(lower(schema))  # the modelled columns (privflow/data/lowering.py)
    # The audit checks DP-SGD's configuration (clipping and noise of the grad samplers), in the
    # schema codec; the DP marginals' release has its own certificate test (OpenDP's maps), and
    # leaving them on would let a small table's plan train no flow at all.
    config = config.model_copy(update={"marginals": config.marginals.model_copy(update={"enabled": False})})
    plan = run_plan(config, schema)
    audit_id = uuid.uuid4().hex[:12]
    folder = config.store.resolve() / "audits"
    folder.mkdir(parents=True, exist_ok=True)
    with cpu_threads(config.train.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(secrets.randbits(63) if seed is None else seed)
        model = initial_model(config, codec)
        slots = audit.canary_slots(model, canaries)  # from the architecture alone: before any row is read
        quarantine = folder / f"{audit_id}-quarantine.csv"  # curator-only, like the train flow's
        df, _ = validate(
            read_table(config.data, max_line_bytes=schema.dataset.max_line_bytes), schema, config.policy, quarantine
        )
        x_train, _ = encode_rows(df, codec, config.select.fraction(schema.dataset.expected_rows), config.train.seed)
        initialise(model, config, plan, x_train, Spend())  # in memory only: no ledger, no MLflow
        shipped = settings_for(config.train, plan.stage("train"))
        settings = audit.mutate(shipped, mutation)
        if seed is not None:
            from dataclasses import replace

            settings = replace(settings, noise_seed=seed)
        coins = audit.inclusion_coins(canaries, seed)
        norm = audit.CANARY_NORM_FACTOR * shipped.max_grad_norm
        with audit.inject_canaries(slots, coins, settings.sample_rate, norm, seed) as run:
            train_flow_model(model, x_train, settings, show_progress)
    r, v = audit.guesses(run.scores, coins, k_pos, k_neg)
    delta = config.privacy.delta
    bound = audit.epsilon_lower_bound(canaries, r, v, delta, confidence)
    event = dp_sgd_event(shipped)
    assert event is not None
    claimed = PLDAccountant().epsilon([event], delta)
    path = folder / f"{audit_id}.json"
    report = AuditReport(
        audit_id=audit_id,
        dataset=schema.dataset.name,
        mutation=mutation,
        canaries=canaries,
        included=int(coins.sum()),
        guesses=r,
        correct=v,
        confidence=confidence,
        delta=delta,
        epsilon_lower_bound=bound,
        claimed_epsilon=claimed,
        run_epsilon=config.privacy.epsilon,
        noise_multiplier=settings.noise_multiplier,
        sample_rate=settings.sample_rate,
        steps=settings.steps,
        passed=bound <= claimed,
        report_path=str(path),
    )
    Path(path).write_text(json.dumps(asdict(report), indent=2))
    return report


__all__ = ["AuditReport", "audit_pipeline"]
