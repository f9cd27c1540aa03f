"""Stage times (core/timing.py): collected in one place, handed back in the run summary, printed by
`privflow run` / `demo` under --verbose only, and never released; and the diagnostics worker
(tasks/evaluation/worker.py) that shares the utility classifiers gives the same records."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from privflow.core import timing


class FakeClock:
    """Stands for `time` in core/timing.py: `perf_counter` reads a time the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_stages_nest_in_the_order_they_start_and_a_remainder_excludes_its_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    with timing.collecting() as times:
        with timing.stage("outer"):
            timing.record("outer/part", 0.5)
            clock.advance(0.75)
        with timing.remainder("rest"):
            with timing.stage("inner"):
                clock.advance(0.2)
            clock.advance(0.02)
        timing.record("inner", 0.25)  # a stage met twice adds up
    assert list(times.seconds) == ["outer", "outer/part", "inner", "rest"]
    assert times.seconds["outer"] == pytest.approx(0.75)
    assert times.seconds["outer/part"] == 0.5
    assert times.seconds["inner"] == pytest.approx(0.45)
    assert times.seconds["rest"] == pytest.approx(0.02)  # the block's own time, not the 0.2 s of the stage inside
    with timing.stage("nobody collects"):  # outside a collector: nothing, no error
        timing.record("nothing", 1.0)
    assert timing.current() is None


def test_a_remainder_is_never_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts recorded inside a block (a worker's seconds, say) may add up to more than the block's
    own clock time: the remainder is then 0, not a negative figure."""
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    with timing.collecting() as times:
        with timing.remainder("rest"):
            timing.record("part done elsewhere", 3.0)
            clock.advance(1.0)
    assert times.seconds == {"part done elsewhere": 3.0, "rest": 0.0}


def test_process_age_is_the_time_since_this_process_started() -> None:
    age = timing.process_age()
    if age is None:
        pytest.skip("no /proc here")
    assert 0.0 < age < 24 * 3600


def test_the_run_summary_carries_each_stage_and_the_release_does_not(trained_store: dict) -> None:
    """The shared store's run (tests/stores.py) reports its stages; none of them reached MLflow."""
    from mlflow import MlflowClient

    from privflow.tasks import mlflow_store

    stages = trained_store["summary"]["stage_seconds"]
    for name in (
        "run setup (schema, MLflow store, ledger reservation)",
        "read + validate + gate",
        "dp_marginals",
        "dp_stats",
        "train (DP-SGD)",
        "select (Report-Noisy-Max)",
        "synthetic table (sample, write, log)",
        "evaluate (curator-only diagnostics)",
        "evaluate/fidelity",
        "register (MLflow model, registry version)",
        "pipeline total",
    ):
        assert name in stages, name
    assert all(v >= 0.0 for v in stages.values())
    assert stages["pipeline total"] >= stages["train (DP-SGD)"]
    mlflow_store.tracking(trained_store["store"])
    run = MlflowClient().get_run(trained_store["summary"]["mlflow_run_id"])
    released = [*run.data.metrics, *run.data.params, *run.data.tags]
    assert not [k for k in released if "stage" in k.lower() or "seconds" in k.lower() or "wall" in k.lower()]


def test_verbose_prints_the_stage_times_and_quiet_does_not(monkeypatch, capsys, cli_process_state) -> None:
    """`_run_body`: the CLI's own stages (pre-flight, imports) and the pipeline's, after the summary."""
    from privflow.cli import run as run_cli

    summary = SimpleNamespace(
        run_id="r", mlflow_run_id="m", model_name="privflow-adult", model_version="1", alias="champion",
        alias_version="1", promotion="first", epsilon=1.0, delta=1e-5, epsilon_run=1.0, delta_run=1e-5,
        epsilon_rdp=1.1, dataset_epsilon=1.0, dataset_delta=1e-5, stages={"train": 0.8}, metrics={},
        failing_rows_dp=0.0, wall_seconds=3.0, synthetic_path="/s.csv", curator_dir=None, report_path=None,
        stage_seconds={"train (DP-SGD)": 2.5, "evaluate (curator-only diagnostics)": 0.5,
                       "evaluate/utility": 0.4, "pipeline total": 3.0},
    )  # fmt: skip

    def start(config_path, overrides, verbose, promote, server):  # noqa: ANN001, ANN202
        timing.record("pre-flight (config, checks, privacy plan)", 0.25)
        return (lambda cfg, show_progress: summary), None, object()

    monkeypatch.setattr(run_cli, "_start_run", start)
    run_cli._run_body(None, {}, quiet=True, verbose=True, promote=None, server=False)
    out = capsys.readouterr().out
    assert "stage times (wall clock)" in out
    for line in ("pre-flight (config, checks, privacy plan)", "train (DP-SGD)", "  utility", "total (process)"):
        assert line in out, line
    assert "load average" in out
    assert out.index("privflow run") < out.index("stage times")  # after the run's summary

    run_cli._run_body(None, {}, quiet=True, verbose=False, promote=None, server=False)
    assert "stage times" not in capsys.readouterr().out


def test_the_worker_gives_the_same_utility_records(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Classifiers trained ahead (the real reference) and shared with the worker (the synthetic
    side) give the records of one process, in the same order."""
    monkeypatch.setenv("PRIVFLOW_DIAGNOSTICS_WORKER", "1")  # tests/conftest.py turns it off
    from privflow.data.lowering import lower
    from privflow.data.schema import Schema
    from privflow.data.validation import validate
    from privflow.tasks.evaluation import utility, worker

    schema = lower(Schema.from_yaml(demo_dir / "adult.yaml"))
    raw = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=1600)
    rows, _ = validate(raw, Schema.from_yaml(demo_dir / "adult.yaml"), "quarantine", tmp_path / "q.csv")
    real, syn, test = rows[:600], rows[600:1200], rows[1200:]
    quick = ("LogisticRegression", "DecisionTree", "GaussianNB", "BernoulliNB")
    alone = utility.UtilityResult(
        utility.classify(schema, syn, test, classifiers=quick), utility.classify(schema, real, test, classifiers=quick)
    )
    with worker.diagnostics_worker(True) as w:
        if w is None:
            pytest.skip("no second core here")
        assert utility.classify_ahead(schema, real, test, classifiers=quick)
        with timing.collecting() as times:
            shared = utility.UtilityResult(
                utility.classify(schema, syn, test, classifiers=quick),
                utility.classify(schema, real, test, classifiers=quick),
            )
        assert not w.pending  # the reference was taken, not recomputed
        assert "evaluate/utility, real reference (in a worker, during training)" in times.seconds
        process = w.process
    assert process is not None and not process.is_alive()  # ended with the block
    assert worker.current() is None
    assert shared.synthetic == alone.synthetic
    assert shared.real == alone.real
