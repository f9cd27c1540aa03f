"""A released model, the one type every caller holds: `Release`, its loader and its scorer.

Everything a release holds went through a mechanism: the flow weights of the checkpoint(s)
that Report-Noisy-Max chose, the public schema, and the DP marginals and target head when
the run had them. A registered version stores them as artifact files (meta.json and one
``checkpoint_K.pt`` per selected checkpoint, tasks/mlflow_store.py `register_model`), and
`load_release` is the one function that builds a `Release` from them: MLflow's pyfunc
(privflow/serving/pyfunc.py), `privflow generate`'s read of a local store
(privflow/serving/local_store.py), and `tasks/mlflow_store.load_version` (the Python API,
`privflow score`, the flows' promotion and warm start) all call it. `score_rows` is the one
scorer of a release (the Python API's `Synthesizer.score`, `privflow score` and the score
flow). Loading needs no training data, no Prefect and no MLflow; torch is imported on first use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

    from privflow.data.schema import Schema


SAVED_META = "meta.json"  # a release's description among its artifact files


@dataclass
class Release:
    """A released generator: its public schema (as written), its flows (eval mode, CPU), the DP
    marginals and target head it was trained through (None without), and what the registry says
    of it where it came from there (`version`, its `tags`). `codec` (the codec the flows model,
    `privflow.data.target_head.release_codec`) is built once from the schema, marginals and head."""

    schema: Schema
    flows: list[Any]
    marginals: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
    model: dict[str, Any] | None = None  # the flow family and shape it was built with: {"name", "config"}
    version: str | None = None  # the registered version's number, where it was loaded from a registry
    tags: dict[str, str] = field(default_factory=dict)  # the registered version's tags, where read
    codec: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from privflow.data.target_head import release_codec

        self.codec = release_codec(self.schema, self.marginals, self.head)


def load_release(
    artifacts: Mapping[str, str | Path], version: str | None = None, tags: Mapping[str, str] | None = None
) -> Release:
    """The release from its artifact files (``{"meta": meta.json, "checkpoint_0": ..., ...}``, as a
    registered version stores them), with the registry's `version` and `tags` where the caller
    read them. The one loader of a release (module docstring)."""
    import torch

    from privflow.data.schema import Schema
    from privflow.models import build_flow

    meta = json.loads(Path(artifacts["meta"]).read_text())
    release = Release(
        Schema.model_validate(meta["schema"]),
        [],
        meta.get("marginals"),
        meta.get("head"),
        meta["model"],
        version,
        dict(tags or {}),
    )
    for key in meta["checkpoints"]:
        flow = build_flow(meta["model"]["name"], release.codec.cardinalities, **meta["model"]["config"])
        flow.load_state_dict(torch.load(artifacts[key], map_location="cpu", weights_only=True))
        flow.eval()
        release.flows.append(flow)
    return release


def score_rows(release: Release, rows: pl.DataFrame, seed: int | None = None) -> np.ndarray:
    """Per-row log-likelihood (nats, privflow's encoded space) of validated `rows` (as
    `privflow.data.validation.validate` returns them) under the release: the equal-weight
    mixture of its checkpoints, as the sampler draws from it, plus its target head's
    log-probability of the row's target when it has one.

    The encoding's draws and the flows' dequantization noise come from `seed` when given (a
    public seed: the same scores again), else from the OS CSPRNG (the rows may be private:
    never torch's global RNG). The one scorer of a release (module docstring)."""
    import numpy as np
    import torch

    from privflow.data.lowering import lower
    from privflow.data.target_head import conditional_loglik
    from privflow.privacy.mechanisms.promotion import mixture_loglik
    from privflow.privacy.noise import row_loglik

    if rows.height == 0:
        return np.empty(0)
    codec = release.codec
    x = codec.encode(rows.select(lower(release.schema).names), np.random.default_rng(seed))
    per = []
    for k, flow in enumerate(release.flows):
        gen = torch.Generator().manual_seed(seed + k) if seed is not None else None  # None: a secret one
        per.append(row_loglik(flow, x, generator=gen).astype(np.float64))
    return mixture_loglik(np.stack(per)) + conditional_loglik(codec, rows)


def write_artifacts(
    folder: Path,
    schema: Schema,
    model: Mapping[str, Any],
    states: Sequence[Mapping[str, Any]],
    marginals: dict[str, Any] | None = None,
    head: dict[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """A release's artifact files in `folder`: one ``checkpoint_K.pt`` per flow state and
    ``meta.json`` (the schema, the flow family and shape, the DP marginals and head, `extra`);
    returns the map `load_release` reads. What a registered version stores and what `save` writes."""
    import torch

    artifacts: dict[str, str] = {}
    for i, state in enumerate(states):
        path = Path(folder) / f"checkpoint_{i}.pt"
        torch.save({k: v.detach().cpu() for k, v in state.items()}, path)
        artifacts[f"checkpoint_{i}"] = str(path)
    meta: dict[str, Any] = {
        "schema": schema.model_dump(mode="json"),
        "model": dict(model),
        "checkpoints": list(artifacts),
    }
    if marginals is not None:  # the DP marginals' output (privacy/mechanisms/dp_marginals.py)
        meta["marginals"] = marginals
    if head is not None:  # the DP target head (privacy/mechanisms/dp_head.py), calibrated
        meta["head"] = head
    meta.update(extra or {})
    (Path(folder) / SAVED_META).write_text(json.dumps(meta))
    artifacts["meta"] = str(Path(folder) / SAVED_META)
    return artifacts


def save_release(release: Release, folder: str | Path) -> Path:
    """Write `release` to a new folder (`write_artifacts`, with its version and tags), which
    `load_saved` reads back: the released model alone, no ledger, no registry. ValueError when
    the folder exists and is not empty, or the release does not say what flow it was built as."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"'{folder}' exists and is not an empty folder; save to a new folder (nothing was written).")
    if release.model is None:
        raise ValueError("this model does not name the flow it was built as: save a loaded or fitted model.")
    folder.mkdir(parents=True, exist_ok=True)
    states = [flow.state_dict() for flow in release.flows]
    extra = {"saved": {"version": release.version, "tags": dict(release.tags)}}
    write_artifacts(folder, release.schema, release.model, states, release.marginals, release.head, extra)
    return folder


def is_saved(folder: str | Path) -> bool:
    """Whether `folder` holds a release `save_release` wrote."""
    meta = Path(folder) / SAVED_META
    return meta.is_file() and "saved" in json.loads(meta.read_text())


def load_saved(folder: str | Path) -> Release:
    """The release `save_release` wrote to `folder`."""
    meta = json.loads((Path(folder) / SAVED_META).read_text())
    artifacts = {"meta": str(Path(folder) / SAVED_META)}
    artifacts.update({key: str(Path(folder) / f"{key}.pt") for key in meta["checkpoints"]})
    saved = meta.get("saved") or {}
    return load_release(artifacts, saved.get("version"), saved.get("tags"))


__all__ = [
    "Release",
    "is_saved",
    "load_release",
    "load_saved",
    "save_release",
    "score_rows",
    "write_artifacts",
]
