"""The training flow with train.workers = 2: the same pipeline, ledger and release as one process.

The ledger reserves the plan before any row is read (so before a worker starts), and the
settled run holds exactly one DP-SGD event, the planned PoissonGaussianEvent (global q, the
planned steps: not one per worker). The rows handed to the workers left no folder behind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from privflow.data.schema import Schema
from privflow.privacy.accounting.events import PoissonGaussianEvent
from privflow.privacy.dpsgd.distributed import train_data_parallel
from privflow.privacy.ledger import Ledger
from privflow.tasks import train as train_task
from privflow.tasks.run_plan import run_plan
from tests.data_slices import adult_slice, small_config

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.slow]


def test_two_workers_settle_one_planned_dp_sgd_event(
    tmp_path: Path, demo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from privflow.flows.train import train_pipeline

    data, schema_path = adult_slice(tmp_path, demo_dir, 1500)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the launcher's owner-only folder goes
    launched: list[int] = []

    def spy(model, data, settings, on_step=None):  # noqa: ANN001, ANN202
        launched.append(settings.workers)
        return train_data_parallel(model, data, settings, on_step)

    monkeypatch.setattr(train_task, "train_data_parallel", spy)
    cfg = small_config(
        data,
        schema_path,
        tmp_path / "store",
        "privflow-adult-workers",
        2.0,
        train={"checkpoint_every": 2, "workers": 2, "min_effective_batch": 0},
        evaluate={"synthetic_rows": 200},
    )
    plan = run_plan(cfg, Schema.from_yaml(schema_path))
    planned = plan.stage("train").event
    assert isinstance(planned, PoissonGaussianEvent) and planned.steps > 1

    summary = train_pipeline(cfg, show_progress=False)

    [record] = Ledger(cfg.store / "ledger.db").runs("adult")
    assert record.run_id == summary.run_id and record.status == "settled"
    assert [e for e in record.events if e == planned] == [planned]  # once, at the global rate and planned steps
    assert sorted(map(repr, record.events)) == sorted(map(repr, plan.events))  # each planned stage spent once
    assert summary.epsilon <= cfg.privacy.epsilon
    assert launched == [2]  # the flow's DP-SGD ran in two worker processes
    assert list(scratch.glob("privflow-workers-*")) == []  # the rows' folder is gone
