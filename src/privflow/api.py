"""The Python API, in the idiom of SDV and smartnoise-synth: fit once, then sample and score.

    from privflow.api import Synthesizer, fit
    synth = fit("adult_train.csv", "adult.yaml", epsilon=1.0, delta=1e-5, store="store", train={"epochs": 2})
    table = synth.sample(1000, seed=7)          # polars DataFrame
    ll = synth.score(table)                     # per-row log-likelihoods (nats)
    again = Synthesizer.load("privflow-adult@champion", store="store")

`fit` runs the pipeline `privflow run` runs (pre-flight's checks, the plan reserved in the
ledger, DP validation gate, DP marginals and statistics, [DP prior], DP-SGD, Report-Noisy-Max,
MLflow registry), then loads the registered version back. Like `privflow run`, it runs the
pipeline in this process without Prefect's engine (flows/pipeline.py, `train_in_process`) unless
PREFECT_API_URL is set or `prefect=True` is passed: then as the Prefect flow (flows/train.py).
`sample` and `score` are post-processing of the released model: they spend no privacy and never
touch the training rows.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from privflow.core import env
from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError, DataError, PrivflowError, SchemaError, first_line
from privflow.data.lowering import to_surface
from privflow.data.schema import Schema
from privflow.serving.release import Release, score_rows

if TYPE_CHECKING:
    from privflow.flows.pipeline import RunSummary


class Synthesizer:
    """A released privflow model (its `Release`: public schema, flows, codec, DP marginals and
    target head, and the registered version's tags) and the run that produced it (`summary`,
    after `fit`).

    `Synthesizer(schema, flows, ...)` builds the release from its parts; `Synthesizer.load` and
    `fit` hold the registered version's release as `tasks/mlflow_store.load_version` loads it
    (`from_release`)."""

    release: Release
    summary: RunSummary | None

    def __init__(
        self,
        schema: Schema,
        flows: list[Any],
        summary: RunSummary | None = None,
        marginals: dict[str, Any] | None = None,
        head: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        self.release = Release(schema, flows, marginals, head, tags=dict(tags or {}))
        self.summary = summary

    @classmethod
    def from_release(cls, release: Release, summary: RunSummary | None = None) -> Synthesizer:
        """The model of a loaded release (`privflow.serving.release.load_release`)."""
        synth = cls.__new__(cls)
        synth.release, synth.summary = release, summary
        return synth

    def __repr__(self) -> str:
        version = f", version={self.release.version!r}" if self.release.version is not None else ""
        return f"Synthesizer(dataset={self.schema.dataset.name!r}, flows={len(self.flows)}{version})"

    @property
    def schema(self) -> Schema:
        """The release's public schema."""
        return self.release.schema

    @property
    def flows(self) -> list[Any]:
        """The release's flows (eval mode, CPU)."""
        return self.release.flows

    @property
    def codec(self) -> Any:
        """The codec the flows model (`privflow.data.target_head.release_codec`)."""
        return self.release.codec

    @property
    def marginals(self) -> dict[str, Any] | None:
        """The DP marginals the model was trained through, if any."""
        return self.release.marginals

    @property
    def head(self) -> dict[str, Any] | None:
        """The model's DP target head, if any."""
        return self.release.head

    @property
    def tags(self) -> dict[str, str]:
        """The registered version's tags (`load`; empty otherwise)."""
        return self.release.tags

    @property
    def epsilon(self) -> float | None:
        """The model's epsilon (privacy rule 9): the ledger's PLD composition of the recorded
        events of the run that trained it and of every private release it was warm-started from
        (this run's own without a private parent), at `delta`. From the run's summary (`fit`) or
        the registered version's tag (`load`); None when neither is known."""
        return self._figure("epsilon", "epsilon")

    @property
    def delta(self) -> float | None:
        """The delta `epsilon` is stated at."""
        return self._figure("delta", "delta")

    @property
    def epsilon_run(self) -> float | None:
        """The epsilon of the run that trained this model alone (not a bound for the model when
        it was warm-started from a private parent: `epsilon` is)."""
        return self._figure("epsilon_run", "epsilon_run_alone")

    def _figure(self, field: str, tag: str) -> float | None:
        """A privacy figure from the run's summary (`fit`), else from the version's tag (`load`)."""
        if self.summary is not None:
            return getattr(self.summary, field)
        return float(self.tags[tag]) if tag in self.tags else None

    @property
    def lineage(self) -> str | None:
        """The versions the weights descend from, NAME/V -> ... -> this version."""
        if self.summary is not None:
            return self.summary.lineage
        return self.tags.get("privflow.lineage")

    def sample(
        self, n: int, seed: int | None = None, where: Mapping[str, Any] | Sequence[str] | None = None
    ) -> pl.DataFrame:
        """`n` synthetic rows; `seed` makes the draw reproducible (else a CSPRNG seed). The table
        is built in memory: `n` it could not hold is refused before sampling (stream larger
        tables to a file with `privflow generate`). Rows come as the input is written
        (privflow/data/lowering.py): dates as text in their format, booleans as their labels,
        numeric columns rounded to their `decimals`, no ignored column.

        `where` (conditions combined with AND): only rows that meet them, drawn from the model's
        conditional law (the target through its head, anything else by rejection:
        privflow/serving/conditions.py). A mapping {column: value}: a categorical or boolean
        column's label; for an integer, numeric, date or datetime column a number or date
        (equality), a (low, high) pair (a range, both ends included) or a condition's text
        ('>=40', '!=3', '30..50'; dates in the column's format). Or a list of `privflow generate
        --where` texts: ['sex=Female', 'age>=40', 'age<60']. Checked against the public schema
        before sampling; a condition too rare to reach `n` rows is refused (ConfigError)."""
        from privflow.preflight import check_memory, check_seed
        from privflow.serving.conditions import conditions_for
        from privflow.serving.sampler import sample_rows

        _check_count(n, "n", 1)
        n, seed = int(n), check_seed(seed, "seed")
        conditions = conditions_for(self.schema, where, "where")
        fewer = "sample fewer rows at a time, or stream them to a file with `privflow generate`"
        check_memory(n, len(self.schema.columns), f"sample({n:,})", fewer)
        rows = sample_rows(self.flows, self.codec, n, seed=seed, where=conditions)
        return to_surface(rows, self.schema)  # as the input is written

    def score(self, rows: pl.DataFrame | Any, seed: int | None = None) -> np.ndarray:
        """Per-row log-likelihood (nats, privflow's encoded space) of `rows` under the released
        model: the equal-weight mixture of its checkpoints, as `sample` draws from it, plus the
        target head's log-probability of the row's target when the model has one. Rows must
        pass the schema's checks (as `privflow score` requires): a row the model cannot encode
        has no score."""
        from privflow.data.validation import SCORED_ADVICE, validate
        from privflow.preflight import check_seed

        seed = check_seed(seed, "seed")
        df, _ = validate(_frame(rows, "rows"), self.schema, "strict", advice=SCORED_ADVICE)
        return score_rows(self.release, df, seed)

    def save(self, folder: str | Path) -> Path:
        """Write the released model to a new folder that `Synthesizer.load(folder)` reads back:
        its flows, public schema, DP marginals and target head, and the registry's version and
        tags where it came from there. Nothing private: every part went through a mechanism
        already; the ledger stays in the store. ConfigError for a folder that is not new and
        empty, or a model that does not name the flow it was built as (nothing is written)."""
        from privflow.serving.release import save_release

        try:
            return save_release(self.release, folder)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @classmethod
    def load(cls, model: str | Path, version: str | int | None = None, store: str | Path | None = None) -> Synthesizer:
        """A registered version from the store's MLflow registry, named as the CLI names it:
        `model` "NAME@ALIAS" or "NAME/VERSION" (`Synthesizer.load("privflow-adult@champion",
        store="store")`), or a model NAME with `version` a number or an alias. `store` is the
        folder `fit` or `privflow run` wrote to. ModelNotFound when the store has no such version.
        Or a folder `save` wrote (`Synthesizer.load("saved-model")`: no store needed)."""
        from privflow.preflight import check_registry
        from privflow.serving.release import is_saved, load_saved

        if version is None and is_saved(model):
            return cls.from_release(load_saved(model))
        model = str(model)

        if version is not None:
            spec = f"{model}/{version}" if str(version).isdigit() else f"{model}@{version}"
        elif "@" in model or "/" in model:
            spec = model
        else:
            raise ConfigError(
                f"load needs a version: 'NAME@ALIAS' or 'NAME/VERSION' (e.g. '{model}@champion'), or the "
                "version as its second argument."
            )
        store = _store(store)
        check_registry(store, f"model {spec}", "Train and register one first (`fit` or `privflow run`).")
        env.configure(store)
        from privflow.tasks import mlflow_store  # imports mlflow and prefect: after env.configure

        mlflow_store.tracking(Path(store).resolve())
        name, number, tags = mlflow_store.resolve_version(spec)
        return cls.from_release(mlflow_store.load_version(name, number, tags))


def _check_count(value: Any, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} must be a whole number of at least {low}, got {value!r}.")


def _frame(data: Any, what: str) -> pl.DataFrame:
    """A polars DataFrame from a polars or pandas one; anything else is a user error."""
    if isinstance(data, pl.DataFrame):
        return data
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with mlflow
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        try:
            return pl.from_pandas(data)
        except Exception as exc:  # noqa: BLE001 - pyarrow's conversion errors: a column of mixed types
            first = first_line(exc)
            raise DataError(f"{what} cannot be read as a table ({first}); give each column one type.") from None
    raise ConfigError(
        f"{what} must be a polars or pandas DataFrame (or, for fit, a CSV/Parquet path), got {type(data).__name__}."
    )


def _schema_path(schema: str | Path | Schema | dict[str, Any], tmp: Path) -> Path:
    if isinstance(schema, (str, Path)):
        return Path(schema)
    if isinstance(schema, Schema):
        obj = schema
    elif isinstance(schema, dict):
        obj = Schema.validated(schema)
    else:
        raise SchemaError(f"schema must be a YAML path, a Schema or its dict, got {type(schema).__name__}.")
    path = tmp / "schema.yaml"
    path.write_text(obj.to_yaml())
    return path


def _data_path(data: str | Path | pl.DataFrame | Any, tmp: Path) -> Path:
    if isinstance(data, (str, Path)):
        return Path(data)
    frame = _frame(data, "data")
    # written as CSV, a date or bytes would become text that fails every row at the charged
    # validation gate: refused here, for free, as pre-flight refuses such a Parquet column
    odd = {c: t for c, t in frame.schema.items() if t.is_temporal() or t in (pl.Binary, pl.Object)}
    if odd:
        listed = ", ".join(f"'{c}' ({t})" for c, t in odd.items())
        raise DataError(
            f"data has columns privflow cannot read: {listed}. It reads numbers, whole numbers and text "
            "(category and boolean labels, dates in their schema column's format); convert those columns "
            "first (e.g. a date column to text with its schema `format`), or pass the table as a file."
        )
    path = tmp / "data.csv"
    try:
        frame.write_csv(path)
    except pl.exceptions.PolarsError as exc:  # nested (list, struct) columns have no CSV form
        first = first_line(exc)
        raise DataError(f"data cannot be written as a table ({first}); give every column plain values.") from None
    return path


def _store(store: Any) -> Path:
    if store is None:
        raise ConfigError(
            "store is required: the folder that holds the privacy ledger, the MLflow registry and the "
            "synthetic tables (e.g. store='.privflow', what `privflow run` uses by default). Nothing was read."
        )
    if not isinstance(store, str | Path):
        raise ConfigError(f"store must be a folder path (str or Path), got {type(store).__name__}.")
    return Path(store)


def fit(
    data: str | Path | pl.DataFrame | Any,
    schema: str | Path | Schema | dict[str, Any],
    epsilon: float = 1.0,
    delta: float = 1e-5,
    *,
    store: str | Path | None = None,
    show_progress: bool = False,
    prefect: bool | None = None,
    **config: Any,
) -> Synthesizer:
    """Train a DP flow on `data` (a CSV/Parquet path, or a polars/pandas DataFrame) described by
    `schema` (a YAML path, a Schema or its dict) at (epsilon, delta), and return the released model.

    Side effects, all in `store` (required: a folder, created if missing), as `privflow run`
    has them: the run is reserved and then charged in the store's privacy ledger (its epsilon
    composes with every earlier run on the schema's dataset, and a run the budget cannot hold
    is refused before any row is read); a new version of the model (`model_name`, default
    privflow-DATASET) is registered in the store's MLflow registry, and the alias (`alias`,
    default champion) moves to it by the run's `promotion` rule (the first version always; later
    ones by a DP comparison, charged too, unless promotion="always" or "never"); the synthetic
    table and the curator-only reports are written there. A DataFrame is written to a temporary
    CSV that is removed when fit returns. Nothing is written outside `store` and the temporary
    folder.

    `config` holds RunConfig sections and fields (privflow/core/config.py), e.g.
    `model={"name": "maf"}, train={"epochs": 2}, promotion="never"`. `prefect` runs the
    pipeline as a Prefect flow (True) or in this process without Prefect's engine (False);
    None, the default, decides as `privflow run` does: a flow when PREFECT_API_URL is set.
    What is charged, recorded and registered is the same either way.
    """
    from privflow.core.startup import use_prefect
    from privflow.preflight import preflight

    privacy = config.pop("privacy", {})
    if not isinstance(privacy, dict):
        raise ConfigError(f"privacy must be a mapping of privacy settings, got {type(privacy).__name__}.")
    with tempfile.TemporaryDirectory(prefix="privflow-api-") as tmp:
        run = RunConfig.build(
            data=_data_path(data, Path(tmp)),
            schema_path=_schema_path(schema, Path(tmp)),
            store=_store(store),
            privacy={**privacy, "epsilon": epsilon, "delta": delta},
            **config,
        )
        # the CLI's checks, before the store is set up, any server starts or the ledger reserves
        try:
            checked = preflight(run)
            run = checked.config
            for note in checked.notes:
                warnings.warn(note, UserWarning, stacklevel=2)
        except PrivflowError as exc:  # name the caller's frame or schema, not this call's temporary copy
            text = str(exc)
            for path, what in ((run.data, "the data frame given to fit"), (run.schema_path, "the schema given")):
                if Path(tmp) in Path(path).parents:
                    text = text.replace(f"'{path}'", what).replace(str(path), what)
            if text == str(exc):
                raise
            raise type(exc)(text) from None
        engine = use_prefect(prefect is True, prefect is False)
        env.configure(store)  # offline, quiet settings before prefect and mlflow are imported
        if engine:  # imports prefect: after env.configure; the flow plans in its own plan task
            from privflow.flows.train import train_pipeline

            summary = train_pipeline(run, show_progress=show_progress)
        else:  # pre-flight's plan, handed down: computed once
            from privflow.flows.pipeline import train_in_process

            summary = train_in_process(run, show_progress=show_progress, plan=checked.plan)
    synth = Synthesizer.load(summary.model_name, summary.model_version, store=store)
    synth.summary = summary
    return synth


__all__ = ["Synthesizer", "fit"]
