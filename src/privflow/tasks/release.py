"""What a run releases to MLflow, and the allowlist that says why each entry may be there.

Released means the MLflow run behind a registered model, the registered version and model,
the synthetic table and the publishable ledger summary (docs/architecture.md, privacy rule 5).
Every param, metric, tag and artifact that reaches them must be public (configuration,
schema, code version) or the output of a recorded mechanism. The allowlist below is the
single place that says which, entry by entry; `tests/flows/test_release.py` lists a real
run's contents and fails on anything not covered here. Diagnostics on private rows go to
the curator-only store (privflow/core/curator.py); the logging itself is `tasks/mlflow_store.py`.
"""

from __future__ import annotations

import fnmatch

# pattern -> why it may be released
PARAMS: dict[str, str] = {
    "*": "public: the flattened run configuration (RunConfig); no field is read off the data",
}
TAGS: dict[str, str] = {
    "privflow.run_id": "public: the run's id in the ledger",
    "privflow.dataset": "public: the schema's dataset name",
    "privflow.code_version": "public: the privflow version that ran",
    "privflow.sampling_seed": "public: the sampling seed the user passed for the synthetic table",
    "privflow.lineage": "public: the chain of registered versions the weights descend from (--init-from, pinned)",
    "privflow.lineage_runs": "public: the ledger run ids whose recorded events the version's epsilon composes",
    "mlflow.*": "MLflow's own bookkeeping: run name, user, source entry point, logged-model history",
}
METRICS: dict[str, str] = {
    "plan.*.epsilon_alone": "public: the privacy plan (configuration and schema only)",
    "plan.*.share": "public: the privacy plan",
    "epsilon_cumulative": "public: the plan's events composed up to each checkpoint step",
    "epsilon": (
        "ledger: the version's epsilon, PLD composition of the recorded events of its private warm-start chain "
        "and this run at the dataset's delta (privacy rule 9); this run's own without a private parent"
    ),
    "delta": "public: the delta of the version's epsilon (the dataset's with a private parent, else the run's)",
    "epsilon_run_alone": "accountant: PLD composition of the events recorded for this run alone",
    "delta_run_alone": "public: the run's delta",
    "epsilon_rdp": "accountant: RDP composition of this run's events alone (a cross-check)",
    "dataset_epsilon_cumulative": "ledger: the dataset's total spend, as the publishable summary shows it",
    "gate.noisy_failing_rows": "mechanism: the validation gate's Laplace count (privacy/mechanisms/validation_gate.py)",
}
ARTIFACTS: dict[str, str] = {
    "privacy/plan.json": "public: the privacy plan",
    "privacy/events.json": "accountant input: the events spent (plan parameters, number of picks)",
    "synthetic/*": "mechanism output: sampled from the released model with a CSPRNG or public seed",
}
VERSION_TAGS: dict[str, str] = {
    "epsilon": "ledger: the version's epsilon, its private lineage's PLD composition (as the run's metric)",
    "delta": "public: the delta the version's epsilon is stated at",
    "epsilon_run_alone": "accountant: this run's own PLD epsilon",
    "delta_run_alone": "public: the run's delta",
    "privflow.lineage": "public: the chain of versions the weights descend from",
    "privflow.lineage_runs": "public: the ledger runs the version's epsilon composes",
    "dataset": "public: the schema's dataset name",
    "dataset_epsilon_cumulative": "ledger: the dataset's total spend",
    "privflow_run_id": "public: the run's id in the ledger",
    "chosen_checkpoint_steps": "mechanism: the steps Report-Noisy-Max picked",
    "release": "public: 'flow', or 'independent-copula' when the plan trained no flow or selection chose the start",
    "promoted": "registry decision: an alias set by policy or by the DP comparison",
    "privflow.promotion*": "mechanism: the DP promotion comparison (tasks/promote.py), its noisy margin and cost",
    "mlflow.*": "MLflow's own bookkeeping",
}
MODEL_TAGS: dict[str, str] = {
    "dataset_epsilon_cumulative": "ledger: the dataset's total spend",
    "mlflow.*": "MLflow's own bookkeeping",
}


# When: the run behind a release shows one moment only. MLflow stamps a run's start and end and
# every metric with the wall clock; the gaps between them are timings of the private work
# (reading and gating the rows, training), which grow with the private row count: a side
# channel no mechanism covers (privacy rule 8). So the run starts at, ends at, and logs every
# metric at `mlflow_store.release_moment()`, the start of its UTC day (`released_run`). The times
# MLflow's store stamps itself when privflow registers a version or moves an alias (its API
# takes none) are floored to the day right after, in privflow's own SQLite store
# (`mlflow_store.coarsen_registry_times`); with an operator's tracking server they stay the
# server's, to the millisecond (docs/privacy.md).
_REGISTRY_DAY = "floored to the start of its UTC day after each registration or alias move (coarsen_registry_times)"
TIMING: dict[str, str] = {
    "run.start_time": "the start of the UTC day the run began (release_moment): a public calendar day",
    "run.end_time": "equal to the start time: the run's duration is not released",
    "metric.timestamp": "every metric at the run's start time: no metric shows when it was computed",
    "model.utc_time_created": (
        "the MLmodel file's creation time: the start of the UTC day of the run (mlflow_store.model_created_day), "
        "written before the file is uploaded or registered"
    ),
    "version.creation_timestamp": f"registry: when `create_model_version` ran, {_REGISTRY_DAY}",
    "version.last_updated_timestamp": f"registry: the version's last change, {_REGISTRY_DAY}",
    "registered_model.creation_timestamp": f"registry: when the model's first version was registered, {_REGISTRY_DAY}",
    "registered_model.last_updated_timestamp": f"registry: its latest version or alias move, {_REGISTRY_DAY}",
    "logged_model.creation_timestamp": f"tracking: when `Model.log` created the logged-model record, {_REGISTRY_DAY}",
    "logged_model.last_updated_timestamp": f"tracking: the record's finalisation, {_REGISTRY_DAY}",
    "experiment.creation_time": f"tracking: when the dataset's experiment was made (its first run), {_REGISTRY_DAY}",
    "experiment.last_update_time": f"tracking: the experiment's last change, {_REGISTRY_DAY}",
    "ledger.created": "`privflow ledger show` prints a run's reservation and a note's time as the date only",
}


def reason(allowlist: dict[str, str], key: str) -> str | None:
    """Why `key` may be released under `allowlist`, or None when nothing covers it."""
    for pattern, why in allowlist.items():
        if fnmatch.fnmatchcase(key, pattern):
            return why
    return None


__all__ = [
    "ARTIFACTS",
    "METRICS",
    "MODEL_TAGS",
    "PARAMS",
    "TAGS",
    "TIMING",
    "VERSION_TAGS",
    "reason",
]
