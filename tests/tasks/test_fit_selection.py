"""fit's candidate set: the flow before DP-SGD is one of the checkpoints selection sees, so a
run whose training did not help falls back to it (independent columns; with DP marginals the
independent copula)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.tasks.fit import Spend, fit, prepare
from privflow.tasks.run_plan import run_plan

torch.set_num_threads(1)


def table(n: int = 600, seed: int = 0) -> tuple[pl.DataFrame, Schema]:
    g = np.random.default_rng(seed)
    a = g.normal(0, 1, n)
    df = pl.DataFrame({"a": np.clip(a, -3, 3), "b": np.clip(a + g.normal(0, 0.3, n), -4, 4)})
    schema = Schema.model_validate(
        {
            "dataset": {"name": "toy", "expected_rows": n, "budget": {"epsilon": 10.0, "delta": 1e-5}},
            "columns": [
                {"name": "a", "type": "numeric", "bounds": [-3, 3]},
                {"name": "b", "type": "numeric", "bounds": [-4, 4]},
            ],
        }
    )
    return df, schema


def config(**train: object) -> RunConfig:
    return RunConfig.build(
        data=Path("toy.csv"),
        schema_path=Path("toy.yaml"),
        privacy={"epsilon": 5.0, "delta": 1e-5, "select_share": 0.3},
        model={"name": "maf", "blocks": 1, "hidden": 8},
        train={
            "epochs": 1,
            "batch_size": 100,
            "checkpoint_every": 2,
            "device": "cpu",
            "min_effective_batch": 0,
            **train,
        },
        marginals={"enabled": True, "share": 0.2},
    )


def run(cfg: RunConfig, rows: int = 600) -> object:
    df, schema = table(rows)
    spend = Spend()
    plan = run_plan(cfg, schema)
    codec, x_train, x_val = prepare(cfg, schema, df, plan, spend)
    return fit(cfg, schema, codec, x_train, x_val, plan=plan, spend=spend)


def test_the_untrained_flow_is_the_first_candidate() -> None:
    fitted = run(config())
    steps = [s for s, _ in fitted.train.checkpoints]  # type: ignore[attr-defined]
    assert steps[0] == 0 and steps[1:] == sorted(steps[1:]) and steps[-1] == fitted.train.steps  # type: ignore[attr-defined]
    start = fitted.train.checkpoints[0][1]  # type: ignore[attr-defined]
    last = fitted.train.checkpoints[-1][1]  # type: ignore[attr-defined]
    assert any(not torch.equal(start[k], last[k]) for k in start)
    # the cumulative-epsilon curve covers the DP-SGD checkpoints only
    assert [t for t, _ in fitted.cumulative_epsilon] == steps[1:]  # type: ignore[attr-defined]


def test_without_include_start_only_trained_checkpoints_compete() -> None:
    cfg = config()
    cfg = cfg.model_copy(update={"select": cfg.select.model_copy(update={"include_start": False})})
    fitted = run(cfg)
    assert fitted.train.checkpoints[0][0] > 0  # type: ignore[attr-defined]


def test_selection_falls_back_to_the_start_when_training_breaks_the_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    import privflow.tasks.fit as fit_module

    real = fit_module.train_flow_model

    def broken(model: torch.nn.Module, x: np.ndarray, settings: object, show: bool = False) -> object:
        result = real(model, x, settings, show)
        for _, state in result.checkpoints:  # every trained checkpoint scrambled: far worse than the start
            for k, v in state.items():
                if v.is_floating_point() and "weight" in k:
                    v.mul_(-25.0)
        return result

    monkeypatch.setattr(fit_module, "train_flow_model", broken)
    # what the fallback does once the start is chosen, not how often the selection's noise lets a
    # scrambled flow win (on 3,000 rows it did once in three CI runs under load): Report-Noisy-Max
    # picks the best score here (report_noisy_max's own tests check its noise)
    from privflow.privacy.mechanisms import report_noisy_max as rnm

    monkeypatch.setattr(rnm, "exact_noisy_max", lambda scores, sensitivity, epsilon, monotone: int(np.argmax(scores)))
    fitted = run(config(), rows=3000)
    assert fitted.chosen_steps == [0]  # type: ignore[attr-defined]
    assert fitted.fell_back  # type: ignore[attr-defined]
    assert "drawn independently" in fitted.release_note  # type: ignore[attr-defined]
    # a warm start's step 0 is its parent's trained flow, not independent columns
    from dataclasses import replace

    warm = replace(fitted, warm_start="privflow-adult-public/1")  # type: ignore[type-var]
    assert not warm.fell_back and "parent 'privflow-adult-public/1'" in warm.release_note
    assert "independently" not in warm.release_note


def test_a_run_that_learns_moves_off_the_start() -> None:
    # 3,000 rows, as the fallback test above: on 600 the noisy selection kept the start in 5 of 200
    # runs (CI failed on it once); on 3,000 in none of 200
    fitted = run(config(epochs=6), rows=3000)
    assert fitted.chosen_steps != [0] and not fitted.fell_back  # type: ignore[attr-defined]


def test_a_private_fit_scores_at_most_max_candidates_checkpoints() -> None:
    cfg = config(epochs=6)
    cfg = cfg.model_copy(update={"select": cfg.select.model_copy(update={"max_candidates": 3, "top_k": 1})})
    fitted = run(cfg, rows=600)
    steps = [s for s, _ in fitted.train.checkpoints]  # type: ignore[attr-defined]
    assert steps[0] == 0 and len(steps) == 4  # the start, then the trainer's 3 kept states


def test_prepare_caps_the_selection_split_by_the_public_expected_rows() -> None:
    """prepare splits at select.fraction(expected_rows): capped at 20 of 2,000 expected rows,
    the selection split expects 20 rows, not validation_fraction's 200."""
    df, schema = table(2_000)
    cfg = config()
    for cap, expected in ((100_000, 200), (20, 20)):
        capped = cfg.model_copy(update={"select": cfg.select.model_copy(update={"max_validation_rows": cap})})
        _, x_train, x_val = prepare(capped, schema, df, run_plan(capped, schema), Spend())
        assert len(x_train) + len(x_val) == 2_000
        assert abs(len(x_val) - expected) < 5 * expected**0.5  # 5 sd of the coins
