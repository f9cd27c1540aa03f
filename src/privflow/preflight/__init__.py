"""Pre-flight: everything a user can get wrong that is checkable without reading a row value.

Runs in the CLI before `env.configure`, before Prefect, MLflow or Great Expectations is
imported (this module imports none of them) and before the ledger reserves anything
(docs/architecture.md, "Data flow of the training pipeline": preflight; privacy rule 7). Each check raises a
`PrivflowError` subclass whose message is one paragraph naming the problem and the fix:

- epsilon and delta finite and in range (epsilon at most `privacy.accounting.plan.MAX_EPSILON`, delta
  below 1/expected_rows and at most the dataset's budget delta);
- the schema parses;
- the data path exists, is a file, is readable, and its format (content, gzip, encoding, CSV
  delimiter) and header match the schema (no missing, undeclared or duplicate column);
  Parquet columns have a physical type that can hold the declared one. That is all it reads:
  no row is counted or looked at. How many rows there are and what they hold decide nothing
  here (privacy rule 8): the validation gate, a DP mechanism inside the flow, stops a run
  with too many failing rows or too few passing ones;
- the store folder can be created and written;
- the device is available (`auto` is resolved); `--workers N` fits it (`check_workers`);
- the test-data file, if given, exists and has the same header;
- the curator's data-identity check (tasks/dataset_identity.py): the one check here
  that reads the file's rows, for this purpose only, and only when the store's ledger holds
  charged row digests of another dataset: a table half or more of whose rows were charged to
  another dataset is refused (its outcome is for the store's operator; nothing is reserved).
  A streamed run is read chunk by chunk and compared by its rows' keyed sample;
- the dataset has budget left for the run's plan (`tasks.run_plan.run_plan`), checked
  against the ledger without reserving (`privacy.ledger.check_budget_at`);
- a warm start's parent (`--init-from`, `check_init_from`): it exists in the store's
  registry and fits the run (tasks/warm_start.py: identical schema columns, the same flow
  and codec space, a public pretraining or a private release of this dataset whose ledger
  run is in this store's ledger). The registry is MLflow's, so this one check imports
  MLflow (and Prefect, through the tasks package) after `env.configure`, and only when
  `--init-from` is given; it reads no row and reserves nothing.

`preflight_pretrain` is the same kind of check for `privflow pretrain` (public data: no plan,
no budget; a file the ledger knows as private is refused).

The public facts it returns (format, resolved device, the plan) are for the CLI's messages.

Layout: `arguments` (epsilon, delta, seed, the schema), `files` (the input and output files),
`budget` (the ledger, the registry, the run's notes); the machine's checks (device, workers,
memory, disk, store folder) are `privflow.core.machine`, the gate's limits
`privflow.privacy.mechanisms.validation_gate`. This module runs them in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError
from privflow.core.machine import (
    available_memory,
    check_memory,
    check_room,
    check_store,
    check_workers,
    nvidia_driver,
    resolve_device,
)
from privflow.data.schema import Schema
from privflow.preflight.arguments import check_privacy_parameters, check_seed, read_schema
from privflow.preflight.budget import (
    atoms_note,
    budget_delta_note,
    check_budget,
    check_draft_run,
    check_init_from,
    check_registry,
    check_synthetic,
)
from privflow.preflight.files import check_output, check_stream, check_table, public_rows
from privflow.privacy.mechanisms.validation_gate import gate_floor, gate_limit, gate_note

if TYPE_CHECKING:
    from privflow.privacy.accounting.plan import PrivacyPlan


@dataclass(frozen=True)
class Preflight:
    """What pre-flight established: the parsed schema, the privacy plan, the table's format,
    the resolved device, and how long each check took (seconds)."""

    config: RunConfig
    schema: Schema
    plan: PrivacyPlan | None  # imported lazily; None for pretraining (public data: no plan)
    data_format: str
    rows: int | None  # counted for a PUBLIC table only (pretraining); a private file's count is never known here
    device: str
    test_format: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # warnings that do not stop the run (`gate_note`), for the caller to show
    streamed: bool = False  # the table is read in chunks (`check_stream`)

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())


def preflight(config: RunConfig) -> Preflight:
    """Run every check in order, cheapest first; raise the first problem as a PrivflowError."""
    timings: dict[str, float] = {}

    def timed(name: str, fn, *args):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:  # a check run twice (the privacy parameters, before and with the schema) adds up
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    timed("privacy parameters", check_privacy_parameters, config)
    schema = timed("schema", read_schema, config)
    timed("privacy parameters", check_privacy_parameters, config, schema)
    fmt = timed("data file", check_table, config.data, schema, "Data file")
    streamed = timed("streaming", check_stream, config, schema)
    test_fmt = None
    if config.evaluate.test_data is not None:
        test_fmt = timed("test data", check_table, Path(config.evaluate.test_data), schema, "Test data file")
    timed("store", check_store, config.store)
    timed("schema draft", check_draft_run, config, schema)
    timed("synthetic table", check_synthetic, config, schema)
    device = timed("device", resolve_device, config.train.device)
    timed("workers", check_workers, config.train.workers, device)
    if config.init_from is not None:
        config = config.model_copy(update={"init_from": timed("warm start", check_init_from, config, schema)})
    if "promotion" not in config.model_fields_set:  # neither --promote nor the config's `promotion`: the schema's
        config = config.model_copy(update={"promotion": schema.dataset.promotion})
    from privflow.tasks.dataset_identity import check_rows_not_charged_elsewhere

    # a streamed run is read chunk by chunk and compared by its rows' keyed sample (tasks/dataset_identity.py)
    timed(
        "dataset identity",
        check_rows_not_charged_elsewhere,
        config.data,
        schema,
        config.store,
        schema.dataset.name,
        streamed,
    )
    plan = timed("plan and budget", check_budget, config, schema)
    candidates = (gate_note(config, schema, plan), budget_delta_note(schema), atoms_note(config, schema))
    notes = tuple(n for n in candidates if n)
    # `config` carries a warm start's parent resolved to NAME/VERSION: run the flow with it.
    return Preflight(
        config=config,
        schema=schema,
        plan=plan,
        data_format=fmt,
        rows=None,
        device=device,
        test_format=test_fmt,
        timings=timings,
        notes=notes,
        streamed=streamed,
    )


def preflight_audit(config: RunConfig, canaries: int | None = None) -> None:
    """`privflow audit`'s checks before Prefect or MLflow is imported: the privacy parameters,
    the schema, the data file's header and rows, the store (the audit charges no ledger), and
    that the model holds `canaries` gradient canaries (building it imports torch only; in the
    flow, the refusal would wait for Prefect's server and MLflow: benchmarks/results/overhead.md)."""
    check_privacy_parameters(config, delta_flag=False)  # audit has no --delta: its delta is the config's
    schema = read_schema(config)
    check_privacy_parameters(config, schema, delta_flag=False)
    check_table(config.data, schema, "Data file")
    check_store(config.store)
    if canaries is not None:
        from privflow.data.codec import Codec
        from privflow.data.lowering import lower
        from privflow.models import initial_flow
        from privflow.privacy.audit import canary_slots

        cardinalities = Codec.from_schema(lower(schema)).cardinalities
        model = initial_flow(config.model, cardinalities, config.train.seed)  # the audit's
        canary_slots(model, canaries)  # a ConfigError naming the most that fit


def preflight_pretrain(config: RunConfig) -> Preflight:
    """`privflow pretrain`'s checks: the schema, the public table's header and rows, the store,
    the device, and that the ledger does not know the file as private data. No plan (nothing
    is private), so `plan` is None."""
    from privflow.tasks.warm_start import check_public_file

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if config.init_from is not None:
        raise ConfigError(
            "Pretraining starts from the config's random initialisation; remove 'init_from' from --config."
        )
    schema = read_schema(config)
    fmt = check_table(config.data, schema, "Public data file")
    rows = public_rows(config.data, config.select.min_rows(None))
    check_store(config.store)
    device = resolve_device(config.train.device)
    check_workers(config.train.workers, device)
    check_public_file(config.data, Path(config.store), schema)
    timings["checks"] = time.perf_counter() - t0
    return Preflight(
        config=config, schema=schema, plan=None, data_format=fmt, rows=rows, device=device, timings=timings
    )


__all__ = [
    "Preflight",
    "atoms_note",
    "available_memory",
    "budget_delta_note",
    "check_draft_run",
    "check_init_from",
    "check_memory",
    "check_output",
    "check_privacy_parameters",
    "check_registry",
    "check_room",
    "check_seed",
    "check_store",
    "check_stream",
    "check_synthetic",
    "check_table",
    "check_workers",
    "gate_floor",
    "gate_limit",
    "gate_note",
    "nvidia_driver",
    "preflight",
    "preflight_audit",
    "preflight_pretrain",
    "resolve_device",
]
