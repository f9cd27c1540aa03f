"""The pipeline's privacy plan from its public inputs: which stages spend, and how much.

Plain function (no Prefect), so the pre-flight check can build exactly the plan that the
flow will reserve, and refuse an over-budget run before any server starts or any row is
read. Uses only the configuration and the schema's public, approximate row count.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError
from privflow.data.schema import Schema
from privflow.data.target_head import head_applies
from privflow.privacy.accounting.accountant import PLDAccountant, RDPAccountant
from privflow.privacy.accounting.events import Event
from privflow.privacy.accounting.plan import MAX_STEPS, PrivacyPlan, Remainder, SGDShape, make_plan
from privflow.privacy.mechanisms import dp_head, dp_marginals, dp_mog, dp_stats, report_noisy_max, validation_gate


def _expected_rows(schema: Schema) -> int:
    rows = schema.dataset.expected_rows
    if rows is None:
        raise ConfigError(
            f"The schema of dataset '{schema.dataset.name}' needs 'dataset.expected_rows': a public, approximate "
            "row count that turns the batch size and epochs into a Poisson sample rate and a number of steps "
            "(privflow never reads the private row count for this)."
        )
    return rows


def sgd_shape(config: RunConfig, schema: Schema) -> SGDShape:
    """Poisson sample rate and step count from the batch size, epochs and the PUBLIC row count."""
    rows = _expected_rows(schema)
    rate = min(1.0, config.train.batch_size / rows)
    steps = min(config.train.epochs / rate, MAX_STEPS + 1)  # epochs: 1e308 is a float, not a count
    return SGDShape(rate, max(1, math.ceil(steps)))


def head_planned(config: RunConfig, schema: Schema) -> bool:
    """Whether the run trains a target head: enabled, and the schema declares a categorical target
    with at least one other column (privflow/data/target_head.py)."""
    return config.head.enabled and head_applies(schema)


def head_shape(config: RunConfig, schema: Schema) -> SGDShape:
    """The head's DP-SGD shape from the public row count (privacy/mechanisms/dp_head.py)."""
    batch = None if config.head.batch_size == "auto" else int(config.head.batch_size)
    return dp_head.head_shape(_expected_rows(schema), config.head.steps, batch)


def _head_stage(config: RunConfig, schema: Schema) -> tuple[float, Callable[[float], Event]]:
    shape, delta = head_shape(config, schema), config.privacy.delta
    return config.head.share, lambda eps: dp_head.dp_head_event(shape, dp_head.noise_for_epsilon(eps, delta, shape))


def run_plan(config: RunConfig, schema: Schema) -> PrivacyPlan:
    """Calibrate every stage's noise so that their composition meets the run's target.

    Stages, in the order they spend: the validation gate (a DP count of failing rows,
    ``privacy/mechanisms/validation_gate.py``), the DP marginals (when enabled), the target
    head (when the schema has a categorical target and the head is enabled,
    ``privacy/mechanisms/dp_head.py``), DP statistics, the optional DP prior, DP-SGD (the
    remainder), Report-Noisy-Max selection. With DP marginals on a table too small
    for DP-SGD to learn (`flow_can_learn`), the marginals take the flow's budget instead
    (`copula_only_plan`). A warm start (`config.init_from`)
    gets the same plan without the initialisation stages (`without_initialisation`).
    """
    p, delta = config.privacy, config.privacy.delta
    k, iters = config.select.top_k, config.model.mog_iterations

    def gate_event(eps: float) -> Event:
        return validation_gate.gate_event(eps)

    def stats_event(eps: float) -> Event:
        return dp_stats.dp_stats_event(dp_stats.noise_for_epsilon(eps, delta))

    def prior_event(eps: float) -> Event:
        return dp_mog.dp_mog_event(dp_mog.noise_for_epsilon(eps, delta, iters), iters)

    def select_event(eps: float) -> Event:
        return report_noisy_max.rnm_event(eps / k, k)

    stages: dict[str, tuple[float, Callable[[float], Event]]] = {"validate": (p.gate_share, gate_event)}
    if config.marginals.enabled:
        stages["dp_marginals"] = (
            config.marginals.share,
            lambda eps: dp_marginals.dp_marginals_event(dp_marginals.noise_for_epsilon(eps, delta)),
        )
    if head_planned(config, schema):
        stages["dp_head"] = _head_stage(config, schema)
    stages["dp_stats"] = (p.stats_share, stats_event)
    if config.model.prior == "mog":
        stages["dp_prior"] = (p.prior_share, prior_event)
    stages["select"] = (p.select_share, select_event)
    plan = make_plan(p.epsilon, delta, stages, sgd_shape(config, schema))
    if config.init_from is not None:
        return without_initialisation(plan)
    if config.marginals.enabled and not flow_can_learn(config, schema, plan):
        return copula_only_plan(config, schema)
    return plan


def effective_batch(config: RunConfig, schema: Schema, plan: PrivacyPlan) -> float:
    """Expected batch size over the DP-SGD noise multiplier: how many examples' worth of signal
    each noisy step carries against noise of one clipped example (the per-coordinate noise of the
    averaged gradient is noise_multiplier * C / batch). Public: config, expected_rows and the plan."""
    noise_multiplier = plan.stage("train").noise_multiplier
    shape = sgd_shape(config, schema)
    return shape.sample_rate * float(schema.dataset.expected_rows or 0) / noise_multiplier


def flow_can_learn(config: RunConfig, schema: Schema, plan: PrivacyPlan) -> bool:
    """Whether DP-SGD gets an effective batch of at least `train.min_effective_batch` (decided
    before any row is read). Below it the noise swamps the gradient: on German credit (1,000
    expected rows) at epsilon 1 the effective batch is 19 to 54 over batch sizes 64 to 512 and
    the trained flow scores at chance (AUROC 0.47-0.51 over 3 seeds, benchmarks/results), while
    Adult (32,000 rows) at 282 and the 2-D densities at the same size learn."""
    return effective_batch(config, schema, plan) >= config.train.min_effective_batch


def _flow_share(config: RunConfig) -> float:
    """The share of epsilon DP-SGD gets in the full plan: what the small stages leave."""
    p = config.privacy
    shares = [p.gate_share, p.stats_share, p.select_share, config.marginals.share, config.head.share]
    if config.model.prior == "mog":
        shares.append(p.prior_share)
    return max(0.0, 1.0 - sum(shares))


def copula_only_plan(config: RunConfig, schema: Schema) -> PrivacyPlan:
    """The small-data plan: no flow is trained; the release is the independent copula of the DP
    marginals (the flow at its public initial weights, whose columns `CopulaCodec.uniformize`
    makes exactly uniform and independent), and the run summary says so.

    Who takes the flow's budget. With a target head planned, the head inherits the flow's share
    of the full plan (its own share plus DP-SGD's): it is then the only model of dependence in the
    release. The DP marginals take what is left after the validation gate and the head, which makes
    them as accurate as the budget allows (the stages of a trained flow, DP statistics and
    selection, are not run). Without a head, the marginals take everything after the gate."""
    p, delta = config.privacy, config.privacy.delta
    stages: dict[str, tuple[float, Callable[[float], Event]]] = {"validate": (p.gate_share, validation_gate.gate_event)}
    if head_planned(config, schema):
        share, event = _head_stage(config, schema)
        stages["dp_head"] = (min(share + _flow_share(config), 0.9 - p.gate_share), event)
    return make_plan(
        p.epsilon,
        delta,
        stages,
        Remainder("dp_marginals", dp_marginals.dp_marginals_event, sigma_range=(0.05, 1e5)),
    )


# The stages that only initialise a fresh flow: DP statistics set the first actnorm, DP-EM fits
# the prior to the preprocessed rows as seen by a flow at its identity start.
INITIALISATION_STAGES = ("dp_stats", "dp_prior")


def without_initialisation(plan: PrivacyPlan) -> PrivacyPlan:
    """The plan of a warm start: the from-scratch plan minus its initialisation stages.

    A warm-started flow keeps its parent's actnorm and prior (a refit of the prior on the rows
    would not match a flow that no longer starts at the identity), so those stages would buy
    nothing. Dropping them keeps every other stage's noise, DP-SGD's included, exactly as the
    from-scratch run calibrates it; the run is charged that much less, and the saving stays in
    the dataset's budget.
    """
    kept = tuple(s for s in plan.stages if s.name not in INITIALISATION_STAGES)
    events = [s.event for s in kept]
    return PrivacyPlan(
        plan.target_epsilon,
        plan.delta,
        kept,
        PLDAccountant().epsilon(events, plan.delta),
        RDPAccountant().epsilon(events, plan.delta),
    )


def plan_privacy(config: RunConfig, schema: Schema) -> PrivacyPlan:
    """The pipeline's plan step (a Prefect task run inside a flow, flows/steps.py): it reads only
    public inputs, so it runs, and is recorded, before any private value is read."""
    return run_plan(config, schema)


__all__ = [
    "plan_privacy",
    "INITIALISATION_STAGES",
    "copula_only_plan",
    "effective_batch",
    "flow_can_learn",
    "head_planned",
    "head_shape",
    "run_plan",
    "sgd_shape",
    "without_initialisation",
]
