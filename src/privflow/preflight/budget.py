"""The ledger and the registry, before anything is reserved: the dataset has budget for the run's
plan, a DP-drafted schema's ledger run is in this store, a warm start's parent exists, the run's
synthetic table fits, and the notes a run prints about its budget's delta and its atoms."""

from __future__ import annotations

from pathlib import Path

from privflow.core.config import RunConfig
from privflow.core.errors import SchemaError, StoreError
from privflow.core.machine import check_memory, check_room
from privflow.data.schema import Schema
from privflow.preflight.arguments import nice_delta


def check_synthetic(config: RunConfig, schema: Schema) -> None:
    """The run's synthetic table (sampled in memory, evaluated, written to the store as CSV)
    fits in memory and on the store's disk: a run spends its budget before it samples."""
    n, columns = config.evaluate.rows(schema.dataset.expected_rows), len(schema.columns)
    fewer = "set evaluate.synthetic_rows lower in --config (its default is the schema's expected_rows)"
    check_memory(n, columns, f"The run's synthetic table of {n:,} rows", fewer)
    check_room(Path(config.store) / "synthetic" / "table.csv", n, columns, fewer[0].upper() + fewer[1:])


def _recorded_budget(config: RunConfig, schema: Schema) -> tuple[float, float]:
    """The dataset's (total, spent) epsilon: the ledger's record when there is one (it keeps its own)."""
    from privflow.privacy.ledger import Ledger

    path = config.store / "ledger.db"
    if path.exists():
        for record in Ledger(path).datasets():
            if record.name == schema.dataset.name:  # a schema that lowered it applies (Ledger.ensure_dataset)
                return min(record.budget_epsilon, schema.dataset.budget.epsilon), record.spent_epsilon
    return schema.dataset.budget.epsilon, 0.0


def check_draft_run(config: RunConfig, schema: Schema) -> None:
    """A schema drafted by DP names its ledger run (`dataset.draft_run`): the run's version composes
    with it (privacy rule 9), so that run must be in this store's ledger, for this dataset."""
    draft = schema.dataset.draft_run
    if draft is None:
        return
    from privflow.privacy.ledger import Ledger

    path = config.store / "ledger.db"
    runs = {r.run_id: r for r in Ledger(path).runs(schema.dataset.name)} if path.exists() else {}
    if draft not in runs:
        raise SchemaError(
            f"The schema was drafted by DP in ledger run '{draft}' (dataset.draft_run), which the ledger of store "
            f"'{config.store}' does not hold for dataset '{schema.dataset.name}': a model trained on it could not "
            "report its epsilon composed with the draft's. Run with the --store the draft was charged to, or "
            "remove `draft_run` only if the data owner restated every value of the schema from public knowledge."
        )


def check_budget(config: RunConfig, schema: Schema) -> object:
    from privflow.core.errors import BudgetExceeded
    from privflow.privacy.accounting.accountant import remember_on_disk
    from privflow.privacy.ledger import check_budget_at
    from privflow.tasks.run_plan import run_plan

    # Fast refusal before planning (which takes seconds at large epsilon): the plan composes to
    # within 1% under the target, and composing with earlier runs never lowers epsilon, so a
    # target above the whole budget can never fit.
    total, spent = _recorded_budget(config, schema)
    if config.privacy.epsilon * 0.99 > total:
        raise BudgetExceeded(
            f"This run was refused before reading any row: it asks for epsilon={config.privacy.epsilon:g}, more "
            f"than the whole budget of dataset '{schema.dataset.name}' (epsilon={total:g}; spent so far "
            f"epsilon={spent:.4g}; `privflow ledger show` gives the largest epsilon a next run can ask for). "
            "Lower --epsilon, or raise the "
            f"dataset's budget deliberately (`privflow ledger set-budget {schema.dataset.name} --epsilon E "
            "--delta D`) if the data owner agrees."
        )
    remember_on_disk()  # a plan made before from the same public inputs is looked up, not recomposed
    plan = run_plan(config, schema)
    budget = schema.dataset.budget
    check_budget_at(config.store / "ledger.db", schema.dataset.name, plan.events, (budget.epsilon, budget.delta))
    return plan


def budget_delta_note(schema: Schema) -> str | None:
    """A warning when the dataset's budget delta is not below 1 / expected_rows: the ledger states
    the dataset's cumulative epsilon at that delta, where it means little, and a run's own epsilon
    (stated at its smaller --delta) can then read higher than the dataset's total. A run's own
    delta that high is refused (`check_privacy_parameters`); the budget's is only noted, since
    the ledger may already hold runs under it."""
    rows, delta = schema.dataset.expected_rows, schema.dataset.budget.delta
    if rows is None or delta < 1.0 / rows:
        return None
    return (
        f"dataset '{schema.dataset.name}' has a budget delta of {delta:g}, not below 1/expected_rows = "
        f"{1.0 / rows:.3g}: the ledger states the dataset's cumulative epsilon at that delta, where the guarantee "
        "means little, so it can read lower than this run's own epsilon at its smaller delta. Lower "
        f"dataset.budget.delta in the schema, e.g. to {nice_delta(rows):g} (a lower budget applies at once)."
    )


def atoms_note(config: RunConfig, schema: Schema) -> str | None:
    """A warning when the schema declares atoms but the run has no DP marginals, the only place
    atoms act (privflow/data/copula.py): the schema codec smooths them like any value."""
    declared = [c.name for c in schema.columns if c.atoms]
    if not declared or config.marginals.enabled:
        return None
    return (
        f"the schema declares atoms for {declared}, but this run has no DP marginals (marginals.enabled is "
        "false), so the flow models those columns without them and their point masses come out smoothed; "
        "enable the marginals to keep them."
    )


def check_registry(store: Path, wanted: str, remedy: str) -> None:
    """A command that reads registered models has a registry to read: the store is a folder with
    MLflow's database, unless an operator's tracking server is configured. Nothing is created
    (a mistyped --store must not become a new, empty store)."""
    from privflow.core import env
    from privflow.core.errors import ModelNotFound

    p = Path(store)
    if p.exists() and not p.is_dir():
        raise StoreError(f"Store '{p}' is a file, not a folder; pass --store the folder privflow run wrote to.")
    db = p / "mlflow.db"
    if env.operator_tracking_uri() is None and not db.is_file():
        raise ModelNotFound(
            f"{wanted}: there is no model registry in the store '{p}' (no '{db.name}'). {remedy} Relative store "
            f"paths start in {Path.cwd()}."
        )


def check_init_from(config: RunConfig, schema: Schema) -> str:
    """The warm start's parent exists and fits this run; returns it as NAME/VERSION, so the
    run uses exactly the version checked here even if an alias moves meanwhile."""
    from privflow.core import env

    assert config.init_from is not None
    check_registry(
        config.store,
        f"--init-from {config.init_from}",
        "Register a parent first (`privflow pretrain` on public data, or `privflow run`) with the same --store.",
    )
    env.configure(config.store)  # offline, quiet settings before mlflow and prefect are imported
    from privflow.tasks import mlflow_store
    from privflow.tasks.warm_start import resolve_parent

    env.quiet_imported(False)
    mlflow_store.tracking(Path(config.store))
    parent = resolve_parent(config, schema)
    assert parent is not None
    return parent.spec


__all__ = [
    "atoms_note",
    "budget_delta_note",
    "check_budget",
    "check_draft_run",
    "check_init_from",
    "check_registry",
    "check_synthetic",
]
