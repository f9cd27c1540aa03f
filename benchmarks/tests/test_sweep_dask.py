"""Benchmark sweeps fan out on a Dask cluster through Prefect's task runner when one is configured.

`make_task_runner` picks the cluster at --dask-address, else at $PRIVFLOW_DASK_ADDRESS, else
a local Dask cluster (--task-runner dask) or local processes. A quick two-cell sweep runs on an
existing Dask cluster started here on loopback (as a Kubernetes Dask cluster would be reached:
by its scheduler address), and every cell runs on that cluster's workers.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prefect.task_runners import ProcessPoolTaskRunner
from prefect_dask import DaskTaskRunner

from benchmarks.sweep import make_task_runner


def test_the_configured_cluster_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVFLOW_DASK_ADDRESS", raising=False)
    assert isinstance(make_task_runner("process", None, 3), ProcessPoolTaskRunner)
    local = make_task_runner("dask", None, 3)
    assert isinstance(local, DaskTaskRunner) and local.address is None
    assert local.cluster_kwargs["n_workers"] == 3 and local.cluster_kwargs["host"] == "127.0.0.1"
    monkeypatch.setenv("PRIVFLOW_DASK_ADDRESS", "tcp://10.0.0.5:8786")
    for kind in ("process", "dask"):  # a configured cluster is used whatever the kind
        assert make_task_runner(kind, None, 3).address == "tcp://10.0.0.5:8786"
    assert make_task_runner("process", "tcp://10.0.0.6:8786", 3).address == "tcp://10.0.0.6:8786"  # the flag first
    with pytest.raises(ValueError, match="task_runner"):
        make_task_runner("ray", None, 2)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_quick_sweep_runs_on_the_cluster_at_the_configured_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import LocalCluster

    from benchmarks.sweep import benchmark

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        monkeypatch.setenv("PRIVFLOW_DASK_ADDRESS", cluster.scheduler_address)
        out = tmp_path / "RESULTS.md"
        records = benchmark(
            datasets=["pinwheel"],
            models=["dpmog", "maf"],
            epsilons=[1.0],
            seeds=[0],
            out=out,
            quick=True,
            work_dir=str(tmp_path / "data"),
        )
        ran_here = cluster.scheduler.task_prefixes.get("run_cell")
        assert ran_here is not None and ran_here.all_durations.get("compute", 0.0) > 0  # the cells ran on it
    assert [(r["model"], r["status"]) for r in records] == [("maf", "ok"), ("dpmog", "ok")], records
    assert all(
        r["epsilon_spent"] <= 1.0 and math.isfinite(r.get("nll", r.get("nll_copula", math.nan))) for r in records
    )
    assert f"task runner: dask@{cluster.scheduler_address}" in out.read_text()
