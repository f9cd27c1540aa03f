"""The training pipeline: validated table in, DP flow trained, checkpoint chosen, model and
cumulative epsilon in MLflow (docs/architecture.md, "Data flow of the training pipeline").

The chain runs as a Prefect flow (flows/train.py, `train_pipeline`: each step a task run) or
in process without Prefect (`train_in_process`, `privflow run` without a Prefect API).
`run_pipeline` picks the runner once (flows/steps.py: `PREFECT` or `LOCAL`) and passes it to
everything that calls a step. This module does not import Prefect, so the second path never
pays for it.

Privacy bookkeeping: the plan is made and the dataset's ledger reserves its events before
any row is read; the run settles with the events actually spent (a run the validation gate
stops is charged the gate alone); a run that fails in the middle of a mechanism keeps its
reservation counted. The reported epsilon is the version's: the PLD composition of the
recorded events of every run in its lineage, read from the ledger (privacy rule 9,
`Ledger.lineage`: the run, every private ancestor it was warm-started from, the DP draft of its
schema; without any, the run's own), and nothing else. The run's own figure is kept beside it
(`epsilon_run`). The ledger also records what the lineage of later runs is read from: the
registered version with its run and weights' digest, the keyed digests of the rows the run was
charged for and of its synthetic table (tasks/warm_start.py).

Trust boundary (docs/privacy.md, "Trust boundary"): the MLflow run, the registered version and the
synthetic table hold only what `tasks/release.py` allows (public values and mechanism
outputs). Everything computed on private rows without a mechanism goes to the run's
curator-only folder (privflow/core/curator.py). After rows are read, no global RNG touches
released output: the synthetic table comes from an explicit generator (privflow/serving/sampler.py).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from privflow.core import timing
from privflow.core.config import RunConfig
from privflow.core.curator import curator_dir, write_json
from privflow.core.errors import GateStopped, ValidationFailed
from privflow.core.events import report as report_event
from privflow.core.steps import StepRunner
from privflow.data.chunked import DiskRows, scratch, streamed
from privflow.data.codec import Codec
from privflow.data.copula import CopulaCodec
from privflow.data.io import read_table, write_table
from privflow.data.lowering import lower, to_surface
from privflow.data.schema import Schema
from privflow.data.target_head import TargetCodec, release_parts
from privflow.data.validation import CHECK_ADVICE, validate
from privflow.flows.steps import Runner, runner_for
from privflow.privacy.accounting.accountant import PLDAccountant, RDPAccountant
from privflow.privacy.accounting.events import Event, PoissonGaussianEvent
from privflow.privacy.accounting.plan import PrivacyPlan
from privflow.privacy.fingerprint import keyed_fingerprint, store_key
from privflow.privacy.ledger import Ledger, Lineage, attempt_run_id
from privflow.privacy.mechanisms import validation_gate
from privflow.privacy.mechanisms.validation_gate import gate_floor, gate_limit
from privflow.tasks import mlflow_store as store_ml
from privflow.tasks.evaluation import worker as diagnostics_worker
from privflow.tasks.evaluation.stage import evaluate_run
from privflow.tasks.fit import FitResult, Spend, fit, prepare
from privflow.tasks.mlflow_store import Registered, register_model
from privflow.tasks.promote import PromotionSettings, promote_if_better
from privflow.tasks.run_plan import plan_privacy
from privflow.tasks.stream import FirstPass, first_pass, stream_prepare
from privflow.tasks.train import cpu_threads
from privflow.tasks.validate import validate_data
from privflow.tasks.warm_start import (
    Parent,
    record_charged_rows,
    record_charged_sample,
    record_generated_table,
    record_registered_version,
    resolve_parent,
)


@dataclass(frozen=True)
class RunSummary:
    """What a run produced, as the CLI prints it and Python callers receive it."""

    run_id: str
    mlflow_run_id: str
    model_name: str
    model_version: str
    alias: str
    alias_version: str | None
    promotion: str
    epsilon: float  # the version's: its private lineage composed (privacy rule 9); else this run's own
    delta: float  # the delta `epsilon` is stated at (the dataset's with a private parent, else the run's)
    epsilon_rdp: float  # RDP cross-check of this run's own events
    dataset_epsilon: float
    stages: dict[str, float]
    synthetic_path: str
    curator_dir: str
    report_path: str | None
    metrics: dict[str, float]
    failing_rows_dp: float
    wall_seconds: float
    dataset_delta: float = 0.0  # the delta dataset_epsilon is stated at: the dataset budget's, not the run's
    init_from: str | None = None  # a warm start's parent version, NAME/VERSION
    release_note: str | None = None  # why the release is not a trained flow (FitResult.release_note)
    diagnostics_note: str | None = None  # curator-only: diagnostics skipped, and why (never released)
    epsilon_run: float = 0.0  # this run alone: PLD composition of its own recorded events, at delta_run
    delta_run: float = 0.0  # this run's delta
    lineage: str | None = None  # the versions the weights descend from: NAME/V -> ... -> this version
    lineage_runs: tuple[str, ...] = ()  # the ledger runs whose events `epsilon` composes, oldest first
    # wall-clock seconds per stage (core/timing.py), for the console under --verbose: never released
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _TimedSpend(Spend):
    """The run's `Spend`, which also times each mechanism from its start to its event (stage
    times, core/timing.py), named by the plan's stage whose event it is. The validation gate's
    count runs inside the read and is timed with it."""

    def __init__(self, plan: PrivacyPlan) -> None:
        super().__init__()
        self._names = [(s.event, s.name) for s in plan.stages]
        self._t0: float | None = None

    def start(self) -> None:
        super().start()
        self._t0 = time.perf_counter()

    def add(self, event: Event) -> None:
        super().add(event)
        if self._t0 is None:
            return
        seconds, self._t0 = time.perf_counter() - self._t0, None
        name = next((n for e, n in self._names if e == event), None)
        if name is None:  # the trainer's or selection's own event, when it differs from the plan's
            name = "train" if isinstance(event, PoissonGaussianEvent) else "select"
        if name != "validate":
            timing.record(_MECHANISM_STAGES.get(name, name), seconds)


# how the plan's stages show in the stage times (core/timing.py)
_MECHANISM_STAGES = {"train": "train (DP-SGD)", "select": "select (Report-Noisy-Max)"}


def _read_and_gate(
    config: RunConfig,
    schema: Schema,
    plan: PrivacyPlan,
    curator: Path,
    spend: Spend,
    runner: StepRunner,
    work: Path | None = None,
    show_progress: bool = False,
) -> tuple[Any, validation_gate.GateDecision]:
    """Read the rows and let the DP gate decide on them; the exact report stays with the curator.
    Returns the clean table, or for a streamed run (`work`: its scratch folder) what the first
    pass over the chunks keeps (tasks/stream.py)."""
    stage = plan.stage("validate")
    threshold, floor = gate_limit(config, schema, plan), gate_floor(config, schema, plan)
    decisions: list[validation_gate.GateDecision] = []

    def gate(failing: int, passing: int, cells: validation_gate.RowCells | None = None) -> bool:
        spend.start()
        decisions.append(validation_gate.gate(failing, threshold, stage.event, passing, floor, cells))  # type: ignore[arg-type]
        spend.add(stage.event)
        return decisions[-1].stop

    df: pl.DataFrame | FirstPass
    try:
        if work is None:
            df, report = runner(validate_data, config.data, schema, config.policy, curator / "quarantine.csv", gate)
        else:
            quarantine = curator / "quarantine.csv"
            df, report = runner(first_pass, config, schema, plan, work, gate, quarantine, show_progress)
    except ValidationFailed as exc:
        failed = getattr(exc, "report", None)
        if failed is not None:
            write_json(curator, "validation.json", failed.to_dict())
        if not decisions:
            raise
        raise GateStopped(  # its own exit status (core/errors.py, ExitStatus.GATE_STOPPED)
            f"The validation gate stopped the run ({config.policy} policy): {decisions[-1].describe()}. "
            f"The exact per-column counts are in the curator-only report {curator / 'validation.json'}. "
            f"The gate's DP count cost epsilon={decisions[-1].epsilon:.3g}, which the ledger has charged; "
            + (
                "nothing else was spent. Check that --data is the whole table, or correct the schema's "
                "dataset.expected_rows."
                if decisions[-1].too_few
                else "nothing else was spent. Fix the rows (or the schema's bounds), or raise the policy's limit "
                + (
                    "(gate.strict_max_failing), or use --policy quarantine."
                    if config.policy == "strict"
                    else "(gate.quarantine_max_failing)."
                )
            )
            + f" {CHECK_ADVICE}"
        ) from None
    write_json(curator, "validation.json", report.to_dict())
    store_ml.log_gate(decisions[-1].noisy_failing)
    return df, decisions[-1]


def _diagnose(
    config: RunConfig,
    schema: Schema,
    codec: Codec | CopulaCodec | TargetCodec,
    flow: torch.nn.Module,
    df: pl.DataFrame,
    x_train: np.ndarray,
    x_val: np.ndarray,
    synthetic: pl.DataFrame,
    curator: Path,
    extra: dict[str, Any],
    test: _TestTable,
    runner: StepRunner,
) -> tuple[dict[str, float], str | None, str | None]:
    """Evaluation on the real rows, written to the curator-only folder (never to MLflow):
    (metrics, report path, a note for the curator when part or all of it was skipped).

    Diagnostics come after the release and spend nothing: a test file none of whose rows pass
    its checks, or any other failure in them, is noted (curator-only) and never costs the
    run its registered model."""
    write_json(curator, "training.json", extra)
    test_df, notes = test.df, list(test.notes)
    try:
        if test.error is not None:  # reading it failed (`_read_test`): the diagnostics fail as they did
            raise test.error
        if df.height == 0:
            return {}, None, _note(curator, notes)
        t0 = time.perf_counter()
        evaluation = runner(
            evaluate_run,
            schema,
            codec,
            flow,
            df,
            x_train,
            x_val,
            test_df,
            synthetic,
            config.evaluate,
            curator / "evaluation",
        )
        parts = {k: v for k, v in evaluation.timings.items() if k != "total"}
        # the evaluation's own timings (tasks/evaluation/stage.py, evaluation/report.py)
        for part, seconds in parts.items():
            timing.record(f"evaluate/{part}", seconds)
        timing.record("evaluate/other (HTML, checks)", max(0.0, time.perf_counter() - t0 - sum(parts.values())))
    except Exception as exc:  # noqa: BLE001 - the release stands; the curator is told what failed
        notes.append(f"diagnostics failed ({type(exc).__name__}: {exc})")
        return {}, None, _note(curator, notes)
    metrics = {k: float(v) for k, v in evaluation.metrics.items() if np.isfinite(v)}
    write_json(curator, "metrics.json", {"metrics": metrics})
    return metrics, str(evaluation.html_path) if evaluation.html_path is not None else None, _note(curator, notes)


@dataclass
class _TestTable:
    """The real test table of the diagnostics (--test-data), read before training (`_read_test`)."""

    df: pl.DataFrame | None = None
    notes: tuple[str, ...] = ()
    error: Exception | None = None  # raised again inside the diagnostics, which note it


def _read_test(config: RunConfig, schema: Schema, curator: Path) -> _TestTable:
    """The test table, validated as the diagnostics use it, read while training has not begun so
    that the utility's reference can be computed meanwhile (tasks/evaluation/worker.py). Nothing
    in it can stop the run: a failure is kept for the diagnostics to note (curator-only)."""
    if config.evaluate.test_data is None:
        return _TestTable()
    try:
        with timing.stage("read + validate test table (diagnostics)"):
            df, _ = validate(
                read_table(config.evaluate.test_data, max_line_bytes=schema.dataset.max_line_bytes),
                schema,
                "quarantine",
                curator / "test_quarantine.csv",
            )
    except ValidationFailed as exc:
        return _TestTable(notes=(f"--test-data was not used: {exc}",))
    except Exception as exc:  # noqa: BLE001 - the diagnostics' failure, noted there
        return _TestTable(error=exc)
    return _TestTable(df=df)


def _utility_ahead(config: RunConfig, schema: Schema, df: pl.DataFrame, test: _TestTable) -> None:
    """Hand the utility's reference (classifiers trained on the real rows; no model needed) to
    the diagnostics worker, to run while DP-SGD trains; `evaluate` takes its records later."""
    if diagnostics_worker.current() is None or test.df is None or test.df.height == 0 or df.height == 0:
        return
    from privflow.tasks.evaluation.utility import classify_ahead  # scikit-learn: only for utility

    # the arguments `evaluate` (tasks/evaluation/report.py) calls the reference with: its seed 0
    classify_ahead(lower(schema), df, test.df, config.evaluate.repeats)


def _wants_worker(config: RunConfig, schema: Schema) -> bool:
    """Whether the diagnostics train classifiers, the work a second process shares."""
    return config.evaluate.utility and schema.target is not None and config.evaluate.test_data is not None


def _note(curator: Path, notes: list[str]) -> str | None:
    """The curator's note on skipped diagnostics, also kept in the curator-only folder."""
    if not notes:
        return None
    text = " ".join(" ".join(n.split())[:600] for n in notes)
    write_json(curator, "diagnostics_notes.json", {"notes": notes})
    return text


def _settle_failure(ledger: Ledger, run_id: str, spend: Spend) -> None:
    """A failed run's truthful record: nothing read -> released; stopped between mechanisms ->
    charged what it spent; broken inside a mechanism -> the whole reservation stays counted."""
    if spend.in_mechanism:
        ledger.abandon(run_id)
    elif spend.events:
        ledger.settle(run_id, spend.events)
    else:
        ledger.release(run_id)


def _compare_with_holder(
    config: RunConfig, model_name: str, registered: Registered, store: Path, run_id: str, runner: Runner
) -> Registered:
    """`--promote if-better` with a holder: the DP comparison decides (its own ledger entry)."""
    holder = registered.alias_version
    if config.promotion != "if_better" or holder is None or holder == registered.version:
        return registered
    settings = PromotionSettings(alias=config.alias)
    # each attempt reserves under its own number (Prefect's task run count; in process it runs once)
    decision = runner(
        promote_if_better,
        model_name,
        registered.version,
        config,
        settings,
        str(store / "ledger.db"),
        f"{run_id}:promote",
        runner.attempt,
    )
    now = registered.version if decision.promoted else (decision.champion_version or holder)  # read under the lock
    return Registered(
        registered.version,
        now,
        f"@{config.alias} {'moved to' if decision.promoted else 'kept on'} v{now}: {decision.reason}",
    )


def _reserve(
    config: RunConfig,
    schema: Schema,
    store: Path,
    run_id: str,
    runner: StepRunner,
    lineage: str | None = None,
    links: Sequence[tuple[str, str | None]] = (),
    plan: PrivacyPlan | None = None,
) -> tuple[PrivacyPlan, Ledger]:
    """Plan and reserve: public inputs only, before any row is read. `plan` is pre-flight's,
    handed down (computed once); without it (a flow a server or a deployment started) the plan
    step computes it, through `runner`. A warm start's ledger entry names its parent
    (`lineage`), and the ledger links the run to each of its parents (`links`, `_parent_link`)
    for the version's lineage epsilon."""
    plan = plan if plan is not None else runner(plan_privacy, config, schema)
    ledger = Ledger(store / "ledger.db")
    budget = schema.dataset.budget
    ledger.ensure_dataset(schema.dataset.name, budget.epsilon, budget.delta, None)
    stages = {s.name: f"eps {s.epsilon_alone:.4g} alone" for s in plan.stages}
    if lineage is not None:
        stages["init_from"] = lineage
    ledger.reserve(schema.dataset.name, run_id, plan.events, stages)
    for parent, parent_run in links:
        ledger.record_parent(run_id, parent, parent_run)
    report_event(f"reserved {run_id}")  # to a watcher (core/events.py): the reservation is recorded
    return plan, ledger


def _parent_link(parent: Parent | None, schema: Schema) -> list[tuple[str, str | None]]:
    """The ledger links of the version's lineage (privacy rule 9), every one of them: a warm
    start's parent version with its ledger node as the ledger recorded it (None for a public
    pretraining), and the run's own schema draft (`dataset.draft_run`), a private ancestor too."""
    links: list[tuple[str, str | None]] = []
    if parent is not None:
        links.append((parent.spec, parent.ledger_run))
    if schema.dataset.draft_run:
        links.append(("schema draft", schema.dataset.draft_run))
    return links


def _account(
    ledger: Ledger, run_id: str, dataset: str, plan: PrivacyPlan, fitted: FitResult, spend: Spend
) -> tuple[dict[str, float], Lineage]:
    """Settle the run with what it spent; the accountant's epsilon of the run alone (PLD; RDP as
    a cross-check), and the version's (`epsilon`, `delta`): its lineage's, the ledger's
    composition of its private chain (privacy rule 9), or the run's own without a private parent."""
    ledger.settle(run_id, spend.events)
    figures = {
        "epsilon_run": PLDAccountant().epsilon(spend.events, plan.delta),
        "epsilon_rdp": RDPAccountant().epsilon(spend.events, plan.delta),
        "delta_run": plan.delta,
    }
    lineage = ledger.lineage(run_id)
    if lineage.private_parents:
        figures["epsilon"], figures["delta"] = lineage.epsilon, lineage.delta
    else:
        figures["epsilon"], figures["delta"] = figures["epsilon_run"], plan.delta
    figures["dataset_epsilon"], figures["dataset_delta"] = ledger.spent(dataset)
    store_ml.log_cumulative_epsilon(fitted.cumulative_epsilon)
    store_ml.log_spend(
        spend.events,
        figures["epsilon_run"],
        figures["epsilon_rdp"],
        plan.delta,
        figures["dataset_epsilon"],
        fitted.train.steps + 1,
        (figures["epsilon"], figures["delta"]),
    )
    return figures, lineage


def _chain(lineage: Lineage, model_name: str, version: str) -> str:
    """The version's lineage as shown: its ancestors (a public root marked), then itself."""
    return " -> ".join([*lineage.parents, f"{model_name}/{version}"])


def _release_table(
    config: RunConfig, schema: Schema, fitted: FitResult, store: Path, run_id: str
) -> tuple[pl.DataFrame, Path, str | None]:
    """The synthetic table from the chosen checkpoint(s): an explicit generator, a public size.
    Returned as sampled (modelled columns, for the diagnostics), written as the input is, with a
    note when the schema's rules left rows out.

    Every row meets the schema's rules (rows that break one are redrawn). The budget is spent by
    now, so a model that almost never meets a rule does not fail the run: the table is then the
    rows of one draw of the public size that meet every rule, and the note says how many were
    left out (a fact of the released model and the public seed, not of the private rows)."""
    from privflow.core.errors import ConfigError
    from privflow.data import rules

    n_rows = config.evaluate.rows(schema.dataset.expected_rows)
    note = None
    try:
        synthetic = fitted.sample(n_rows, seed=config.evaluate.sampling_seed)
    except ConfigError:
        if not schema.rules:
            raise
        drawn = rules.reflected(schema, fitted.sample(n_rows, seed=config.evaluate.sampling_seed, rules=False))
        synthetic = drawn.filter(pl.Series(~rules.broken(schema, drawn).to_numpy().any(axis=1)))
        note = (
            f"the released model rarely meets the schema's rules: {drawn.height - synthetic.height:,} of the "
            f"{drawn.height:,} rows drawn for the synthetic table broke one and were left out"
        )
    table = to_surface(synthetic, schema)  # dates as text in their format, booleans as labels
    path = write_table(table, store / "synthetic" / f"{schema.dataset.name}-{run_id}.csv")  # whole or none
    store_ml.log_synthetic(path)
    return synthetic, path, note


def _register(
    config: RunConfig,
    schema: Schema,
    model_name: str,
    fitted: FitResult,
    figures: dict[str, float],
    lineage: Lineage,
    run_id: str,
    runner: StepRunner,
) -> Registered:
    registered = runner(
        register_model,
        model_name,
        config.alias,
        schema,
        config.model.name,
        config.model.model_dump(exclude={"name"}),
        fitted.states,
        {
            "epsilon": f"{figures['epsilon']:.6g}",
            "delta": f"{figures['delta']:g}",
            "epsilon_run_alone": f"{figures['epsilon_run']:.6g}",
            "delta_run_alone": f"{figures['delta_run']:g}",
            "dataset": schema.dataset.name,
            "dataset_epsilon_cumulative": f"{figures['dataset_epsilon']:.6g}",
            "privflow_run_id": run_id,
            "chosen_checkpoint_steps": json.dumps(fitted.chosen_steps),
            "release": "independent-copula" if fitted.copula_only or fitted.fell_back else "flow",
        },
        config.promotion,
        *release_parts(fitted.codec),  # DP marginals and target head, as release_codec reads them
    )
    store_ml.log_lineage(model_name, registered.version, _chain(lineage, model_name, registered.version), lineage.runs)
    return registered


def _record_release(
    ledger: Ledger, store: Path, schema: Schema, model_name: str, version: str, run_id: str, synthetic: Path
) -> None:
    """The ledger's own record of what the run released (privacy rule 9): the registered version
    with its run and weights' digest (warm starts read a private parent's run from it, never from
    tags), and the keyed row digests of its synthetic table as read back (a pretraining on that
    table links this run)."""
    record_registered_version(ledger, model_name, version, run_id)
    record_generated_table(store, model_name, version, synthetic, schema)


def _record_charged(ledger: Ledger, store: Path, schema: Schema, run_id: str, read: pl.DataFrame | FirstPass) -> None:
    """The keyed digests of the rows this run read that passed validation (curator-only, in the
    ledger), so that `privflow pretrain` and a run under another dataset name refuse them: all of
    them, or for a streamed run (`read` is its first pass; its rows are never held whole) their
    keyed sample (privacy/fingerprint.py, `sampled`)."""
    if isinstance(read, FirstPass):
        record_charged_sample(ledger, schema.dataset.name, run_id, read.row_sample, read.rows)
    else:
        record_charged_rows(ledger, store, schema.dataset.name, run_id, read)


def _summary(
    config: RunConfig,
    plan: PrivacyPlan,
    run_id: str,
    mlflow_run_id: str,
    model_name: str,
    registered: Registered,
    figures: dict[str, float],
    lineage: Lineage,
    outputs: dict[str, Any],
    metrics: dict[str, float],
    decision: validation_gate.GateDecision,
    started: float,
) -> RunSummary:
    return RunSummary(
        run_id=run_id,
        mlflow_run_id=mlflow_run_id,
        model_name=model_name,
        model_version=registered.version,
        alias=config.alias,
        alias_version=registered.alias_version,
        promotion=registered.promotion,
        epsilon=figures["epsilon"],
        delta=figures["delta"],
        epsilon_run=figures["epsilon_run"],
        delta_run=plan.delta,
        lineage=_chain(lineage, model_name, registered.version),
        lineage_runs=lineage.runs,
        epsilon_rdp=figures["epsilon_rdp"],
        dataset_epsilon=figures["dataset_epsilon"],
        dataset_delta=figures["dataset_delta"],
        stages={s.name: s.epsilon_alone for s in plan.stages},
        metrics=metrics,
        failing_rows_dp=max(0.0, decision.noisy_failing),
        wall_seconds=time.monotonic() - started,
        **outputs,
    )


def run_pipeline(
    config: RunConfig, show_progress: bool = True, engine: bool = False, plan: PrivacyPlan | None = None
) -> RunSummary:
    """The chain once; `engine`: its steps as Prefect tasks (only inside a Prefect flow run,
    flows/train.py), otherwise as their plain functions (`train_in_process`); the runner
    (flows/steps.py) is picked here, once, and passed down. `plan`: the privacy plan pre-flight
    made from the same configuration, used as it is."""
    with timing.collecting() as times:  # the run's own stage times, handed back in the summary
        summary = _pipeline(config, show_progress, runner_for(engine), plan)
        times.add("pipeline total", summary.wall_seconds)
    return replace(summary, stage_seconds=times.as_dict())


def train_in_process(config: RunConfig, show_progress: bool = True, plan: PrivacyPlan | None = None) -> RunSummary:
    """The same chain without Prefect's engine (`privflow run --engine local`): no API, so no
    temporary server (what one adds to a run: benchmarks/results/overhead.md) and no flow or task
    run records.

    Prefect 3.8 cannot run a flow or a task without an API (its engines create their runs
    through a client; with ephemeral mode off and no PREFECT_API_URL they raise), so this calls
    the flow's steps as plain functions (flows/steps.py, `LOCAL`). Everything privflow records is
    the same: plan, ledger reservation and settlement, MLflow run, registered version, synthetic
    table; the ledger run id is a fresh UUID, as a flow run's id is. Registration keeps its retry
    policy (2 retries, flows/steps.py); every other step, the promotion comparison included, runs
    once.
    """
    return run_pipeline(config, show_progress, engine=False, plan=plan)


@dataclass
class _Run:
    """What the run set up before reading a row: the schema, store and model name, the warm
    start's parent, the ledger run with its reservation, the plan and what it spent so far."""

    config: RunConfig
    schema: Schema
    store: Path
    model_name: str
    parent: Any
    run_id: str
    plan: PrivacyPlan
    ledger: Ledger
    spend: _TimedSpend
    curator: Path
    started: float


@dataclass
class _Released:
    """What the run released and what the curator-only diagnostics read after it."""

    df: Any
    decision: validation_gate.GateDecision
    codec: Any
    x_train: Any
    x_val: Any
    test: _TestTable
    fitted: FitResult
    figures: dict[str, float]
    lineage: Lineage
    synthetic: pl.DataFrame
    synthetic_path: Path
    table_note: str | None
    registered: Registered
    mlflow_run_id: str


def _pipeline(config: RunConfig, show_progress: bool, runner: Runner, planned: PrivacyPlan | None = None) -> RunSummary:
    """The chain itself (module docstring): set up and reserve, read and release, compare with
    the alias holder, then the curator-only diagnostics; every step through `runner`, so with or
    without Prefect. Each stage's wall time goes to the open stage-time collector (core/timing.py)."""
    run = _set_up(config, runner, planned)
    try:
        with ExitStack() as outer:  # what outlives the release: the scratch folder and the diagnostics worker
            out = _read_and_release(run, outer, runner, show_progress)
            with timing.stage("promotion comparison"):
                out.registered = _compare_with_holder(
                    run.config, run.model_name, out.registered, run.store, run.run_id, runner
                )
                # the DP comparison with the holder is charged to the same dataset: the total counts it
                out.figures["dataset_epsilon"], out.figures["dataset_delta"] = run.ledger.spent(run.schema.dataset.name)
            # Everything released is out (model, version, alias, synthetic table, ledger): the
            # curator-only diagnostics come last, so that their failure, or a crash no handler
            # sees (a memory kill, a native fault), cannot decide whether a version is released.
            metrics, report_path, diagnostics_note = _diagnostics(run, out, runner)
    except BaseException:
        _settle_failure(run.ledger, run.run_id, run.spend)
        raise
    outputs = {
        "synthetic_path": str(out.synthetic_path),
        "curator_dir": str(run.curator),
        "report_path": report_path,
        "init_from": run.config.init_from,
        "release_note": "; ".join(n for n in (out.fitted.release_note, out.table_note) if n) or None,
        "diagnostics_note": diagnostics_note,
    }
    return _summary(
        run.config,
        run.plan,
        run.run_id,
        out.mlflow_run_id,
        run.model_name,
        out.registered,
        out.figures,
        out.lineage,
        outputs,
        metrics,
        out.decision,
        run.started,
    )


def _set_up(config: RunConfig, runner: Runner, planned: PrivacyPlan | None) -> _Run:
    """Schema, MLflow store, the warm start's parent and the ledger reservation: nothing read yet."""
    started = time.monotonic()
    schema = Schema.from_yaml(config.schema_path)
    store = config.store.resolve()
    store_ml.tracking(store)
    store_ml.experiment_for(schema.dataset.name, store)
    model_name = config.model_name or f"privflow-{schema.dataset.name}"
    # A warm start's parent, checked (tasks/warm_start.py) before anything is reserved or read,
    # and pinned to its version so that the params and the ledger name exactly the weights used.
    parent = resolve_parent(config, schema)
    if parent is not None:
        config = config.model_copy(update={"init_from": parent.spec})
    # One ledger entry per attempt: a retried flow run that reruns the mechanisms spends
    # again and is counted again; an attempt that read nothing releases its reservation.
    # Without the engine no flow run exists: prefect.runtime is not asked (it may call the API).
    flow_id, attempt = runner.flow_run()
    run_id = attempt_run_id(str(flow_id or uuid.uuid4()), attempt)
    plan, ledger = _reserve(
        config,
        schema,
        store,
        run_id,
        runner,
        parent.lineage() if parent is not None else None,
        _parent_link(parent, schema),
        planned,
    )
    spend = _TimedSpend(plan)
    try:
        budget = schema.dataset.budget
        ledger.ensure_dataset(
            schema.dataset.name, budget.epsilon, budget.delta, keyed_fingerprint(config.data, store_key(store))
        )
        curator = curator_dir(store, run_id)
    except BaseException:
        _settle_failure(ledger, run_id, spend)
        raise
    timing.record("run setup (schema, MLflow store, ledger reservation)", time.monotonic() - started)
    return _Run(config, schema, store, model_name, parent, run_id, plan, ledger, spend, curator, started)


def _read_and_release(run: _Run, outer: ExitStack, runner: Runner, show_progress: bool) -> _Released:
    """Inside the released MLflow run: read and gate the rows, the DP releases and the encoding,
    DP training and selection, the ledger's settlement, the synthetic table and the registered
    version. `outer` keeps the scratch folder and the diagnostics worker open after it."""
    config, schema, plan, spend = run.config, run.schema, run.plan, run.spend
    # fork_rng + a CSPRNG seed: whatever global draw happens after rows are read is
    # neither derivable from public values nor left behind in the caller's RNG.
    opened = time.perf_counter()
    with (
        cpu_threads(config.train.threads),
        torch.random.fork_rng(devices=[]),
        store_ml.released_run(schema.dataset.name, f"{schema.dataset.name}-eps{config.privacy.epsilon:g}") as active,
    ):
        torch.manual_seed(secrets.randbits(63))
        store_ml.log_run_header(config, plan, run.run_id, schema.dataset.name)
        timing.record("MLflow run open + header", time.perf_counter() - opened)
        work = run.curator / "scratch" if streamed(config, schema) else None
        outer.enter_context(scratch(work) if work is not None else nullcontext())
        # a second process for the curator-only diagnostics, started before the rows are read
        # (a fresh interpreter: nothing of this one) and ended after them
        outer.enter_context(diagnostics_worker.diagnostics_worker(_wants_worker(config, schema)))
        with timing.stage("read + validate + gate"):
            df, decision = _read_and_gate(config, schema, plan, run.curator, spend, runner, work, show_progress)
            _record_charged(run.ledger, run.store, schema, run.run_id, df)
        with timing.remainder("encode rows"):
            x_train: np.ndarray | DiskRows
            x_val: np.ndarray | DiskRows
            if work is None:
                codec, x_train, x_val = prepare(config, schema, df, plan, spend, runner)
            else:  # the table in chunks: df becomes the diagnostics' sample of clean rows
                codec, x_train, x_val, df = stream_prepare(config, schema, plan, spend, df, work, runner, show_progress)
        test = _read_test(config, schema, run.curator)
        _utility_ahead(config, schema, df, test)
        with timing.remainder("model build + head calibration"):
            fitted = fit(
                config,
                schema,
                codec,
                x_train,
                x_val,
                plan=plan,
                spend=spend,
                show_progress=show_progress,
                runner=runner,
                init_state=run.parent.state if run.parent is not None else None,
            )
        with timing.stage("accounting (ledger settle, PLD, MLflow metrics)"):
            figures, lineage = _account(run.ledger, run.run_id, schema.dataset.name, plan, fitted, spend)
        with timing.stage("synthetic table (sample, write, log)"):
            synthetic, synthetic_path, table_note = _release_table(config, schema, fitted, run.store, run.run_id)
        with timing.stage("register (MLflow model, registry version)"):
            registered = _register(config, schema, run.model_name, fitted, figures, lineage, run.run_id, runner)
            _record_release(
                run.ledger, run.store, schema, run.model_name, registered.version, run.run_id, synthetic_path
            )
        closing = time.perf_counter()
    timing.record("MLflow run close", time.perf_counter() - closing)
    return _Released(
        df, decision, codec, x_train, x_val, test, fitted, figures, lineage, synthetic, synthetic_path, table_note,
        registered, active.info.run_id,
    )  # fmt: skip


def _diagnostics(run: _Run, out: _Released, runner: Runner) -> tuple[dict[str, float], Any, str | None]:
    """The curator-only evaluation (never released), in its own threads and RNG fork."""
    with (
        timing.stage("evaluate (curator-only diagnostics)"),
        cpu_threads(run.config.train.threads),
        torch.random.fork_rng(devices=[]),
    ):
        return _diagnose(
            run.config,
            run.schema,
            out.codec,
            out.fitted.flows[0],
            out.df,
            out.x_train,
            out.x_val,
            out.synthetic,
            run.curator,
            out.fitted.diagnostics(),
            out.test,
            runner,
        )
