"""Warm starts: DP training that begins from a registered model's weights instead of the
config's random initialisation (the DP-GAN note, Boob et al. 2018, section 3.2:
"using relevant publicly available datasets for warm starting").

Which parents are allowed, and what starting from them costs (docs/privacy.md, privacy
rules 3, 5 and 7):

- **Public pretraining** (`privflow pretrain`): the weights are a function of data the
  operator declared public and of public settings. Starting from them reads no private row and
  costs nothing. The declaration is the data owner's, made once and recorded in the store's
  ledger (`Ledger.declare_public`: the exact version, the digest of its weights, the keyed
  fingerprint of the public table) when `pretrain` registers the version. The version tag
  ``privflow.pretrained=public`` is information only: anyone with registry write access can set
  it, so a version carrying it without the ledger's declaration is refused
  (`UndeclaredPublicParent`).
- **A private release of the same dataset** (version tag ``dataset`` equal to this run's
  schema's dataset): its weights came out of mechanisms whose events this store's ledger
  already holds (its ledger run must be there, charged). The new run is recorded as one
  more run of that dataset, and the ledger composes all of a dataset's runs, so the
  dataset's cumulative epsilon covers the warm-started model (parent and child together):
  nothing is charged twice and nothing is missed. The new run's ledger entry and its MLflow
  params name the parent version (the lineage). The new version's own epsilon is its lineage's
  (privacy rule 9): its weights are a function of the parent's release, so the only valid
  bound for it alone is the composition of every private ancestor's run and this one
  (`Ledger.lineage`), which it reports as its epsilon; its run's own figure is kept beside it.
- **A private release of another dataset: refused.** That release is already public output,
  and reusing it is post-processing *for its own dataset*: it would cost that dataset
  nothing more. What privflow cannot know is whether the two datasets describe some of the
  same people. If they do, the new model's guarantee towards them is the composition of the
  two datasets' runs, while this dataset's ledger holds only its own, so its reported
  cumulative epsilon would be too low. Whether the other release may count as public for
  this dataset is the data owner's call, and it must be made explicitly: sample the other
  model (`privflow generate`, post-processing) and pretrain on that table with
  `privflow pretrain`, which records it as a declared public source.
- A version without privflow's tags (neither public pretraining nor a dataset and ledger
  run) is refused: its privacy cannot be told.

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

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError
from privflow.data.schema import Column, Schema
from privflow.privacy.fingerprint import KEY_FILE, keyed_fingerprint, store_key
from privflow.privacy.ledger import CHARGED_STATUSES, Ledger
from privflow.tasks.run_plan import head_planned

if TYPE_CHECKING:  # MLflow (and Prefect) load only where the registry is read: `find_parent`
    import torch

    from privflow.tasks.mlflow_store import LoadedVersion

PRETRAINED_TAG = "privflow.pretrained"  # "public" on versions registered by `privflow pretrain`
DATA_TAG = "privflow.data"  # "public": what the weights were trained on
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
    dataset: str | None  # the dataset a private parent was trained on
    ledger_run: str | None  # a private parent's run in the ledger
    loaded: LoadedVersion

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
        return (
            f"{self.spec}: private on dataset '{self.dataset}', ledger run {self.ledger_run} (already counted; "
            "this run composes with it)"
        )


def weights_digest(loaded: LoadedVersion) -> str:
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


def declare_public_version(store: Path, name: str, version: str, data: Path, dataset: str) -> None:
    """`privflow pretrain`'s declaration, in the store's ledger: version `name/version` (its
    weights as registered) was trained on the table `data`, which the data owner declares public."""
    from privflow.tasks.mlflow_store import load_version

    weights = weights_digest(load_version(name, version))
    fingerprint = keyed_fingerprint(data, store_key(store))
    Ledger(store / "ledger.db").declare_public(name, version, weights, fingerprint, dataset)


def _declared(spec: str, name: str, version: str, loaded: LoadedVersion, ledger_path: Path | None) -> bool:
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
    Public only when the store's ledger (`ledger_path`) holds `pretrain`'s declaration of it."""
    from privflow.tasks.mlflow_store import load_version, resolve_version

    name, version, tags = resolve_version(spec)
    loaded = load_version(name, version)
    if _declared(spec, name, version, loaded, ledger_path):
        return Parent(name, version, "public", None, None, loaded)
    if tags.get(PRETRAINED_TAG) == "public":
        raise UndeclaredPublicParent(
            f"--init-from {spec}: version {version} of '{name}' carries the registry tag {PRETRAINED_TAG}=public, "
            f"but the store's ledger ('{ledger_path}') holds no declaration of it by `privflow pretrain`. Whether "
            "weights count as public is the data owner's decision, recorded in the ledger when `privflow pretrain` "
            "registers a version from a table declared public; a registry tag can be set by anyone with write "
            "access to the registry, so it decides nothing. Pretrain the parent with `privflow pretrain` on this "
            "store (--store) and warm-start from that version; nothing was reserved or read."
        )
    if tags.get("dataset") and tags.get("privflow_run_id"):
        return Parent(name, version, "private", tags["dataset"], tags["privflow_run_id"], loaded)
    raise ConfigError(
        f"--init-from {spec}: version {version} of '{name}' is neither a public pretraining declared in this "
        "store's ledger by `privflow pretrain` nor a privflow DP release with a dataset and a ledger run, so what "
        "it cost cannot be told. Warm-start from a model registered by `privflow pretrain` or by `privflow run` "
        "on this dataset."
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
            "section in --config (or --model), or pretrain a parent with this run's model settings."
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


def check_public_file(path: Path, store: Path) -> None:
    """Refuse to pretrain on a file this store's ledger knows as private data (its keyed
    fingerprint, privacy/fingerprint.py, matches one recorded for a dataset): "public" is the
    operator's declaration, and this catches the plain mistake of declaring the training file
    itself public. Nothing is created: without a ledger and a key no file was charged here."""
    ledger, key = store / "ledger.db", store / "secret" / KEY_FILE
    if not (ledger.is_file() and key.is_file()):
        return
    fingerprint = keyed_fingerprint(path, store_key(store))
    for record in Ledger(ledger).datasets():
        if fingerprint == record.fingerprint or fingerprint in record.fingerprints:
            raise ConfigError(
                f"'{path}' is the very file that runs on dataset '{record.name}' were charged for in the ledger "
                f"('{ledger}'): it is private data, not public. Pretrain only on a table that is public (a published "
                "sample, an older public release, a synthetic table from a released model); nothing was trained."
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
    "Parent",
    "UndeclaredPublicParent",
    "check_parent",
    "check_public_file",
    "declare_public_version",
    "find_parent",
    "resolve_parent",
    "schema_difference",
    "weights_digest",
]
