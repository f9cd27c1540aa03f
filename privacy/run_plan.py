"""The pipeline's privacy plan from its public inputs: which stages spend, and how much.

Plain function (no Prefect), so the pre-flight check can build exactly the plan that the
flow will reserve, and refuse an over-budget run before any server starts or any row is
read. Uses only the configuration and the schema's public, approximate row count.
"""

from __future__ import annotations

import math

from privflow.config import RunConfig
from privflow.errors import ConfigError
from privflow.privacy.accountant import PLDAccountant, RDPAccountant
from privflow.privacy.events import Event
from privflow.privacy.mechanisms import dp_marginals, dp_mog, dp_stats, report_noisy_max, validation_gate
from privflow.privacy.plan import PrivacyPlan, SGDShape, make_plan
from privflow.schema import Schema


def sgd_shape(config: RunConfig, schema: Schema) -> SGDShape:
    """Poisson sample rate and step count from the batch size, epochs and the PUBLIC row count."""
    rows = schema.dataset.expected_rows
    if rows is None:
        raise ConfigError(
            f"The schema of dataset '{schema.dataset.name}' needs 'dataset.expected_rows': a public, approximate "
            "row count that turns the batch size and epochs into a Poisson sample rate and a number of steps "
            "(privflow never reads the private row count for this)."
        )
    rate = min(1.0, config.train.batch_size / rows)
    return SGDShape(rate, max(1, math.ceil(config.train.epochs / rate)))


def run_plan(config: RunConfig, schema: Schema) -> PrivacyPlan:
    """Calibrate every stage's noise so that their composition meets the run's target.

    Stages, in the order they spend: the validation gate (a DP count of failing rows,
    ``privacy/mechanisms/validation_gate.py``), DP statistics, the optional DP prior,
    DP-SGD (the remainder), Report-Noisy-Max selection. A warm start (`config.init_from`)
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

    stages: dict[str, tuple[float, object]] = {"validate": (p.gate_share, gate_event)}
    if config.marginals.enabled:
        stages["dp_marginals"] = (
            config.marginals.share,
            lambda eps: dp_marginals.dp_marginals_event(dp_marginals.noise_for_epsilon(eps, delta)),
        )
    stages["dp_stats"] = (p.stats_share, stats_event)
    if config.model.prior == "mog":
        stages["dp_prior"] = (p.prior_share, prior_event)
    stages["select"] = (p.select_share, select_event)
    plan = make_plan(p.epsilon, delta, stages, sgd_shape(config, schema))
    return plan if config.init_from is None else without_initialisation(plan)


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


__all__ = ["INITIALISATION_STAGES", "run_plan", "sgd_shape", "without_initialisation"]
