"""Everything MLflow, in one place: tracking set-up, the dataset's experiment, what a run
logs (the release), the registry (versions, tags, aliases), and loading a version back (as the
one released-model type, `privflow.serving.release.Release`).

What may be logged, and why, is the allowlist in `tasks/release.py` (privacy rule 5); the
sampler that a registered version runs is the pyfunc in `privflow/serving/pyfunc.py`. The flows and
tasks call these functions; nothing else in privflow imports mlflow.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import mlflow.artifacts
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec
from mlflow.types import Schema as MLSchema

import privflow
from privflow.core import env
from privflow.core.config import RunConfig
from privflow.core.errors import ModelNotFound
from privflow.data.schema import Schema
from privflow.privacy.accounting.events import Event, events_to_json
from privflow.privacy.accounting.plan import PrivacyPlan
from privflow.serving.release import Release, load_release

# The released model's Python requirements; its code is the whole privflow package but demo/ (_sampler_package).
_REQUIREMENTS = ["torch>=2.13", "polars>=2.1", "pydantic>=2.6", "pyyaml>=6", "numpy", "pandas", "mlflow>=3.17,<3.18"]
PROMOTION_TAG = "privflow.promotion"

# -- tracking ---------------------------------------------------------------------------------


def tracking(store: Path) -> str:
    """Point MLflow at the SQLite store under `store` (or at MLFLOW_TRACKING_URI when an
    operator set one, e.g. a real tracking server); returns the URI."""
    store.mkdir(parents=True, exist_ok=True)
    uri = env.operator_tracking_uri() or f"sqlite:///{store.resolve() / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def experiment_for(dataset: str, store: Path) -> str:
    """The dataset's experiment, with artifacts under the store (not ./mlruns of the cwd).

    Under the store's lock (`store_lock`): the first use of a store creates MLflow's SQLite
    schema and the experiment, and two runs started together on a new store raced there (one
    failed in MLflow's migrations, or on 'table ... already exists')."""
    name = experiment_name(dataset)
    with store_lock(store):
        client = MlflowClient()
        if client.get_experiment_by_name(name) is None:
            # Against a tracking server, artifacts go through its --artifacts-destination.
            remote = mlflow.get_tracking_uri().startswith(("http://", "https://"))
            location = None if remote else (store.resolve() / "artifacts").as_uri()
            client.create_experiment(name, artifact_location=location)
    mlflow.set_experiment(name)
    return name


def experiment_name(dataset: str) -> str:
    """The MLflow experiment of a dataset's runs."""
    return f"privflow-{dataset}"


_HELD = threading.local()  # the stores whose lock this thread holds, and how deep


@contextmanager
def store_lock(store: Path) -> Iterator[None]:
    """An exclusive lock on the store across processes (an flock on `<store>/.mlflow.lock`),
    held while MLflow's database and experiments are set up; a no-op where flock is missing.

    Re-entrant within a thread: a holder that calls a function taking the lock again (the
    promotion, which coarsens the registry's times after moving the alias) goes on, where a
    second flock on a new descriptor would wait for itself forever."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (runs on one store are then the user's to serialise)
        yield
        return
    store.mkdir(parents=True, exist_ok=True)
    key = str(store.resolve())
    held: dict[str, int] = _HELD.__dict__.setdefault("depth", {})
    if held.get(key):
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    with open(store / ".mlflow.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        held[key] = 1
        try:
            yield
        finally:
            held.pop(key, None)
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- the registry's own clock (tasks/release.py, TIMING) -----------------------------------------

# Each statement floors the time columns MLflow's SQL store fills from its own clock to the
# start of their UTC day, for one registered model (:name): its versions, the model, the logged
# models behind its versions (by the version's `models:/<id>` source or its run), the
# experiments of those runs and logged models, and MLflow's Default experiment (id 0, made with
# the store's schema on its first run: its time would date that run to the millisecond).
# Flooring keeps every order between two times (creation before last update); NULL stays NULL.
_VERSION_RUNS = "SELECT run_id FROM model_versions WHERE name = :name AND run_id IS NOT NULL"
_LOGGED = (
    f"(source_run_id IN ({_VERSION_RUNS}) "
    "OR 'models:/' || model_id IN (SELECT source FROM model_versions WHERE name = :name))"
)
_COARSEN_SQL = (
    "UPDATE model_versions SET creation_time = creation_time - creation_time % :day, "
    "last_updated_time = last_updated_time - last_updated_time % :day WHERE name = :name",
    "UPDATE registered_models SET creation_time = creation_time - creation_time % :day, "
    "last_updated_time = last_updated_time - last_updated_time % :day WHERE name = :name",
    "UPDATE logged_models SET creation_timestamp_ms = creation_timestamp_ms - creation_timestamp_ms % :day, "
    f"last_updated_timestamp_ms = last_updated_timestamp_ms - last_updated_timestamp_ms % :day WHERE {_LOGGED}",
    "UPDATE experiments SET creation_time = creation_time - creation_time % :day, "
    "last_update_time = last_update_time - last_update_time % :day WHERE experiment_id IN "
    f"(SELECT experiment_id FROM runs WHERE run_uuid IN ({_VERSION_RUNS}) "
    f"UNION SELECT experiment_id FROM logged_models WHERE {_LOGGED} UNION SELECT 0)",
)


def own_store() -> Path | None:
    """The store whose SQLite database MLflow tracks and registers into right now, when that is
    privflow's own (`tracking(store)`: `sqlite:///<store>/mlflow.db`, no operator URI), else None."""
    if env.operator_tracking_uri() is not None:
        return None
    uri = mlflow.get_tracking_uri()
    prefix, suffix = "sqlite:///", "/mlflow.db"
    if not uri.startswith(prefix) or not uri.endswith(suffix) or mlflow.get_registry_uri() != uri:
        return None
    return Path(uri[len(prefix) :]).parent


def coarsen_registry_times(store: Path, model_name: str) -> bool:
    """Floor to the start of their UTC day (milliseconds since the epoch) the times MLflow's
    store stamps from its own clock when privflow registers a version or moves an alias, which
    its API cannot set: the creation and last-update times of `model_name`'s versions, of the
    registered model, of the logged models behind its versions, of their runs' experiments and
    of MLflow's Default experiment (tasks/release.py, TIMING). In one SQLite transaction, under
    the store's lock.

    Only for privflow's own store: MLflow must track and register into
    `sqlite:///<store>/mlflow.db` and no operator tracking URI be set. With any other tracking
    or registry URI (a tracking server, another database) it does nothing and returns False;
    those times are then the server's to keep (docs/privacy.md). Returns True once rewritten.

    The run's own times and metric timestamps are written at the day already (`released_run`),
    so they are not touched here."""
    db = store.resolve() / "mlflow.db"
    if own_store() != db.parent or not db.exists():
        return False
    with store_lock(store), closing(sqlite3.connect(db, timeout=60.0, isolation_level=None)) as con:
        con.execute("BEGIN IMMEDIATE")
        try:
            for statement in _COARSEN_SQL:
                con.execute(statement, {"name": model_name, "day": _DAY_MS})
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    return True


def _coarsen_own(model_name: str) -> None:
    """`coarsen_registry_times` on the store MLflow points at, when it is privflow's own."""
    store = own_store()
    if store is not None:
        coarsen_registry_times(store, model_name)


# -- what a run logs (tasks/release.py says why each entry may be there) -------------------------

_DAY_MS = 86_400_000


def release_moment(now_ms: int | None = None) -> int:
    """The one time a released run shows (tasks/release.py, TIMING): the start of the UTC day
    it began, in milliseconds. Its start, its end and every metric's timestamp are this value,
    so nothing in the run tells how long reading, validating or training took (which grows
    with the private row count)."""
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    return now - now % _DAY_MS


@contextmanager
def released_run(dataset: str, run_name: str) -> Iterator[Any]:
    """`mlflow.start_run` for a run behind a release, made timeless: created with its start at
    `release_moment()`, and on exit (finished or failed) its end set to the same moment. The
    metrics logged through this module carry that moment too (`_moment`)."""
    client = MlflowClient()
    experiment = client.get_experiment_by_name(experiment_name(dataset))
    if experiment is None:
        raise RuntimeError(f"experiment_for('{dataset}', store) must run before released_run")
    moment = release_moment()
    created = client.create_run(experiment.experiment_id, start_time=moment, run_name=run_name)
    run_id = created.info.run_id
    status = "FAILED"
    try:
        with mlflow.start_run(run_id=run_id) as active:
            yield active
        status = "FINISHED"
    finally:
        # mlflow.end_run stamped the wall-clock end; replace it by the start's moment
        client.set_terminated(run_id, status=status, end_time=moment)


def _moment() -> int:
    """The timestamp of every metric of the active run: its start (`released_run`: the day)."""
    run = mlflow.active_run()
    return int(run.info.start_time) if run is not None else release_moment()


def flat_params(config: RunConfig) -> dict[str, Any]:
    """The run configuration as `section.field` params."""
    out: dict[str, Any] = {}
    for section, values in config.model_dump(mode="json").items():
        if isinstance(values, dict):
            out.update({f"{section}.{k}": v for k, v in values.items()})
        else:
            out[section] = values
    return out


def log_run_header(config: RunConfig, plan: PrivacyPlan, run_id: str, dataset: str) -> None:
    """Params, tags and the plan: everything public, logged before any row is read."""
    mlflow.log_params(flat_params(config))
    tags = {"privflow.run_id": run_id, "privflow.dataset": dataset, "privflow.code_version": privflow.__version__}
    if config.evaluate.sampling_seed is not None:
        tags["privflow.sampling_seed"] = str(config.evaluate.sampling_seed)
    mlflow.set_tags(tags)
    mlflow.log_dict(plan.to_dict(), "privacy/plan.json")
    at = _moment()
    mlflow.log_metrics({f"plan.{s.name}.epsilon_alone": s.epsilon_alone for s in plan.stages}, timestamp=at)
    mlflow.log_metrics({f"plan.{s.name}.share": s.share for s in plan.stages}, timestamp=at)


def log_gate(noisy_failing: float) -> None:
    """The validation gate's DP count (a mechanism output)."""
    mlflow.log_metric("gate.noisy_failing_rows", noisy_failing, timestamp=_moment())


def log_cumulative_epsilon(points: Iterable[tuple[int, float]]) -> None:
    """The accountant's epsilon after each checkpoint step (public: planned events composed)."""
    at = _moment()
    for step, eps in points:
        mlflow.log_metric("epsilon_cumulative", eps, step=step, timestamp=at)


def log_spend(
    spent: list[Event],
    epsilon: float,
    epsilon_rdp: float,
    delta: float,
    dataset_epsilon: float,
    final_step: int,
    lineage: tuple[float, float] | None = None,
) -> None:
    """The accountant's figures and the events they come from. `epsilon` and `delta` are this
    run alone; `lineage` (epsilon, delta) is the version's, the headline (privacy rule 9:
    the composition of its private warm-start chain; this run's own figure without one)."""
    at = _moment()
    headline = lineage if lineage is not None else (epsilon, delta)
    mlflow.log_metric("epsilon_cumulative", epsilon, step=final_step, timestamp=at)
    mlflow.log_metrics(
        {
            "epsilon": headline[0],
            "delta": headline[1],
            "epsilon_run_alone": epsilon,
            "delta_run_alone": delta,
            "epsilon_rdp": epsilon_rdp,
            "dataset_epsilon_cumulative": dataset_epsilon,
        },
        timestamp=at,
    )
    mlflow.log_text(events_to_json(spent), "privacy/events.json")


def log_lineage(name: str, version: str, chain: str, runs: Iterable[str]) -> None:
    """The version's lineage, on the version and on the active run behind it: the chain of
    versions its weights descend from (NAME/V -> ... -> this version; a public root marked) and
    the ledger runs whose events its epsilon composes."""
    tags = {"privflow.lineage": chain, "privflow.lineage_runs": json.dumps(list(runs))}
    mlflow.set_tags(tags)
    client = MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)


def log_synthetic(path: Path) -> None:
    """The synthetic table (sampled from the released model)."""
    mlflow.log_artifact(str(path), "synthetic")


def log_refusal(run_name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
    """A KILLED run in the current experiment that records a refused run and why."""
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.set_tags(tags)
        mlflow.log_params(params)
    MlflowClient().set_terminated(run.info.run_id, status="KILLED")
    return str(run.info.run_id)


# -- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Registered:
    """The new version, the version holding the alias afterwards, and why."""

    version: str
    alias_version: str | None
    promotion: str


def signature_for(schema: Schema) -> Any:
    """The pyfunc signature from the PUBLIC schema (never inferred from rows): the columns of a
    synthetic table (no ignored column; dates and booleans as their text)."""
    kinds = {"numeric": "double", "integer": "long"}
    inputs = MLSchema([ColSpec("long", "n", required=False), ColSpec("long", "seed", required=False)])
    outputs = MLSchema([ColSpec(kinds.get(c.type, "string"), c.name) for c in schema.columns if c.type != "ignore"])
    params = ParamSchema([ParamSpec("n", "long", None), ParamSpec("seed", "long", None)])  # predict(params=...)
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def _sampler_package(tmp: Path) -> str:
    """The `privflow` package as the model's code, so that MLflow alone loads the sampler in a
    fresh process (`mlflow.pyfunc.load_model`, `mlflow models serve`): the whole package but the
    bundled demo tables, not a list of modules (a list fell behind the sampler's imports and the
    registered models stopped loading outside privflow)."""
    pkg = tmp / "code" / "privflow"
    shutil.copytree(Path(privflow.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "demo"))
    return str(pkg)


def alias_holder(client: MlflowClient, name: str, alias: str) -> str | None:
    """The version the alias points to, or None when the model or the alias does not exist."""
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def _log_generator(
    name: str,
    schema: Schema,
    model_name: str,
    model_config: dict[str, Any],
    states: list[dict],
    marginals: dict[str, Any] | None = None,
    head: dict[str, Any] | None = None,
) -> str:
    """Log the checkpoints as a pyfunc sampler ("models from code") and register a version."""
    from privflow.serving.release import write_artifacts

    with tempfile.TemporaryDirectory() as tmp:
        model = {"name": model_name, "config": model_config}
        artifacts = write_artifacts(Path(tmp), schema, model, states, marginals, head)
        # mlflow.pyfunc.log_model, with the MLmodel file's creation time set to the day (_DayStampedPyfunc)
        info = Model.log(
            artifact_path=None,
            name="generator",
            flavor=_DayStampedPyfunc(model_created_day(_moment())),
            flavor_name="pyfunc.ModelFromCode",  # what mlflow.pyfunc.log_model records for a model from code
            python_model=str(Path(privflow.__file__).parent / "serving" / "sampler_model.py"),
            artifacts=artifacts,
            code_paths=[_sampler_package(Path(tmp))],
            pip_requirements=_REQUIREMENTS,
            signature=signature_for(schema),
            registered_model_name=name,
        )
    return str(info.registered_model_version)


def model_created_day(moment_ms: int) -> str:
    """The MLmodel file's `utc_time_created` for a model logged at `moment_ms`: the start of its
    UTC day, in MLflow's own format ('YYYY-MM-DD 00:00:00'), as the released run's times are
    (tasks/release.py, TIMING): no time of day shows when training ended."""
    day = datetime.fromtimestamp(release_moment(moment_ms) / 1000, UTC).replace(tzinfo=None)
    return str(day)


class _DayStampedPyfunc:
    """`mlflow.pyfunc` as the flavor `Model.log` saves with, its MLmodel stamped with the day.

    MLflow sets `utc_time_created` to the wall clock when it builds the model's description and
    offers no argument for it; the flavor's `save_model` receives that description before the
    MLmodel file is written, uploaded and registered, so the day replaces the time there."""

    __name__ = "mlflow.pyfunc"

    def __init__(self, day: str) -> None:
        self.day = day

    def save_model(self, path: str, mlflow_model: Model, **kwargs: Any) -> Any:
        mlflow_model.utc_time_created = self.day
        return mlflow.pyfunc.save_model(path=path, mlflow_model=mlflow_model, **kwargs)


def register_model(
    name: str,
    alias: str,
    schema: Schema,
    model_name: str,
    model_config: dict[str, Any],
    states: list[dict],
    tags: dict[str, str],
    promotion: str = "if_better",
    marginals: dict[str, Any] | None = None,
    head: dict[str, Any] | None = None,
) -> Registered:
    """Log the selected checkpoint(s) as a pyfunc sampler, register a version, maybe set the alias.

    Safe to retry: it only writes DP outputs (weights chosen by Report-Noisy-Max) and the
    public schema, so a retry spends no privacy. `if_better` sets the alias here only when no
    version holds it (no comparison, no cost); otherwise the flow runs the DP comparison.

    Then the registry's own timestamps of the model are floored to the day
    (`coarsen_registry_times`, on privflow's own SQLite store only).
    """
    version = _log_generator(name, schema, model_name, model_config, states, marginals, head)
    client = MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    # The registered model carries the dataset's running total too (latest known figure).
    if "dataset_epsilon_cumulative" in tags:
        client.set_registered_model_tag(name, "dataset_epsilon_cumulative", tags["dataset_epsilon_cumulative"])
    registered = _set_alias(client, name, alias, version, promotion)
    # MLflow stamped the version, the model, the logged model (and any alias move) with its clock
    _coarsen_own(name)
    return registered


def _set_alias(client: MlflowClient, name: str, alias: str, version: str, promotion: str) -> Registered:
    """The alias after registering `version`: set at no cost where the promotion policy allows it."""
    holder = alias_holder(client, name, alias)
    if promotion == "always" or (promotion == "if_better" and holder is None):
        client.set_registered_model_alias(name, alias, version)
        why = (
            "every new version takes it (--promote always)"
            if promotion == "always"
            else ("no version held it yet: the first one takes it at no cost")
        )
        client.set_model_version_tag(name, version, "promoted", f"alias '{alias}' set: {why}")
        return Registered(version, version, f"@{alias} moved to v{version}: {why}")
    if promotion == "never":
        return Registered(version, holder, f"@{alias} left on {_v(holder)} (promotion: never)")
    return Registered(version, holder, f"@{alias} on {_v(holder)}: awaiting the DP comparison")


def _v(version: str | None) -> str:
    return f"v{version}" if version is not None else "no version"


def record_promotion(client: MlflowClient, decision: Any) -> Any:
    """Tag the candidate with a promotion decision (tasks/promote.py); on promotion, move the
    alias and tag the old champion. Then the registry's own timestamps of the model are floored
    to the day (`coarsen_registry_times`; the store's lock, which the promotion holds, is
    re-entrant)."""
    for key, value in decision.tags().items():
        client.set_model_version_tag(decision.model_name, decision.candidate_version, key, value)
    if decision.promoted:
        client.set_registered_model_alias(decision.model_name, decision.alias, decision.candidate_version)
        if decision.champion_version is not None and decision.champion_version != decision.candidate_version:
            client.set_model_version_tag(
                decision.model_name,
                decision.champion_version,
                f"{PROMOTION_TAG}.superseded_by",
                decision.candidate_version,
            )
    _coarsen_own(decision.model_name)
    return decision


# -- loading a version ------------------------------------------------------------------------


def load_version(name: str, version: str, tags: dict[str, str] | None = None) -> Release:
    """A registered version as its `Release` (`privflow.serving.release.load_release` on its
    artifacts, meta.json + checkpoints), with its number and the `tags` the caller read
    (`resolve_version`).

    Reads the artifacts directly instead of `mlflow.pyfunc.load_model`, so the bundled copies
    of `models/` and `privflow/` are not put on sys.path of this process.
    """
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp))
        files = {path.stem: path for path in (root / "artifacts").iterdir() if path.is_file()}
        return load_release(files, str(version), tags)


def resolve_version(spec: str) -> tuple[str, str, dict[str, str]]:
    """NAME@ALIAS or NAME/VERSION -> (name, version, the version's tags) in the current
    registry; ModelNotFound (a user error) when the model, alias or version does not exist."""
    model_uri(spec)  # the form of the reference
    client = MlflowClient()
    by_alias = "@" in spec
    name, key = spec.split("@", 1) if by_alias else spec.rsplit("/", 1)
    try:
        mv = client.get_model_version_by_alias(name, key) if by_alias else client.get_model_version(name, key)
    except MlflowException:
        known = {m.name: m for m in client.search_registered_models(max_results=20)}
        if name in known:  # the model is there; its alias or version is not
            model = known[name]
            aliases = ", ".join(f"@{a}" for a in sorted(getattr(model, "aliases", None) or {})) or "none"
            versions = ", ".join(sorted((str(v.version) for v in model.latest_versions or []), key=int)) or "none"
            raise ModelNotFound(
                f"Model '{name}' has no {'alias @' if by_alias else 'version '}{key} (its aliases: {aliases}; "
                f"latest version: {versions}). Pass NAME@ALIAS or NAME/VERSION of one it has."
            ) from None
        raise ModelNotFound(
            f"Model '{spec}' is not in the registry (registered models here: {', '.join(known) or 'none'}). "
            "Pass NAME@ALIAS or NAME/VERSION of a registered version (`privflow pretrain` registers one from "
            "public data)."
        ) from None
    return name, str(mv.version), dict(mv.tags or {})


def model_uri(spec: str) -> str:
    """NAME@ALIAS -> models:/NAME@ALIAS; NAME/VERSION -> models:/NAME/VERSION."""
    if "@" in spec:
        name, alias = spec.split("@", 1)
        if name and alias:
            return f"models:/{name}@{alias}"
    elif "/" in spec:
        name, version = spec.rsplit("/", 1)
        if name and version.isdigit():
            return f"models:/{name}/{version}"
    raise ModelNotFound(
        f"'{spec}' is not a model reference: use NAME@ALIAS (e.g. privflow-adult@champion) or NAME/VERSION."
    )


def open_registry(store: Path) -> None:
    """Point MLflow at the store's registry (or the operator's tracking server); ModelNotFound
    when the store has none, so that reading a model never creates a store."""
    db = store.resolve() / "mlflow.db"
    if env.operator_tracking_uri() is None and not db.exists():
        raise ModelNotFound(
            f"No MLflow store at '{db}': run `privflow run` (or `privflow demo`) first, or pass --store."
        )
    tracking(store)


def load_generator(spec: str, store: Path) -> Any:
    """Load the registered pyfunc sampler from the store's MLflow registry."""
    model_uri(spec)  # raises ModelNotFound on a malformed reference, before the store is touched
    open_registry(store)
    name, version, _ = resolve_version(spec)  # a missing alias or version: what the model has
    # MLflow puts the model's bundled code (a partial copy of privflow, `_sampler_package`) first
    # on sys.path. This process already runs the installed privflow; left there, the copy is
    # what a spawned child (a Dask worker, a process pool) imports, and it dies on the first
    # module the copy lacks ("No module named 'privflow.cli'"), leaving its parent waiting.
    path = list(sys.path)
    try:
        return mlflow.pyfunc.load_model(f"models:/{name}/{version}")
    except MlflowException as exc:
        raise ModelNotFound(f"Model '{spec}' could not be loaded ({exc.message.splitlines()[0]}).") from None
    finally:
        sys.path[:] = path


__all__ = [
    "Registered",
    "alias_holder",
    "coarsen_registry_times",
    "experiment_for",
    "experiment_name",
    "flat_params",
    "load_generator",
    "open_registry",
    "own_store",
    "load_version",
    "log_cumulative_epsilon",
    "log_gate",
    "log_lineage",
    "log_refusal",
    "log_run_header",
    "log_spend",
    "log_synthetic",
    "model_uri",
    "record_promotion",
    "register_model",
    "release_moment",
    "released_run",
    "resolve_version",
    "signature_for",
    "tracking",
]
