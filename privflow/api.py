"""The Python API, in the idiom of SDV and smartnoise-synth: fit once, then sample and score.

    from privflow.api import fit
    synth = fit("adult_train.csv", "adult.yaml", epsilon=1.0, delta=1e-5, train={"epochs": 2})
    table = synth.sample(1000, seed=7)          # polars DataFrame
    ll = synth.score(table)                     # per-row log-likelihoods (nats)

`fit` runs the same Prefect flow as `privflow run` (flows/train.py: pre-planned budget in the
ledger, DP validation gate, DP statistics, [DP prior], DP-SGD, Report-Noisy-Max, MLflow
registry), then loads the registered version back. `sample` and `score` are post-processing
of the released model: they spend no privacy and never touch the training rows.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import torch

from privflow import env
from privflow.config import RunConfig
from privflow.privacy.mechanisms.promotion import mixture_loglik
from privflow.schema import Schema
from privflow.target_head import conditional_loglik, release_codec

if TYPE_CHECKING:
    from privflow.flows.pipeline import RunSummary


@dataclass
class Synthesizer:
    """A released privflow model: its public schema, its flows and the run that produced it."""

    schema: Schema
    flows: list[Any]
    summary: RunSummary | None = None
    marginals: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
    codec: Any = field(init=False)

    def __post_init__(self) -> None:
        self.codec = release_codec(self.schema, self.marginals, self.head)

    @property
    def epsilon(self) -> float | None:
        """The run's epsilon, as the accountant composed its recorded events."""
        return None if self.summary is None else self.summary.epsilon

    def sample(self, n: int, seed: int | None = None) -> pl.DataFrame:
        """`n` synthetic rows; `seed` makes the draw reproducible (else a CSPRNG seed)."""
        from privflow.sampler import sample_rows  # imports mlflow: after env.configure

        return sample_rows(self.flows, self.codec, n, seed=seed)

    def score(self, rows: pl.DataFrame | Any, seed: int | None = None) -> np.ndarray:
        """Per-row log-likelihood (nats, privflow's encoded space) of `rows` under the released
        model: the equal-weight mixture of its checkpoints, as `sample` draws from it, plus the
        target head's log-probability of the row's target when the model has one."""
        from privflow.tasks.select import row_loglik  # imports prefect: after env.configure

        df = rows if isinstance(rows, pl.DataFrame) else pl.from_pandas(rows)
        x = self.codec.encode(df.select(self.schema.names), np.random.default_rng(seed))
        if len(x) == 0:
            return np.empty(0)
        per = []
        for k, flow in enumerate(self.flows):  # the dequantization noise: from `seed` when given
            gen = torch.Generator().manual_seed(seed + k) if seed is not None else None
            per.append(row_loglik(flow, x, generator=gen).astype(np.float64))
        return mixture_loglik(np.stack(per)) + conditional_loglik(self.codec, df)

    @classmethod
    def load(cls, model_name: str, version: str, store: str | Path = ".privflow") -> Synthesizer:
        """A registered version from the store's MLflow registry."""
        env.configure(store)
        from privflow.tasks import mlflow_store  # imports mlflow and prefect: after env.configure

        mlflow_store.tracking(Path(store).resolve())
        loaded = mlflow_store.load_version(model_name, version)
        return cls(loaded.schema, loaded.flows, marginals=loaded.marginals, head=loaded.head)


def _schema_path(schema: str | Path | Schema | dict[str, Any], tmp: Path) -> Path:
    if isinstance(schema, (str, Path)):
        return Path(schema)
    obj = schema if isinstance(schema, Schema) else Schema.model_validate(schema)
    path = tmp / "schema.yaml"
    path.write_text(obj.to_yaml())
    return path


def _data_path(data: str | Path | pl.DataFrame | Any, tmp: Path) -> Path:
    if isinstance(data, (str, Path)):
        return Path(data)
    df = data if isinstance(data, pl.DataFrame) else pl.from_pandas(data)
    path = tmp / "data.csv"
    df.write_csv(path)
    return path


def fit(
    data: str | Path | pl.DataFrame | Any,
    schema: str | Path | Schema | dict[str, Any],
    epsilon: float = 1.0,
    delta: float = 1e-5,
    *,
    store: str | Path = ".privflow",
    show_progress: bool = False,
    **config: Any,
) -> Synthesizer:
    """Train a DP flow on `data` (a CSV/Parquet path, or a polars/pandas DataFrame) described by
    `schema` (a YAML path, a Schema or its dict) at (epsilon, delta), and return the released model.

    `config` holds RunConfig sections and fields (privflow/config.py), e.g.
    `model={"name": "maf"}, train={"epochs": 2}, promotion="never"`.
    """
    env.configure(store)  # offline, quiet settings before prefect and mlflow are imported
    from privflow.flows.train import train_pipeline  # imports prefect: after env.configure

    with tempfile.TemporaryDirectory(prefix="privflow-api-") as tmp:
        run = RunConfig.build(
            data=_data_path(data, Path(tmp)),
            schema_path=_schema_path(schema, Path(tmp)),
            store=Path(store),
            privacy={**config.pop("privacy", {}), "epsilon": epsilon, "delta": delta},
            **config,
        )
        summary = train_pipeline(run, show_progress=show_progress)
    synth = Synthesizer.load(summary.model_name, summary.model_version, store)
    synth.summary = summary
    return synth


__all__ = ["Synthesizer", "fit"]
