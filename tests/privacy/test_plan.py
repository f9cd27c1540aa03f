"""The privacy plan meets its target by composition, and refuses what cannot be met."""

from __future__ import annotations

import pytest

from privflow.core.errors import PrivacyPlanError
from privflow.privacy.accounting.accountant import PLDAccountant, PRVAccountant
from privflow.privacy.accounting.events import GaussianEvent, PureDPEvent
from privflow.privacy.accounting.plan import SGDShape, make_plan


def _gauss(eps: float) -> GaussianEvent:
    from privflow.privacy.accounting.calibration import gaussian_noise_for_epsilon

    return GaussianEvent(gaussian_noise_for_epsilon(eps, 1e-5))


SMALL = {"dp_stats": (0.05, _gauss), "select": (0.05, PureDPEvent)}


@pytest.mark.parametrize(
    "epsilon", [pytest.param(0.5, marks=pytest.mark.slow), 1.0, pytest.param(4.0, marks=pytest.mark.slow)]
)
def test_plan_lands_within_one_percent_under_target(epsilon: float) -> None:
    plan = make_plan(epsilon, 1e-5, SMALL, SGDShape(0.02, 300))
    assert 0.99 * epsilon <= plan.epsilon <= epsilon
    # the figure is the composition of the recorded events, recomputed from them alone
    assert PLDAccountant().epsilon(plan.events, 1e-5) == pytest.approx(plan.epsilon, rel=1e-9)
    # an independent accountant (PRV) agrees within 1%: its upper bound may lie up to its absolute
    # error above, so that error stays well under 1% of epsilon (0.4%, at most 0.005)
    prv = PRVAccountant(eps_error=min(0.005, 0.004 * epsilon))
    assert prv.epsilon(plan.events, 1e-5) == pytest.approx(plan.epsilon, rel=0.01)
    assert plan.epsilon_rdp >= plan.epsilon


def test_composition_is_tighter_than_the_sum_of_stage_epsilons() -> None:
    plan = make_plan(1.0, 1e-5, SMALL, SGDShape(0.02, 300))
    assert sum(s.epsilon_alone for s in plan.stages) > plan.epsilon
    assert plan.stage("dp_stats").epsilon_alone == pytest.approx(0.05, rel=0.01)
    assert plan.stage("select").epsilon_alone == pytest.approx(0.05, rel=1e-3)


def test_more_steps_need_more_noise() -> None:
    short = make_plan(1.0, 1e-5, SMALL, SGDShape(0.02, 100)).stage("train").event
    long = make_plan(1.0, 1e-5, SMALL, SGDShape(0.02, 1000)).stage("train").event
    assert long.noise_multiplier > short.noise_multiplier


@pytest.mark.parametrize(
    ("epsilon", "delta", "stages", "match"),
    [
        (0.0, 1e-5, SMALL, "epsilon"),
        (-1.0, 1e-5, SMALL, "epsilon"),
        (1.0, 0.0, SMALL, "delta"),
        (1.0, 1.0, SMALL, "delta"),
        (1.0, 1e-5, {"a": (0.6, PureDPEvent), "b": (0.5, PureDPEvent)}, "add up"),
        (1e-4, 1e-5, SMALL, "stages other than training|No noise level"),
    ],
)
def test_plan_refuses_what_cannot_be_met(epsilon, delta, stages, match) -> None:
    with pytest.raises(PrivacyPlanError, match=match):
        make_plan(epsilon, delta, stages, SGDShape(0.02, 300))


@pytest.mark.parametrize("epsilon", [150.0, 1e4, 1e6, float("inf"), float("nan")])
def test_epsilon_above_the_limit_is_refused_with_a_message(epsilon: float) -> None:
    with pytest.raises(PrivacyPlanError, match="epsilon"):
        make_plan(epsilon, 1e-5, SMALL, SGDShape(0.02, 300))


def test_a_tiny_noise_stage_is_refused_not_a_memory_blowup() -> None:
    from privflow.privacy.accounting.accountant import PLDAccountant, PLDTooLarge

    with pytest.raises(PLDTooLarge):
        PLDAccountant().epsilon([GaussianEvent(1e-4)], 1e-5)
    with pytest.raises(PrivacyPlanError, match="cannot be computed"):
        make_plan(50.0, 1e-5, {"dp_stats": (0.5, lambda eps: GaussianEvent(1e-4))}, SGDShape(0.02, 30))


# ---------------------------------------------------------------------------- small tables


def _demo_plan(name: str, epsilon: float, **sections: dict) -> tuple[object, object, object]:
    from pathlib import Path

    import privflow
    from privflow.core.config import RunConfig
    from privflow.data.schema import Schema
    from privflow.tasks.run_plan import run_plan

    path = Path(privflow.__file__).parent / "demo" / f"{name}.yaml"
    schema = Schema.from_yaml(path)
    cfg = RunConfig.build(data=Path("x.csv"), schema_path=path, privacy={"epsilon": epsilon}, **sections)
    return cfg, schema, run_plan(cfg, schema)


def test_small_table_gives_the_flow_budget_to_the_marginals() -> None:
    from privflow.tasks.run_plan import effective_batch, flow_can_learn, run_plan, sgd_shape

    _, _, headless = _demo_plan("german", 1.0, marginals={"enabled": True}, head={"enabled": False})
    assert [s.name for s in headless.stages] == ["validate", "dp_marginals"]  # type: ignore[attr-defined]
    assert 0.99 * 1.0 <= headless.epsilon <= 1.0  # type: ignore[attr-defined]
    cfg, schema, plan = _demo_plan("german", 1.0, marginals={"enabled": True})
    assert [s.name for s in plan.stages] == ["validate", "dp_head", "dp_marginals"]  # type: ignore[attr-defined]
    assert 0.99 * 1.0 <= plan.epsilon <= 1.0  # type: ignore[attr-defined]
    # the head inherits DP-SGD's share of the full plan: its own 0.2 plus the 0.2 the small stages leave
    assert plan.stage("dp_head").share == pytest.approx(0.4)  # type: ignore[attr-defined]
    assert plan.stage("dp_head").epsilon_alone == pytest.approx(0.4, rel=0.011)  # type: ignore[attr-defined]
    # the decision is the public effective batch of the plan it replaced
    cfg_off = cfg.model_copy(update={"train": cfg.train.model_copy(update={"min_effective_batch": 0.0})})  # type: ignore[attr-defined]
    trained = run_plan(cfg_off, schema)  # type: ignore[arg-type]
    assert trained.has("train") and not flow_can_learn(cfg, schema, trained)  # type: ignore[arg-type]
    assert effective_batch(cfg, schema, trained) < cfg.train.min_effective_batch  # type: ignore[arg-type, attr-defined]
    assert sgd_shape(cfg, schema).sample_rate > 0  # type: ignore[arg-type]


def test_adult_and_runs_without_marginals_keep_the_flow() -> None:
    _, _, adult = _demo_plan("adult", 1.0, marginals={"enabled": True})
    assert adult.has("train") and adult.has("dp_marginals")  # type: ignore[attr-defined]
    _, _, german_plain = _demo_plan("german", 1.0, marginals={"enabled": False})
    assert german_plain.has("train") and not german_plain.has("dp_marginals")  # type: ignore[attr-defined]
    # a budget ten times the demo's is enough for German's 1,000 rows to learn a flow
    _, _, german_big_eps = _demo_plan("german", 10.0, marginals={"enabled": True})
    assert german_big_eps.has("train")  # type: ignore[attr-defined]
