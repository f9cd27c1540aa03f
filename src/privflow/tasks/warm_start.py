"""Warm starts: DP training that begins from a registered model's weights instead of the
config's random initialisation (the DP-GAN note, Boob et al. 2018, section 3.2:
"using relevant publicly available datasets for warm starting").

Which parents are allowed, and what starting from them costs (docs/architecture.md,
privacy rules 3, 5 and 7):

- **Public pretraining** (`privflow pretrain`): the weights are a function of data the
  operator declared public and of public settings. Starting from them reads no private row and
  costs nothing. The declaration is the data owner's, made once and recorded in the store's
  ledger (`Ledger.declare_public`: the exact version, the digest of its weights, the keyed
  fingerprint of the public table's rows) when `pretrain` registers the version. The version tag
  ``privflow.pretrained=public`` is information only: anyone with registry write access can set
  it, so a version carrying it without the ledger's declaration is refused
  (`UndeclaredPublicParent`). Rows the ledger has charged are never public, whatever their
  encoding or order: `pretrain` refuses a table whose rows are mostly rows a run was charged for
  (`check_pretraining_rows`, keyed row digests of privacy/fingerprint.py, `PUBLIC_ROW_SHARE`), and
  a table whose rows are mostly rows `privflow generate` sampled from a private version is not
  public either: the pretraining's ledger node links the generating version's lineage, so that a
  warm start from it composes those runs.
- **A private release of the same dataset**: its weights came out of mechanisms whose events
  this store's ledger already holds. Which ledger run made a version is read from the ledger's
  own record (`Ledger.record_version`, written when the version was registered, with its weights'
  digest), never from registry tags, which anyone with write access can set: a version the
  ledger does not record, or whose weights differ from the recorded ones, is refused. The new
  run is recorded as one more run of that dataset, and the ledger composes all of a dataset's
  runs, so the dataset's cumulative epsilon covers the warm-started model (parent and child
  together): nothing is charged twice and nothing is missed. The new run's ledger entry and its
  MLflow params name the parent version (the lineage). The new version's own epsilon is its
  lineage's (privacy rule 9): its weights are a function of the parent's release, so the only
  valid bound for it alone is the composition of every run in its lineage and this one
  (`Ledger.lineage`), which it reports as its epsilon; its run's own figure is kept beside it.
- **A private release of another dataset: refused.** That release is already public output,
  and reusing it is post-processing *for its own dataset*: it would cost that dataset
  nothing more. What privflow cannot know is whether the two datasets describe some of the
  same people. If they do, the new model's guarantee towards them is the composition of the
  two datasets' runs, while this dataset's ledger holds only its own, so its reported
  cumulative epsilon would be too low. Whether the other release may count as public for
  this dataset is the data owner's call, and it must be made explicitly: sample the other
  model (`privflow generate`, post-processing) and pretrain on that table with
  `privflow pretrain`, which records the pretraining with the generating version's lineage.
- A version the ledger records neither as a declared public pretraining nor as registered from
  one of its runs is refused: its privacy cannot be told.

Compatibility (otherwise the same weights would not mean the same function): the parent's
schema columns (names, order, types, bounds, categories, transforms, nullability) equal this
run's; its flow family and shape equal the config's model section; and both use the same
codec space (the schema codec, or the copula codec when ``marginals.enabled``). With DP
marginals the warm-started flow is fine-tuned in the new run's copula space: rows are encoded
through this run's own DP marginals, never the parent's. The weights taken are those of the
parent's first chosen checkpoint (Report-Noisy-Max's first pick); its actnorm and prior come
with them, so the plan has no DP statistics or DP prior stage (tasks/run_plan.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError, PrivacyPlanError
from privflow.data.schema import Column, Schema
from privflow.privacy.fingerprint import (
    charged_share,
    digests_blob,
    digests_from_blob,
    found_in,
    is_sample,
    row_digests,
    sample_mark,
    store_key,
    surface_schema,
    table_fingerprint,
    table_rows,
)
from privflow.privacy.ledger import CHARGED_STATUSES, Ledger
from privflow.privacy.ledger.store import RowPrints
from privflow.tasks.run_plan import head_planned

if TYPE_CHECKING:  # MLflow (and Prefect) load only where the registry is read: `find_parent`
    import polars as pl
    import torch

    from privflow.serving.release import Release

PRETRAINED_TAG = "privflow.pretrained"  # "public" on versions registered by `privflow pretrain`
DATA_TAG = "privflow.data"  # "public" (or "generated"): what the weights were trained on
# The share of a pretraining table's rows (those that pass the schema's checks) found among the
# rows a dataset's runs were charged for at or above which `pretrain` refuses the table, and
# found among tables `privflow generate` wrote at or above which the pretraining is linked to the
# generating runs instead of declared public. Independent samples of one population share few
# exact rows (Adult's published test split: 0.14% of its rows are in the training split; 16% even
# with the near-unique fnlwgt column ignored), while the charged file itself, gzipped, reordered,
# re-encoded or any subset of it scores 100%: half leaves a wide margin on both sides. A table
# more than half of whose rows are charged is the private file with some rows added, and a table
# whose keyed fingerprint equals a charged table's is refused whatever the share.
PUBLIC_ROW_SHARE = 0.5
_SAMPLED = " (sampled)"  # how a generating version shows in a pretraining's lineage: NAME/V (sampled)
# Model settings that do not change what the weights mean once the flow is built: DP-EM's
# iteration count only matters for a fresh prior, and a warm start keeps the parent's.
_NOT_SHAPE = frozenset({"mog_iterations"})
_COLUMN_FIELDS = ("type", "bounds", "categories", "transform", "nullable")


class UndeclaredPublicParent(ConfigError):
    """A warm start's parent is tagged public in the registry, but the store's ledger holds no
    declaration of it by `privflow pretrain` (a tag is not the data owner's decision)."""


@dataclass(frozen=True)
class Parent:
    """A registered version to warm-start from, with what decides its cost."""

    name: str
    version: str
    kind: Literal["public", "private"]
    dataset: str | None  # the dataset a private parent was trained on (the ledger's record)
    # a private parent's ledger node (the ledger's record, never a tag): its run, or for a
    # pretraining on generated rows `pretrain:NAME/VERSION`, which links the runs behind them
    ledger_run: str | None
    loaded: Release
    sampled_from: tuple[str, ...] = ()  # a pretraining on generated rows: the versions that wrote them

    @property
    def spec(self) -> str:
        """The exact version (an alias may move later; the lineage must not)."""
        return f"{self.name}/{self.version}"

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The weights of the parent's first chosen checkpoint, detached copies."""
        return {k: v.detach().clone() for k, v in self.loaded.flows[0].state_dict().items()}

    def lineage(self) -> str:
        """One line for the ledger entry: which version, and why it costs what it costs."""
        if self.kind == "public":
            return f"{self.spec}: public pretraining (no charge)"
        if self.sampled_from:
            return (
                f"{self.spec}: pretrained on rows sampled from {', '.join(self.sampled_from)}, ledger node "
                f"{self.ledger_run} (not public: its runs are composed into this version's epsilon)"
            )
        return (
            f"{self.spec}: private on dataset '{self.dataset}', ledger run {self.ledger_run} (already counted; "
            "this run composes with it)"
        )


def weights_digest(loaded: Release) -> str:
    """SHA-256 of what a registered version holds: every checkpoint's tensors (names, dtypes,
    shapes, bytes), its DP marginals and its target head. The ledger's public declaration names
    it, so a version re-registered under a declared name and number does not pass as declared."""
    h = hashlib.sha256()
    for flow in loaded.flows:
        for key, value in sorted(flow.state_dict().items()):
            t = value.detach().cpu().contiguous()
            h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.numpy().tobytes())
    h.update(json.dumps([loaded.marginals, loaded.head], sort_keys=True, default=str).encode())
    return "sha256:" + h.hexdigest()


def declare_public_version(store: Path, name: str, version: str, fingerprint: str, dataset: str) -> None:
    """`privflow pretrain`'s declaration, in the store's ledger: version `name/version` (its
    weights as registered) was trained on the table of keyed row fingerprint `fingerprint`
    (`PretrainingRows.fingerprint`), which the data owner declares public."""
    from privflow.tasks.mlflow_store import load_version

    weights = weights_digest(load_version(name, version))
    Ledger(store / "ledger.db").declare_public(name, version, weights, fingerprint, dataset)


def record_registered_version(ledger: Ledger, name: str, version: str, run_id: str) -> None:
    """The ledger's record of a version registered from charged run `run_id` (the pipeline, after
    registration): the version, its run and its weights' digest as registered, which a warm start
    from it is checked against (`find_parent`). MLflow must point at the store."""
    from privflow.tasks.mlflow_store import load_version

    ledger.record_version(name, version, run_id, weights_digest(load_version(name, version)))


def _declared(spec: str, name: str, version: str, loaded: Release, ledger_path: Path | None) -> bool:
    """Whether the ledger holds `pretrain`'s declaration of exactly this version (same weights)."""
    if ledger_path is None or not ledger_path.is_file():
        return False
    source = Ledger(ledger_path).public_source(name, version)
    if source is None:
        return False
    if source.weights != weights_digest(loaded):
        raise UndeclaredPublicParent(
            f"--init-from {spec}: the ledger at '{ledger_path}' records version {version} of '{name}' as a public "
            f"pretraining (declared {source.declared[:19]}), but the weights registered under that number now are "
            "not the ones declared: the version was replaced after `privflow pretrain` registered it. Pretrain "
            "again on the public table (`privflow pretrain`) and warm-start from the new version; nothing was "
            "reserved or read."
        )
    return True


def find_parent(spec: str, ledger_path: Path | None = None) -> Parent:
    """Look `spec` up in the current MLflow registry (the caller points MLflow at the store).
    Public only when the store's ledger (`ledger_path`) holds `pretrain`'s declaration of it;
    private only when the ledger records the version (`Ledger.record_version`) with the same
    weights: its ledger run is the ledger's record, never the registry's tags."""
    from privflow.tasks.mlflow_store import load_version, resolve_version

    name, version, tags = resolve_version(spec)
    loaded = load_version(name, version)
    if _declared(spec, name, version, loaded, ledger_path):
        return Parent(name, version, "public", None, None, loaded)
    ledger = Ledger(ledger_path) if ledger_path is not None and ledger_path.is_file() else None
    record = ledger.version(name, version) if ledger is not None else None
    if record is not None:
        if record.weights != weights_digest(loaded):
            raise ConfigError(
                f"--init-from {spec}: the ledger at '{ledger_path}' records version {version} of '{name}' as "
                f"registered from ledger run {record.run_id} (recorded {record.recorded[:19]}), but the weights "
                "registered under that number now are not the ones recorded: the version was replaced after that "
                "run registered it, so what its weights cost cannot be told. Warm-start from a version a run of "
                "this store registered and left as it was; nothing was reserved or read."
            )
        assert ledger is not None
        sampled = tuple(p.removesuffix(_SAMPLED) for p, _ in ledger.links(record.run_id)) if record.derived else ()
        return Parent(name, version, "private", record.dataset, record.run_id, loaded, sampled)
    if tags.get(PRETRAINED_TAG) == "public":
        raise UndeclaredPublicParent(
            f"--init-from {spec}: version {version} of '{name}' carries the registry tag {PRETRAINED_TAG}=public, "
            f"but the store's ledger ('{ledger_path}') holds no declaration of it by `privflow pretrain`. Whether "
            "weights count as public is the data owner's decision, recorded in the ledger when `privflow pretrain` "
            "registers a version from a table declared public; a registry tag can be set by anyone with write "
            "access to the registry, so it decides nothing. Pretrain the parent with `privflow pretrain` on this "
            "store (--store) and warm-start from that version; nothing was reserved or read."
        )
    named = (
        f" (its registry tags name dataset '{tags['dataset']}' and ledger run {tags['privflow_run_id']}, but tags "
        "can be set by anyone with write access to the registry and decide nothing)"
        if tags.get("dataset") and tags.get("privflow_run_id")
        else ""
    )
    raise ConfigError(
        f"--init-from {spec}: the ledger at '{ledger_path}' does not record version {version} of '{name}', neither "
        f"as a public pretraining declared by `privflow pretrain` nor as a version registered from one of its "
        f"runs{named}, so what its weights cost cannot be told. Warm-start from a version that `privflow run` or "
        "`privflow pretrain` registered with this store (--store); nothing was reserved or read."
    )


def _column_difference(theirs: Column, ours: Column) -> str:
    fields = [f for f in _COLUMN_FIELDS if getattr(theirs, f) != getattr(ours, f)]
    shown = "; ".join(f"{f} {getattr(theirs, f)!r} there, {getattr(ours, f)!r} here" for f in fields)
    return f"column '{ours.name}' differs ({shown})"


def schema_difference(theirs: Schema, ours: Schema) -> str | None:
    """How the parent's columns differ from this run's, or None when they are identical."""
    if theirs.columns == ours.columns:
        return None
    a, b = {c.name: c for c in theirs.columns}, {c.name: c for c in ours.columns}
    parts = []
    missing = [n for n in b if n not in a]
    extra = [n for n in a if n not in b]
    if missing:
        parts.append(f"it lacks column(s) {missing}")
    if extra:
        parts.append(f"it has column(s) {extra} that this schema does not declare")
    changed = [_column_difference(a[n], b[n]) for n in b if n in a and a[n] != b[n]]
    parts.extend(changed[:3] + ([f"and {len(changed) - 3} more"] if len(changed) > 3 else []))
    return "; ".join(parts) or "its columns are in another order"


def _model_difference(parent: dict[str, Any], config: RunConfig) -> list[str]:
    ours = {"name": config.model.name, **json.loads(json.dumps(config.model.model_dump(exclude={"name"})))}
    theirs = {"name": parent["name"], **parent["config"]}
    keys = sorted((set(ours) | set(theirs)) - _NOT_SHAPE)
    return [f"model.{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in keys if ours.get(k) != theirs.get(k)]


def check_parent(parent: Parent, config: RunConfig, schema: Schema, ledger_path: Path) -> None:
    """Refuse (ConfigError, one paragraph) a parent whose weights do not fit this run or whose
    privacy the ledger cannot account for (module docstring). Reads no row of this run."""
    what = f"--init-from {parent.spec} ({'public pretraining' if parent.kind == 'public' else 'a private release'})"
    diff = schema_difference(parent.loaded.schema, schema)
    if diff is not None:
        raise ConfigError(
            f"{what} was trained under another schema than '{config.schema_path}': {diff}. A warm start needs "
            "identical columns (names, order, types, bounds, categories), or the weights would mean something "
            "else; pretrain again with this schema (`privflow pretrain --schema ...`)."
        )
    assert parent.loaded.model is not None, "load_version reads the model section of meta.json"
    shape = _model_difference(parent.loaded.model, config)
    if shape:
        raise ConfigError(
            f"{what} is a different flow than this run configures: {'; '.join(shape)}. Set the same model "
            "section in --config (or --flow), or pretrain a parent with this run's model settings."
        )
    copula = parent.loaded.marginals is not None
    if copula != config.marginals.enabled:
        raise ConfigError(
            f"{what} was trained in the {'copula' if copula else 'schema'} codec's space, and this run uses the "
            f"{'copula' if config.marginals.enabled else 'schema'} codec (marginals.enabled is "
            f"{str(config.marginals.enabled).lower()}): its inputs would not mean the same. Set marginals.enabled: "
            f"{str(copula).lower()} in --config, or pretrain a parent with this run's setting."
        )
    headed, here_headed = parent.loaded.head is not None, head_planned(config, schema)
    if headed != here_headed:
        raise ConfigError(
            f"{what} {'has' if headed else 'has no'} target head, and this run "
            f"{'trains' if here_headed else 'trains no'} one (head.enabled is {str(config.head.enabled).lower()}, "
            f"target {schema.target!r}): its flow models {'every column but the target' if headed else 'every column'}"
            f", this run's flow would not. Set head.enabled: {str(headed).lower()} in --config, or pretrain a parent "
            "with this run's setting."
        )
    if parent.kind == "public":
        return
    if parent.sampled_from:  # a pretraining on generated rows: the runs behind them must be held
        _check_sampled(parent, what, ledger_path)
        return
    here = schema.dataset.name
    if parent.dataset != here:
        raise ConfigError(
            f"{what} was trained privately on dataset '{parent.dataset}', not on '{here}'. Allowed parents are a "
            f"public pretraining (`privflow pretrain`, free) or a private release of '{here}' (its spend is already "
            f"in this dataset's ledger and the new run composes with it). The other release is public output, but "
            f"privflow cannot tell whether '{parent.dataset}' and '{here}' share people; if they do, the ledger of "
            f"'{here}' would miss that spend. If the data owner accepts it as public for '{here}', sample it "
            "(`privflow generate`) and pretrain on that table with `privflow pretrain`, which records the choice."
        )
    runs = {r.run_id: r for r in Ledger(ledger_path).runs(here)} if ledger_path.is_file() else {}
    record = runs.get(parent.ledger_run or "")
    if record is None or record.status not in CHARGED_STATUSES:
        raise ConfigError(
            f"{what} names ledger run {parent.ledger_run} of dataset '{here}', which the ledger at '{ledger_path}' "
            "does not hold as a charged run, so its spend would not be composed with this run's. Warm-start only "
            "from versions registered with this store (--store), or from a public pretraining."
        )


def _check_sampled(parent: Parent, what: str, ledger_path: Path) -> None:
    """A pretraining on generated rows: every run its lineage reaches must be charged here."""
    ledger = Ledger(ledger_path)
    try:
        runs = ledger.ancestors(parent.ledger_run or "")
    except PrivacyPlanError as exc:
        raise ConfigError(
            f"{what} was pretrained on rows sampled from {', '.join(parent.sampled_from)}, and this ledger cannot "
            f"compose what they cost: {exc} Warm-start only from versions registered with this store (--store)."
        ) from None
    status = {r.run_id: r.status for r in ledger.runs()}
    missing = [r for r in runs if status.get(r) not in CHARGED_STATUSES]
    if missing:
        raise ConfigError(
            f"{what} was pretrained on rows sampled from {', '.join(parent.sampled_from)}, whose ledger run(s) "
            f"{', '.join(missing)} the ledger at '{ledger_path}' does not hold as charged, so their spend would not "
            "be composed with this run's. Warm-start only from versions registered with this store (--store)."
        )


@dataclass(frozen=True)
class PretrainingRows:
    """What a pretraining table holds, by its rows' keyed digests (`check_pretraining_rows`):
    its fingerprint, and the generated tables (by their generating version and ledger node) its
    rows were mostly sampled into, empty for a table the data owner may declare public."""

    fingerprint: str
    sampled_from: tuple[tuple[str, str], ...] = ()  # (NAME/VERSION, ledger node), oldest first

    @property
    def public(self) -> bool:
        return not self.sampled_from

    def describe(self, spec: str) -> str:
        """The sentence `pretrain` prints about the registered version `spec`."""
        if self.public:
            return "Declared public in the store's ledger; no privacy was spent."
        sources = ", ".join(v for v, _ in self.sampled_from)
        return (
            f"The table is NOT public: half or more of its rows were sampled (`privflow generate`) from {sources}, "
            f"so {spec} is recorded in the store's ledger with their lineage, not as a public pretraining; no privacy "
            f"was spent now, and a warm start from {spec} reports the composition of the ledger runs behind "
            f"{sources} with its own run (privacy rule 9)."
        )


def _union(prints: list[RowPrints]) -> np.ndarray:
    return np.unique(np.concatenate([digests_from_blob(p.digests) for p in prints])) if prints else np.array([])


def check_pretraining_rows(typed: pl.DataFrame, store: Path, label: str) -> PretrainingRows:
    """Decide what the pretraining table `typed` (validation's typed passing rows of `label`)
    is, from its rows' keyed digests (privacy/fingerprint.py) against those the store's ledger
    recorded (privacy rule 9: public data is the data owner's declaration; rows the ledger has
    charged, whatever their encoding or order, are never public):

    - half or more (`PUBLIC_ROW_SHARE`) of its rows are rows a dataset's runs were charged for, or
      its fingerprint is a charged table's: ConfigError, one paragraph naming the dataset (no row,
      no count: the verdict is a function of private rows, told to the store's operator only);
    - half or more of its rows are rows of tables `privflow generate` wrote: not public; the
      generating versions (each with a row among them) and their ledger nodes are returned, and
      `record_pretrained` links them into the pretraining's lineage. A generated table whose version
      the ledger knows neither as charged nor as public is refused: its lineage cannot be told.

    A row found among generated rows does not count as charged (a sampled row may equal a real one).
    Nothing is recorded here."""
    key = store_key(store)
    digests = row_digests(typed, key)
    fingerprint = table_fingerprint(digests, key)
    ledger_path = store / "ledger.db"
    if not ledger_path.is_file() or len(digests) == 0:
        return PretrainingRows(fingerprint)
    prints = Ledger(ledger_path).row_prints()
    generated = [p for p in prints if p.kind == "generated"]
    sampled = np.zeros(len(digests), dtype=bool)
    sources: list[RowPrints] = []
    for p in generated:
        hit = found_in(digests, digests_from_blob(p.digests))
        if hit.any():
            sources.append(p)
            sampled |= hit
    charged: dict[str, list[RowPrints]] = {}
    for p in prints:
        if p.kind == "charged":
            charged.setdefault(p.dataset, []).append(p)
    for dataset, records in charged.items():
        whole = _union([p for p in records if not is_sample(p.fingerprint)])
        part = _union([p for p in records if is_sample(p.fingerprint)])  # streamed runs' keyed samples
        share = charged_share(digests, whole, part, skip=sampled)
        if share >= PUBLIC_ROW_SHARE or any(p.fingerprint == fingerprint for p in records):
            raise ConfigError(
                f"'{label}' holds rows that runs on dataset '{dataset}' were charged for in the privacy ledger "
                f"('{ledger_path}'): half or more of the rows that pass the schema's checks are private rows of "
                f"'{dataset}' (compared by keyed row digests, so the file's format, compression, encoding and row "
                "order do not matter). Rows the ledger has charged are never public. Pretrain only on a table that "
                "is public (a published sample, an older public release); nothing was trained or registered."
            )
    if float(np.mean(sampled)) < PUBLIC_ROW_SHARE:
        return PretrainingRows(fingerprint)
    unknown = sorted({f"{p.model}/{p.version}" for p in sources if p.run_id is None})
    if unknown:
        raise ConfigError(
            f"'{label}' holds rows sampled (`privflow generate`) from {', '.join(unknown)}, which the privacy ledger "
            f"('{ledger_path}') records neither as a public pretraining nor as registered from one of its runs, so "
            "the lineage a pretraining on it would carry cannot be told. Pretrain on a table that is public, or "
            "sample a version registered with this store; nothing was trained or registered."
        )
    links: dict[str, str] = {}
    for p in sources:
        assert p.run_id is not None
        links.setdefault(f"{p.model}/{p.version}", p.run_id)
    return PretrainingRows(fingerprint, tuple(links.items()))


def check_public_file(path: str | Path, store: Path, schema: Schema | None = None) -> None:
    """Pre-flight of `privflow pretrain`: `check_pretraining_rows` on the file's rows as `schema`
    coerces them (read and validated, failing rows left out); refuses (ConfigError) a table of
    charged rows before anything is trained. Without `schema` nothing can be compared (the
    digests are of typed values) and nothing is checked here: the pretraining flow checks the
    rows it trains on. Nothing is created where the store has no ledger (no row was charged)."""
    if schema is None or not (store / "ledger.db").is_file():
        return
    check_pretraining_rows(table_rows(path, schema), store, str(path))


def record_pretrained(store: Path, name: str, version: str, rows: PretrainingRows, dataset: str) -> None:
    """What `pretrain` records once it has registered `name/version` (MLflow pointing at the
    store): the data owner's public declaration, or, for a table of generated rows, the version
    with its ledger node linked to the generating versions' nodes (`Ledger.record_derived_version`)."""
    if rows.public:
        declare_public_version(store, name, version, rows.fingerprint, dataset)
        return
    from privflow.tasks.mlflow_store import load_version

    weights = weights_digest(load_version(name, version))
    links = [(f"{spec}{_SAMPLED}", node) for spec, node in rows.sampled_from]
    Ledger(store / "ledger.db").record_derived_version(name, version, weights, dataset, links)


def record_charged_sample(ledger: Ledger, dataset: str, run_id: str, sample: np.ndarray, rows: int) -> None:
    """Keep the keyed sample (`fingerprint.sampled`) of the digests of the `rows` rows a streamed run
    `run_id` was charged for, curator-only in the ledger: a table too large to hold whole keeps about
    one row in SAMPLE_EVERY, and the checks compare other tables with it through their own rows
    in the sample."""
    ledger.record_rows("charged", dataset, digests_blob(sample), sample_mark(rows), run_id)


def record_charged_rows(ledger: Ledger, store: Path, dataset: str, run_id: str, typed: pl.DataFrame) -> None:
    """Keep the keyed digests of the rows charged run `run_id` read (validation's typed passing
    rows), curator-only in the ledger: what `check_pretraining_rows` compares a pretraining
    table with."""
    key = store_key(store)
    digests = row_digests(typed, key)
    ledger.record_rows("charged", dataset, digests_blob(digests), table_fingerprint(digests, key), run_id)


def record_generated_table(store: Path, name: str, version: str, path: Path, schema: Schema) -> None:
    """Keep the keyed digests of a table sampled from `name/version` and written to `path`,
    taken from the rows as a run or `pretrain` will read them back (`table_rows`: read, coerced
    by the released `schema`), with the version's ledger node, so that a pretraining on it links
    the generating lineage (`check_pretraining_rows`). A store without a ledger charged nothing,
    and a version declared public samples public rows: nothing is recorded for either."""
    ledger_path = store / "ledger.db"
    if not ledger_path.is_file():
        return
    ledger = Ledger(ledger_path)
    record = ledger.version(name, version)
    if record is None and ledger.public_source(name, version) is not None:
        return
    key = store_key(store)
    digests = row_digests(table_rows(path, surface_schema(schema)), key)
    ledger.record_rows(
        "generated",
        record.dataset if record is not None else schema.dataset.name,
        digests_blob(digests),
        table_fingerprint(digests, key),
        record.run_id if record is not None else None,
        name,
        version,
    )


def resolve_parent(config: RunConfig, schema: Schema) -> Parent | None:
    """The checked parent of a warm start (None without `init_from`); MLflow must point at the store."""
    if config.init_from is None:
        return None
    ledger = config.store.resolve() / "ledger.db"
    parent = find_parent(config.init_from, ledger)
    check_parent(parent, config, schema, ledger)
    return parent


__all__ = [
    "DATA_TAG",
    "PRETRAINED_TAG",
    "PUBLIC_ROW_SHARE",
    "Parent",
    "PretrainingRows",
    "UndeclaredPublicParent",
    "check_parent",
    "check_pretraining_rows",
    "check_public_file",
    "declare_public_version",
    "find_parent",
    "record_charged_rows",
    "record_charged_sample",
    "record_generated_table",
    "record_pretrained",
    "record_registered_version",
    "resolve_parent",
    "schema_difference",
    "weights_digest",
]
