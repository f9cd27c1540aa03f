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
  A streamed run is not checked;
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
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError, DataError, DeviceUnavailable, SchemaError, StoreError, byte_size
from privflow.data.schema import Column, Schema


@dataclass(frozen=True)
class Preflight:
    """What pre-flight established: the parsed schema, the privacy plan, the table's format,
    the resolved device, and how long each check took (seconds)."""

    config: RunConfig
    schema: Schema
    plan: object  # privacy.accounting.plan.PrivacyPlan (imported lazily)
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


def check_privacy_parameters(config: RunConfig, schema: Schema | None = None, delta_flag: bool = True) -> None:
    """epsilon and delta finite, positive and in their sane ranges (ConfigError otherwise).
    `delta_flag` False: the command has no --delta (audit), so the advice names the --config key."""
    from privflow.privacy.accounting.plan import MAX_EPSILON

    eps, delta = config.privacy.epsilon, config.privacy.delta
    name = "--delta" if delta_flag else "privacy.delta (the --config YAML's; default 1e-5)"
    given = f"--delta {delta:g}" if delta_flag else f"privacy.delta {delta:g} (the --config YAML's; default 1e-5)"

    def use(value: float) -> str:
        return f"--delta {value:g}" if delta_flag else f"privacy.delta: {value:g} in the --config YAML"

    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise ConfigError(
            f"--epsilon must be a finite number above 0, got {eps}. It is the run's total privacy loss; "
            "typical values are 0.1 to 10."
        )
    if eps > MAX_EPSILON:
        raise ConfigError(
            f"--epsilon {eps:g} is above privflow's limit of {MAX_EPSILON:g}: at such values the guarantee "
            f"says nothing (e^epsilon is astronomically large) and the accountant cannot represent the noise. "
            f"Choose an epsilon of at most {MAX_EPSILON:g}; typical values are 0.1 to 10."
        )
    if not (isinstance(delta, int | float) and math.isfinite(delta) and 0 < delta < 1):
        raise ConfigError(
            f"{name} must lie strictly between 0 and 1, got {delta}; use a value well below 1/(number of "
            "rows), e.g. 1e-5."
        )
    if schema is None:
        return
    rows = schema.dataset.expected_rows
    if rows is not None and delta >= 1.0 / rows:
        raise ConfigError(
            f"{given} is not below 1/expected_rows = {1.0 / rows:.3g} (the schema says about {rows} "
            "rows): with such a delta a mechanism that publishes a random row outright would qualify, so the "
            f"guarantee means little. Use a delta well below {1.0 / rows:.3g}, e.g. {use(_nice_delta(rows))}."
        )
    budget = schema.dataset.budget
    if delta > budget.delta:
        raise ConfigError(
            f"{given} is above the total delta budget of dataset '{schema.dataset.name}' "
            f"({budget.delta:g}); one run cannot spend more than the whole budget. Use {use(budget.delta)} "
            "or less."
        )


def _nice_delta(rows: int) -> float:
    return 10.0 ** math.floor(math.log10(1.0 / rows) - 1)


def _check_schema(config: RunConfig) -> Schema:
    return Schema.from_yaml(config.schema_path)


def _type_fits(col: Column, dtype: object) -> bool:
    """Whether a Parquet column's physical dtype can hold the schema's type (values not read)."""
    import polars as pl

    from privflow.data.validation import numeric_dtype  # the rule validation reads such a column by

    if col.type == "ignore" or dtype == pl.Null:  # an ignored column's values are never read
        return True
    if col.type in ("numeric", "integer"):
        return numeric_dtype(dtype)  # type: ignore[arg-type]
    if dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum | pl.Categorical):
        return True  # text: category labels, boolean labels, dates in the column's format
    if col.type in ("date", "datetime"):  # or a Parquet date / timestamp
        return dtype == pl.Date or isinstance(dtype, pl.Datetime)
    if col.type == "boolean" and dtype == pl.Boolean:
        return True
    if numeric_dtype(dtype):  # type: ignore[arg-type]
        # integer-coded categories ("0", "1", ...) can be stored as numbers
        def numeric(label: str) -> bool:
            try:
                float(label)
            except ValueError:
                return label.lower() in ("true", "false") and dtype == pl.Boolean
            return True

        return all(numeric(c) for c in (col.true_false if col.type == "boolean" else col.categories or ()))
    return False


SELECTION_NEEDS = (
    "so that the checkpoint-selection split gets validation rows: its share is select.validation_fraction, "
    "lowered to select.max_validation_rows over the schema's expected_rows on a large table, so an "
    "expected_rows far above the real row count also raises it"
)


def check_table(path: str | Path, schema: Schema, what: str = "Data file") -> str:
    """The file's format and header (and dtypes, for Parquet) fit the schema. Returns the format's
    description. No row is read or counted: how many rows there are and what they hold are the
    validation gate's DP decisions (privacy rule 8). A folder of Parquet files: their columns agree
    and fit; a database URI (privflow/data/sources.py): the connection and the column names (a
    `LIMIT 0` query), named in messages with the password masked."""
    from privflow.core.source_uri import SourceURI, is_database_uri
    from privflow.data.io import DELIMITER_NAMES, read_header

    label = what  # what the messages below call it
    if is_database_uri(path):
        path, label = SourceURI(path), what.replace("file", "table")  # its text masks the password
    elif Path(path).is_dir():
        label = what.replace("file", "folder")
    try:
        fmt, header, dtypes = read_header(path)
    except DataError as exc:
        if what != "Data file":
            raise DataError(str(exc).replace("Data file", what, 1).replace("Data path", what, 1)) from None
        raise
    declared = schema.names
    missing = [c for c in declared if c not in header]
    undeclared = [c for c in header if c not in declared]
    if missing or undeclared:
        parts = []
        if missing:
            parts.append(f"the schema's column(s) {missing} are missing from it")
        if undeclared:
            parts.append(
                f"it has column(s) {undeclared[:10]}{' ...' if len(undeclared) > 10 else ''} that the "
                "schema does not declare"
            )
        hint = ""
        lower = {c.lower(): c for c in header}
        near = [f"'{lower[c.lower()]}' for '{c}'" for c in missing if c.lower() in lower]
        if near:
            hint += f" Column names are case-sensitive: the file has {', '.join(near)}."
        padded = {c.strip(): c for c in header if c != c.strip()}
        spaced = [f"'{padded[c]}' for '{c}'" for c in missing if c in padded]
        if spaced:
            more = f" and {len(spaced) - 3} more" if len(spaced) > 3 else ""
            hint += (
                f" Column names keep their spaces: the file has {', '.join(spaced[:3])}{more}; remove the spaces "
                "around the names (or after the delimiters) in its header."
            )
        if fmt.kind == "csv" and len(header) == 1:
            others = [DELIMITER_NAMES[d] for d in DELIMITER_NAMES if d in header[0]]
            hint += f" The whole header was read as one column ({fmt.describe()})" + (
                f"; it contains {', '.join(others)} characters: is that the delimiter?" if others else "."
            )
        elif fmt.kind == "csv":
            hint += f" (Read as {fmt.describe()}.)"
        raise DataError(
            f"{label} '{path}' does not match the schema '{schema.dataset.name}': {'; and '.join(parts)}. "
            "Every declared column must be present and no other column may be; fix the file's header or the "
            f"schema.{hint}"
        )
    if dtypes is not None:
        wrong = [
            f"'{c.name}' is stored as {dtypes[c.name]} but declared {c.type}"
            for c in schema.columns
            if not _type_fits(c, dtypes[c.name])
        ]
        if wrong:
            raise DataError(
                f"{label} '{path}' is Parquet with column types that cannot hold the schema's: {'; '.join(wrong)}. "
                "Write those columns with a numeric type for numeric/integer fields, a string (or "
                "categorical) type for categorical fields, a string, date or timestamp type for date/datetime "
                "fields, and a boolean or string type for boolean fields."
            )
    return fmt.describe()


def _public_rows(path: str | Path, least: int) -> int:
    """A public table's row count, refused below `least` (pretraining: the file is declared public,
    so its size may decide a refusal)."""
    from privflow.data.io import count_rows

    rows = count_rows(path)
    if rows < least:
        raise DataError(
            f"Public data file '{path}' has {rows} data row(s); pretraining needs at least {least} (a public minimum, "
            f"{SELECTION_NEEDS}). Use a larger table."
        )
    return rows


def check_stream(config: RunConfig, schema: Schema) -> bool:
    """Whether the run reads its table in chunks (privflow/data/chunked.py), and that it can: an
    uncompressed Parquet input and one worker."""
    from privflow.data.chunked import streamed
    from privflow.data.io import sniff

    if not streamed(config, schema):
        return False
    fmt = sniff(config.data)
    if fmt.kind != "parquet" or fmt.compression is not None:
        convert = (
            f"Decompress it (e.g. `gunzip -k {config.data}`; Parquet compresses its own columns)"
            if fmt.kind == "parquet"
            else "Export it to Parquet (e.g. polars: read_database_uri(...).write_parquet(...))"
            if fmt.kind == "postgresql"
            else "Convert it (e.g. polars: scan_csv(...).sink_parquet(...))"
        )
        what = "Data table" if fmt.kind == "postgresql" else "Data file"
        raise DataError(
            f"{what} '{config.data}' is {fmt.describe()}; a streamed run (stream.enabled / --stream) reads an "
            f"uncompressed Parquet file a chunk at a time. {convert}, or run without --stream to read it whole."
        )
    if config.train.workers > 1:
        raise ConfigError(
            f"A streamed run trains in one process (--workers {config.train.workers} would have every worker "
            "read the table). Use --workers 1 with --stream, or read the table whole."
        )
    return True


def _existing_ancestor(p: Path) -> Path:
    """`p`, or the nearest folder above it that exists (where creating `p` would start)."""
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _refuses_new_files(folder: Path) -> str | None:
    """Why `folder` takes no new file (a test file made and removed), or None when it does.
    Permission bits alone do not say it: root passes them, and some file systems refuse anyway."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".privflow-write-test-"):
            return None
    except OSError as exc:
        return str(exc.strerror or exc)


def check_seed(seed: object, name: str = "--seed") -> int | None:
    """A public sampling seed: None, or a whole number in [0, 2**63) (torch's and numpy's range),
    returned as a Python int (torch takes no numpy integer)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**63):
        raise ConfigError(f"{name} must be a whole number from 0 to 2**63 - 1 (or none), got {seed!r}.")
    return None if seed is None else int(seed)  # type: ignore[call-overload]


def check_room(out: Path, rows: int, columns: int, fewer: str = "Ask for fewer rows (-n)") -> None:
    """Refuse a table that cannot fit on the output's disk, before any row is sampled. The
    sizes are lower bounds (one character and a separator per value in CSV, a quarter byte
    per value in compressed Parquet): a refusal is certain, a pass is not a promise."""
    per_value = 2.0 if Path(out).suffix.lower() == ".csv" else 0.25
    need = float(rows) * max(1, columns) * per_value
    folder = _existing_ancestor(Path(out).parent)
    free = shutil.disk_usage(folder).free
    if need > free:
        raise ConfigError(
            f"{rows:,} rows of {columns} columns need at least {byte_size(need)} as {Path(out).suffix.lower()[1:]}, "
            f"more than the {byte_size(free)} free under '{folder}'. {fewer}, or write to a disk with room."
        )


BYTES_PER_SAMPLED_VALUE = 64.0  # peak memory of a value sampled in memory: the encoded batch, the frame, its columns


def available_memory() -> float:
    """Bytes of memory free for a new allocation (Linux: MemAvailable; elsewhere: no limit)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def check_memory(rows: int, columns: int, what: str, fewer: str) -> None:
    """Refuse a table sampled in memory that this machine cannot hold, before any row is drawn."""
    need, free = float(rows) * max(1, columns) * BYTES_PER_SAMPLED_VALUE, available_memory()
    if need > free:
        raise ConfigError(
            f"{what} needs about {byte_size(need)} of memory for {columns} columns, more than this machine has "
            f"free ({byte_size(free)}); {fewer}."
        )


def check_synthetic(config: RunConfig, schema: Schema) -> None:
    """The run's synthetic table (sampled in memory, evaluated, written to the store as CSV)
    fits in memory and on the store's disk: a run spends its budget before it samples."""
    n, columns = config.evaluate.rows(schema.dataset.expected_rows), len(schema.columns)
    fewer = "set evaluate.synthetic_rows lower in --config (its default is the schema's expected_rows)"
    check_memory(n, columns, f"The run's synthetic table of {n:,} rows", fewer)
    check_room(Path(config.store) / "synthetic" / "table.csv", n, columns, fewer[0].upper() + fewer[1:])


def check_output(out: Path) -> None:
    """An output table's name and place, before any model is loaded or rows are read: a .csv or
    .parquet name, not a folder, in a folder that takes a new file or can be created there
    (a test file is made and removed; nothing else is created)."""
    from privflow.data.io import TABLE_SUFFIXES

    out = Path(out)
    if out.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"Output '{out}' must end in .csv or .parquet.")
    if out.is_dir():
        raise ConfigError(f"Output '{out}' is a folder; pass a file name ending in .csv or .parquet.")
    folder = _existing_ancestor(out.parent)
    if not folder.is_dir():
        raise ConfigError(f"Output '{out}' cannot be written: '{folder}' is a file, not a folder.")
    refused = _refuses_new_files(folder)
    if refused:
        raise ConfigError(
            f"Output '{out}' cannot be written: the folder '{folder}' does not take new files ({refused}). "
            "Pass -o a path in a folder you can write to."
        )


def check_store(store: Path) -> None:
    """The store folder exists and is writable, or can be created (nothing is created here)."""
    p = Path(store)
    if p.exists() and not p.is_dir():
        raise StoreError(f"Store '{p}' is a file, not a folder; pass --store a folder (it is created if missing).")
    if p.is_dir():
        refused = _refuses_new_files(p)
        if refused:
            raise StoreError(
                f"Store folder '{p}' is not writable ({refused}); privflow keeps its ledger, MLflow "
                "database and artifacts there. Make it writable or pass --store another folder."
            )
        for name in ("ledger.db", "mlflow.db"):
            f = p / name
            if f.exists() and not os.access(f, os.R_OK | os.W_OK):
                raise StoreError(
                    f"'{f}' in the store is not readable and writable by this user; fix its permissions or pass "
                    "--store another folder."
                )
        return
    ancestor = _existing_ancestor(p)
    if ancestor.exists() and not ancestor.is_dir():
        raise StoreError(
            f"Store '{p}' cannot be created: '{ancestor}' is a file, not a folder. Pass --store a folder path."
        )
    refused = "not writable" if not os.access(ancestor, os.W_OK | os.X_OK) else _refuses_new_files(ancestor)
    if refused:  # permission bits pass for root, and /proc or a read-only mount refuse anyway
        raise StoreError(
            f"Store folder '{p}' cannot be created: '{ancestor}' takes no new files ({refused}). Pass --store a "
            "folder you can write to."
        )


def nvidia_driver() -> bool:
    """Whether this Linux machine has an NVIDIA driver loaded (without importing torch)."""
    return sys.platform.startswith("linux") and (
        Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()
    )


def resolve_device(choice: str) -> str:
    """'cpu', 'cuda' or 'auto' -> the device training will use; DeviceUnavailable for missing CUDA.

    Without an NVIDIA driver on the machine, CUDA is absent and torch is not imported (its import
    is a large part of a run's start-up: benchmarks/results/overhead.md); with one, torch decides.
    """
    if choice not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device must be auto, cpu or cuda, got '{choice}'.")
    if choice == "cpu":
        return "cpu"
    driver = nvidia_driver()
    cuda = False
    if driver or "torch" in sys.modules:
        import torch

        cuda = bool(torch.cuda.is_available())
    if choice == "auto":
        return "cuda" if cuda else "cpu"
    if not cuda:
        raise DeviceUnavailable(
            f"--device {choice} was requested, but this machine has no usable CUDA device "
            f"({'the NVIDIA driver is present but torch cannot use it' if driver else 'no NVIDIA driver found'}). "
            "Use --device cpu (or auto, which picks CUDA only when it is there)."
        )
    return "cuda"


def check_workers(workers: int, device: str) -> None:
    """`--workers N` can run here: one GPU per worker on CUDA (NCCL refuses two ranks on one
    device), at most one worker per usable CPU otherwise (more only queue for the same cores),
    and torch.distributed present. Imports torch only when N > 1."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}.")
    if workers == 1:
        return
    import torch.distributed

    if not torch.distributed.is_available():
        raise ConfigError("--workers above 1 needs torch.distributed, which this torch build lacks; use --workers 1.")
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if workers > gpus:
            raise ConfigError(
                f"--workers {workers} on --device cuda needs one GPU per worker, and this machine has {gpus}. "
                f"Use --workers {gpus} or fewer, or --device cpu."
            )
        return
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers > cpus:
        raise ConfigError(
            f"--workers {workers} on the CPU needs one core per worker, and this process may use {cpus}. "
            f"Use --workers {cpus} or fewer (each worker runs train.threads torch threads)."
        )


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


def _check_budget(config: RunConfig, schema: Schema) -> object:
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


def _false_stop(config: RunConfig) -> dict[str, float]:
    """The configured false-stop probability as a keyword, or none: the gate's own FALSE_STOP applies."""
    return {} if config.gate.false_stop is None else {"false_stop": config.gate.false_stop}


def gate_limit(config: RunConfig, schema: Schema, plan: object) -> float:
    """The public limit on the validation gate's DP count of failing rows: the policy's fraction
    of expected_rows, at least the gate's noise floor (privacy/mechanisms/validation_gate.py)."""
    from privflow.privacy.mechanisms import validation_gate

    fraction = config.gate.strict_max_failing if config.policy == "strict" else config.gate.quarantine_max_failing
    return validation_gate.threshold(
        fraction * float(schema.dataset.expected_rows or 0),
        plan.stage("validate").event,  # type: ignore[attr-defined]
        **_false_stop(config),
    )


def gate_floor(config: RunConfig, schema: Schema, plan: object) -> float:
    """The public minimum on the validation gate's DP count of passing rows: a fraction of
    expected_rows, at least the selection split's minimum, below the noise of a table of the
    expected size (privacy/mechanisms/validation_gate.py); -inf without expected_rows."""
    from privflow.privacy.mechanisms import validation_gate

    expected = schema.dataset.expected_rows
    return validation_gate.floor(
        expected,
        config.select.min_rows(expected),
        plan.stage("validate").event,  # type: ignore[attr-defined]
        **_false_stop(config),
        passing_cells=validation_gate.passing_cells(schema),
    )


def gate_note(config: RunConfig, schema: Schema, plan: object) -> str | None:
    """A warning when the gate cannot stop the run: without expected_rows it has no minimum of
    rows and only its noise floor as a limit; with them, its limit (on a small table, the noise
    floor of its DP count) may be at least the expected row count, so even a table whose every
    row fails the checks goes on, trained on the rows that pass. From public quantities only."""
    expected = schema.dataset.expected_rows
    limit = gate_limit(config, schema, plan)
    eps = 1.0 / plan.stage("validate").event.noise_multiplier  # type: ignore[attr-defined]
    if expected is None:
        return (
            f"the schema declares no dataset.expected_rows, so the validation gate has no public minimum of rows "
            f"(a file with few or no rows is not stopped) and stops only above {limit:.0f} failing rows, the noise "
            f"floor of its DP count at epsilon {eps:.3g}. Declare the table's approximate size as expected_rows."
        )
    if limit < expected:
        return None
    size = f"{expected} expected rows"
    return (
        f"the validation gate cannot stop this run: its limit of {limit:.0f} failing rows (the noise floor of its "
        f"DP count at epsilon {eps:.3g}) is not below the table's {size}, so however many rows fail the "
        f"schema's checks the run goes on with the rows that pass ({config.policy} policy), possibly very few. "
        "Check the table against the schema before spending, or give the gate a larger share "
        "(privacy.gate_share) to lower the floor."
    )


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
        f"dataset.budget.delta in the schema, e.g. to {_nice_delta(rows):g} (a lower budget applies at once)."
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
    schema = timed("schema", _check_schema, config)
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
    if not streamed:  # a streamed run reads its table in chunks: not checked (tasks/dataset_identity.py)
        from privflow.tasks.dataset_identity import check_rows_not_charged_elsewhere

        timed(
            "dataset identity", check_rows_not_charged_elsewhere, config.data, schema, config.store, schema.dataset.name
        )
    plan = timed("plan and budget", _check_budget, config, schema)
    skipped = (
        "a streamed run is not checked against rows the ledger charged to other datasets: run it under "
        "the dataset name its rows were charged to"
        if streamed
        else None
    )
    candidates = (gate_note(config, schema, plan), budget_delta_note(schema), atoms_note(config, schema), skipped)
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
    schema = _check_schema(config)
    check_privacy_parameters(config, schema, delta_flag=False)
    check_table(config.data, schema, "Data file")
    check_store(config.store)
    if canaries is not None:
        from privflow.data.codec import Codec
        from privflow.data.surface import lower
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
    schema = _check_schema(config)
    fmt = check_table(config.data, schema, "Public data file")
    rows = _public_rows(config.data, config.select.min_rows(None))
    check_store(config.store)
    device = resolve_device(config.train.device)
    check_workers(config.train.workers, device)
    check_public_file(config.data, Path(config.store), schema)
    timings["checks"] = time.perf_counter() - t0
    return Preflight(
        config=config, schema=schema, plan=None, data_format=fmt, rows=rows, device=device, timings=timings
    )


__all__ = [
    "check_registry",
    "available_memory",
    "check_memory",
    "check_room",
    "check_synthetic",
    "check_seed",
    "Preflight",
    "check_privacy_parameters",
    "check_store",
    "check_table",
    "check_init_from",
    "check_workers",
    "preflight",
    "preflight_audit",
    "preflight_pretrain",
    "resolve_device",
]
