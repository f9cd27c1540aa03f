"""dpad: DP anomaly detection by sample-and-aggregate (DP-NF, Waites & Cummings 2021, section 5,
Algorithm 2): an ensemble of k NON-private flows, one per disjoint part of the private rows,
and the charged, per-query release of its noisy majority vote.

Fit (`fit_ensemble`). The rows are read with the total reader (a line it cannot parse is a
failing row, not a refusal) and validated with a per-row filter that never stops on the data
(failing rows are set aside to the curator-only quarantine file); no minimum is put on their
number (a part with too few rows trains no flow and votes "normal"). They are partitioned by a salted hash
of each row (privacy/mechanisms/dp_ad.py, `partition_of`), and each part trains the configured
flow without noise (`tasks/fit.fit(private=False)`) on its rows less a held-out share, whose
log-likelihoods set that part's threshold. The flows are private data: they are written to the
curator-only store (`<store>/curator/<ensemble id>/`, owner-only permissions) and to nowhere
else: not MLflow, not the registry, not the synthetic folder. Nothing is released, so the fit
charges nothing; it registers the ensemble id against the schema's dataset in the ledger (a
run with no events, settled), so that every later query is charged to that dataset, and it is
refused up front when the dataset's budget cannot pay for even one query.

Score (`score_queries`). The query rows (the analyst's, not the private table) are read and
validated first, so that their number q is known and a bad file costs nothing. Then the ledger
reserves the whole call, q epsilon-DP answers (or, with the sparse vector technique, its
cutoff), and refuses it (BudgetExceeded) before any vote is counted. Each part's flow then
votes on every row, the votes are aggregated by the mechanism (Report-Noisy-Max, or SVT), and
the ledger is settled with what was answered. Only the DP answers leave: never a vote count,
a part's log-likelihood or a threshold.
"""

from __future__ import annotations

import math
import secrets
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from privflow.core.config import DPAD_MIN_PART_ROWS, RunConfig
from privflow.core.curator import curator_dir, write_json
from privflow.core.errors import ModelNotFound, PrivacyPlanError
from privflow.data.codec import Codec
from privflow.data.io import read_table
from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.data.validation import SCORED_ADVICE, validate
from privflow.models import build_flow
from privflow.privacy.accounting.events import Event
from privflow.privacy.ledger import Ledger, compose_epsilon
from privflow.privacy.mechanisms.dp_ad import (
    FLAGGED,
    NOT_ANSWERED,
    EnsembleSettings,
    SparseVector,
    holdout_coins,
    partition_of,
    partition_threshold,
    votes_out,
)
from privflow.tasks.fit import Spend, fit, prepare
from privflow.tasks.select import row_loglik

ENSEMBLE_FILE = "ensemble.json"
ID_PREFIX = "dpad-"
ANOMALY = "anomaly"
MIN_PART_ROWS = DPAD_MIN_PART_ROWS  # a part with fewer training rows trains no flow and votes "normal"


@dataclass
class PartitionModels:
    """The k parts' flows (None: the part had too few rows and votes "normal"), their thresholds,
    and facts about each part (row counts, a training failure): curator-only."""

    flows: list[torch.nn.Module | None]
    thresholds: np.ndarray
    train_rows: list[int] = field(default_factory=list)
    holdout_rows: list[int] = field(default_factory=list)
    failures: list[str | None] = field(default_factory=list)


def partition_schema(schema: Schema, settings: EnsembleSettings) -> Schema:
    """The schema each part trains under: the public expected_rows split over the parts and
    their training share (it only sets the Poisson rate and step count of the part's run)."""
    doc = schema.model_dump(mode="json")
    rows = schema.dataset.expected_rows
    if rows is not None:
        doc["dataset"]["expected_rows"] = max(
            1, round(rows * (1.0 - settings.holdout_fraction) / int(settings.partitions))
        )
    return Schema.model_validate(doc)


def part_config(config: RunConfig) -> RunConfig:
    """The configuration each part trains with: the run's model and training settings in the
    schema's codec, one flow over every column. DP marginals (`marginals`) and the target head
    (`head`) do not apply: a part's flow is not released and needs no DP statistic, all parts
    share one codec so that their votes are comparable, and a vote scores the whole row."""
    return config.model_copy(
        update={
            "marginals": config.marginals.model_copy(update={"enabled": False}),
            "head": config.head.model_copy(update={"enabled": False}),
        }
    )


def train_partitions(
    df: pl.DataFrame,
    schema: Schema,
    config: RunConfig,
    settings: EnsembleSettings,
    salts: tuple[int, int],
    on_part: Callable[[int, int], None] | None = None,
) -> PartitionModels:
    """DP-NF Algorithm 2, lines 2-3: split the typed rows into k parts by their salted hash and
    fit one non-private flow per part; each part's threshold from its own held-out rows.

    Every output of part i is a function of part i's rows (and public settings and
    data-independent randomness) only: the aggregation's one-vote sensitivity rests on this.
    """
    config = part_config(config)
    k = int(settings.partitions)
    part = partition_of(df, k, salts[0])
    held = holdout_coins(df, settings.holdout_fraction, salts[1])
    codec = Codec.from_schema(lower(schema))
    pschema = partition_schema(schema, settings)
    out = PartitionModels([], np.full(k, -math.inf))
    for i in range(k):
        rows = df.filter(pl.Series(part == i))
        in_part = held[part == i]
        train_df, hold_df = rows.filter(pl.Series(~in_part)), rows.filter(pl.Series(in_part))
        out.train_rows.append(train_df.height)
        out.holdout_rows.append(hold_df.height)
        flow, failure = None, None
        if train_df.height >= MIN_PART_ROWS:
            try:
                _, x_train, x_val = prepare(config, pschema, train_df, None, Spend())
                flow = fit(config, pschema, codec, x_train, x_val, private=False).flows[0].eval()
            except (RuntimeError, ValueError, FloatingPointError) as exc:  # a part that cannot train votes "normal"
                flow, failure = None, f"{type(exc).__name__}: {exc}"
        else:
            failure = f"{train_df.height} training row(s), fewer than {MIN_PART_ROWS}"
        out.flows.append(flow)
        out.failures.append(failure)
        if flow is not None:
            if settings.threshold is not None:
                out.thresholds[i] = float(settings.threshold)
            else:
                x_hold = codec.encode(hold_df, np.random.default_rng())
                ll = row_loglik(flow, x_hold) if hold_df.height else np.empty(0)
                out.thresholds[i] = partition_threshold(ll, float(settings.fpr))  # type: ignore[arg-type]
        if on_part is not None:
            on_part(i + 1, k)
    return out


def ensemble_loglik(models: PartitionModels, x: np.ndarray) -> np.ndarray:
    """[parts, queries] log-likelihoods of encoded query rows; +inf for a part without a flow
    (with its threshold of -inf it votes "normal")."""
    out = np.full((len(models.flows), len(x)), math.inf)
    for i, flow in enumerate(models.flows):
        if flow is not None and len(x):
            out[i] = row_loglik(flow, x).astype(np.float64)
    return out


def ensemble_votes(models: PartitionModels, codec: Codec, df: pl.DataFrame) -> np.ndarray:
    """c_out per query row of a typed frame: the number of parts voting anomalous."""
    x = codec.encode(df, np.random.default_rng())
    return votes_out(ensemble_loglik(models, x), models.thresholds)


# -- the ensemble in the curator store ---------------------------------------------------------------


@dataclass
class Ensemble:
    """A fitted DP-AD ensemble as stored under `<store>/curator/<id>/` (curator-only)."""

    ensemble_id: str
    dataset: str
    schema: Schema
    settings: EnsembleSettings
    model: dict[str, Any]
    models: PartitionModels
    folder: Path
    quarantined_rows: int = 0

    @property
    def codec(self) -> Codec:
        return Codec.from_schema(lower(self.schema))

    def sparse_vector(self, max_flags: int, threshold: float | None = None) -> SparseVector:
        """SVT settings over this ensemble's votes: epsilon per flag = epsilon per query,
        threshold default k/2 (a majority of anomalous votes)."""
        k = int(self.settings.partitions)
        t = k / 2.0 if threshold is None else float(threshold)
        return SparseVector(k, float(self.settings.epsilon_per_query), t, int(max_flags))


def _part_file(i: int) -> str:
    return f"part-{i:03d}.pt"


def save_ensemble(ens: Ensemble, salts: tuple[int, int], created: str) -> Path:
    """Write the flows and the description to the ensemble's curator-only folder."""
    parts = []
    for i, flow in enumerate(ens.models.flows):
        name = None
        if flow is not None:
            name = _part_file(i)
            torch.save(flow.state_dict(), ens.folder / name)
        parts.append(
            {
                "file": name,
                "threshold": float(ens.models.thresholds[i]),
                "train_rows": ens.models.train_rows[i],
                "holdout_rows": ens.models.holdout_rows[i],
                "failure": ens.models.failures[i],
            }
        )
    return write_json(
        ens.folder,
        ENSEMBLE_FILE,
        {
            "ensemble_id": ens.ensemble_id,
            "dataset": ens.dataset,
            "created": created,
            "settings": asdict(ens.settings),
            "model": ens.model,
            "schema": ens.schema.model_dump(mode="json"),
            "salts": list(salts),
            "quarantined_rows": ens.quarantined_rows,
            "parts": parts,
        },
    )


def fit_ensemble(
    raw: pl.DataFrame | Path,
    schema: Schema,
    config: RunConfig,
    settings: EnsembleSettings,
    store: Path,
    on_part: Callable[[int, int], None] | None = None,
) -> Ensemble:
    """Train the ensemble into the curator store and register its id against the dataset.

    Before any row is read: the ledger checks that the dataset can pay for one query (refused
    otherwise, nothing recorded) and records the ensemble as a run with no events. Nothing is
    released, so nothing is charged. The fit never stops on the data (failing rows are set aside,
    a part that cannot train votes "normal"), so whether it succeeds reveals nothing about it.
    """
    config = part_config(config)
    store = Path(store).resolve()
    dataset = schema.dataset.name
    ledger = Ledger(store / "ledger.db")
    ledger.ensure_dataset(dataset, schema.dataset.budget.epsilon, schema.dataset.budget.delta)
    ledger.check(
        dataset,
        [settings.aggregation().event(1)],
        who=f"A DP-AD ensemble on dataset '{dataset}' (it could not answer a single query at "
        f"epsilon={settings.epsilon_per_query:g})",
    )
    ens_id = f"{ID_PREFIX}{uuid.uuid4().hex[:12]}"
    ledger.reserve(
        dataset,
        ens_id,
        [],
        {
            "dpad": f"ensemble of {settings.partitions} non-private flows in the curator store; nothing released; "
            f"each query costs pure_dp(eps={settings.epsilon_per_query:g})"
        },
    )
    try:
        folder = curator_dir(store, ens_id)
        df = raw if isinstance(raw, pl.DataFrame) else read_table(raw, max_line_bytes=schema.dataset.max_line_bytes)
        typed, report = validate(
            df, schema, "quarantine", folder / "quarantine.csv", gate=lambda _failing, _passing: False
        )
        salts = (secrets.randbits(63), secrets.randbits(63))
        models = train_partitions(typed, schema, config, settings, salts, on_part)
        ens = Ensemble(
            ens_id,
            dataset,
            schema,
            settings,
            config.model.model_dump(mode="json"),
            models,
            folder,
            report.quarantined_rows,
        )
        save_ensemble(ens, salts, datetime.now(UTC).isoformat(timespec="seconds"))
    except BaseException:
        ledger.release(ens_id)  # no mechanism ran and nothing left the process
        raise
    ledger.settle(ens_id, [])
    return ens


def load_ensemble(store: Path, ensemble_id: str) -> Ensemble:
    """The ensemble `ensemble_id` from `<store>/curator/`; ModelNotFound when it is not there."""
    root = Path(store).resolve() / "curator"
    if not (ensemble_id.startswith(ID_PREFIX) and ensemble_id.replace("-", "").isalnum()):
        raise ModelNotFound(f"'{ensemble_id}' is not a DP-AD ensemble id (they look like {ID_PREFIX}0123456789ab).")
    folder = root / ensemble_id
    meta_path = folder / ENSEMBLE_FILE
    if not meta_path.is_file():
        raise ModelNotFound(
            f"No DP-AD ensemble '{ensemble_id}' in the store '{root.parent}' (looked for {meta_path}); run "
            "`privflow dpad fit` first, or pass the --store it was fitted in."
        )
    import json

    meta = json.loads(meta_path.read_text())
    schema = Schema.model_validate(meta["schema"])
    settings = EnsembleSettings(**meta["settings"])
    codec = Codec.from_schema(lower(schema))
    model = dict(meta["model"])
    name = model.pop("name")
    flows: list[torch.nn.Module | None] = []
    for part in meta["parts"]:
        if part["file"] is None:
            flows.append(None)
            continue
        flow = build_flow(name, codec.cardinalities, **model)
        flow.load_state_dict(torch.load(folder / part["file"], map_location="cpu", weights_only=True))
        flows.append(flow.eval())
    models = PartitionModels(
        flows,
        np.array([float(p["threshold"]) for p in meta["parts"]]),
        [int(p["train_rows"]) for p in meta["parts"]],
        [int(p["holdout_rows"]) for p in meta["parts"]],
        [p["failure"] for p in meta["parts"]],
    )
    return Ensemble(
        meta["ensemble_id"],
        meta["dataset"],
        schema,
        settings,
        dict(meta["model"]),
        models,
        folder,
        int(meta.get("quarantined_rows", 0)),
    )


def check_registered(ledger: Ledger, ens: Ensemble) -> None:
    """The ensemble's id must be registered (settled) against its dataset in this ledger:
    queries are charged there, and an ensemble copied from another store is not."""
    try:
        runs = ledger.runs(ens.dataset)
    except Exception:  # noqa: BLE001 - an unreadable ledger is the same refusal
        runs = []
    if not any(r.run_id == ens.ensemble_id and r.status == "settled" for r in runs):
        raise PrivacyPlanError(
            f"DP-AD ensemble '{ens.ensemble_id}' is not registered against dataset '{ens.dataset}' in the ledger "
            f"'{ledger.path}', so its queries cannot be charged; score it with the --store it was fitted in."
        )


# -- scoring (charged per query) ------------------------------------------------------------------


@dataclass(frozen=True)
class DPADScore:
    """One charged scoring call: the table with its DP answers and what the call spent."""

    table: pl.DataFrame
    queries: int
    answered: int
    flagged: int
    events: tuple[Event, ...]
    epsilon: float
    dataset_epsilon: float
    dataset: str
    ledger_run_id: str
    mechanism: str


def read_queries(ens: Ensemble, path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(raw, typed) query rows; every row must pass the schema's checks (strict). These are the
    analyst's rows, not the private table: reading them spends nothing."""
    raw = read_table(
        path, max_line_bytes=ens.schema.dataset.max_line_bytes
    )  # no column can clash with `anomaly`: the schema reserves the name
    typed, _ = validate(raw, ens.schema, "strict", advice=SCORED_ADVICE)
    return raw, typed


def score_queries(
    ens: Ensemble,
    path: Path,
    store: Path,
    svt: SparseVector | None = None,
    on_reserved: Callable[[str], None] | None = None,
) -> DPADScore:
    """DP answers for every query row of `path`, charged to the ensemble's dataset.

    The query rows are validated first (a bad file costs nothing); the ledger reserves the call
    (q answers, or the SVT cutoff) and refuses it before any vote is counted; the votes are
    aggregated by the mechanism; the ledger settles what was answered. Any failure after the
    reservation abandons it (it stays counted).
    """
    store = Path(store).resolve()
    ledger = Ledger(store / "ledger.db")
    check_registered(ledger, ens)
    raw, typed = read_queries(ens, path)
    q = typed.height
    agg = ens.settings.aggregation()
    planned = svt.reserve_event(q) if svt is not None else agg.event(q)
    kind = (
        f"svt(eps={svt.epsilon:g}/flag, T={svt.threshold:g}, cutoff={svt.max_flags})"
        if svt is not None
        else f"report_noisy_max(eps={agg.epsilon:g}/query)"
    )
    lid = f"dpad-score-{uuid.uuid4()}"
    ledger.reserve(ens.dataset, lid, [planned], {"dpad": f"ensemble {ens.ensemble_id}: {q} queries, {kind}"})
    try:
        if on_reserved is not None:
            on_reserved(lid)
        votes = ensemble_votes(ens.models, ens.codec, typed)
        if svt is None:
            flags = agg.release(votes)
            answer = pl.Series(ANOMALY, flags, dtype=pl.Boolean)
            spent: Event = agg.event(q)
            answered = q
        else:
            result = svt.release(votes)
            answer = pl.Series(
                ANOMALY, [None if a == NOT_ANSWERED else bool(a == FLAGGED) for a in result.answers.tolist()]
            )
            spent = svt.event(result.instances)
            answered = result.answered
        del votes  # never leaves this function
    except BaseException:
        ledger.abandon(lid)
        raise
    ledger.settle(lid, [spent])
    table = raw.with_columns(answer)
    dataset_eps = ledger.spent(ens.dataset)[0]
    budget_delta = ens.schema.dataset.budget.delta
    for d in ledger.datasets():
        if d.name == ens.dataset:
            budget_delta = d.budget_delta
    return DPADScore(
        table,
        q,
        answered,
        int(table[ANOMALY].sum() or 0),
        (spent,),
        compose_epsilon([spent], budget_delta),
        dataset_eps,
        ens.dataset,
        lid,
        kind,
    )


__all__ = [
    "ANOMALY",
    "DPADScore",
    "Ensemble",
    "EnsembleSettings",
    "PartitionModels",
    "check_registered",
    "ensemble_loglik",
    "ensemble_votes",
    "fit_ensemble",
    "load_ensemble",
    "part_config",
    "partition_schema",
    "read_queries",
    "score_queries",
    "train_partitions",
]
