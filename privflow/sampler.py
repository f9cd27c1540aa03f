"""The released generator as an MLflow pyfunc: sample synthetic rows by model alias.

Everything it holds went through a mechanism: the flow weights of the checkpoint(s) that
Report-Noisy-Max chose, and the public schema. Loading it needs no training data and no
Prefect; MLflow bundles `models/` and `privflow/` with it (code_paths).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd


class FlowSampler(mlflow.pyfunc.PythonModel):
    """predict(DataFrame with column `n` and optional `seed`) -> synthetic rows (pandas).

    With several selected checkpoints (top-k Report-Noisy-Max, DP-GAN note section 4) the
    table is the union of equal shares sampled from each.
    """

    def load_context(self, context: Any) -> None:
        import torch

        from privflow.models import build_flow
        from privflow.codec import Codec
        from privflow.schema import Schema

        meta = json.loads(Path(context.artifacts["meta"]).read_text())
        self.schema = Schema.model_validate(meta["schema"])
        self.codec = Codec.from_schema(self.schema)
        self.flows = []
        for key in meta["checkpoints"]:
            flow = build_flow(meta["model"]["name"], self.codec.cardinalities, **meta["model"]["config"])
            flow.load_state_dict(torch.load(context.artifacts[key], map_location="cpu", weights_only=True))
            flow.eval()
            self.flows.append(flow)

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        n = int(model_input["n"].iloc[0])
        seed = int(model_input["seed"].iloc[0]) if "seed" in model_input.columns else None
        from privflow.codec import to_pandas

        return to_pandas(sample_rows(self.flows, self.codec, n, seed), self.schema)  # integers stay integers


def sampling_generator(seed: int | None) -> Any:
    """The one generator a synthetic table is drawn from (ARCHITECTURE.md, privacy rule 6).

    Explicit, never torch's global RNG: after private rows are read, the global state has
    been advanced by data-sized draws, and a table drawn from it would let anyone who can
    replay the public seed test guesses of the private row count. `seed` is a public
    sampling seed for reproducible post-processing; without one, the seed comes from the
    OS CSPRNG and is not recorded.
    """
    import secrets

    import torch

    return torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))


def sample_rows(flows: list[Any], codec: Any, n: int, seed: int | None = None, batch: int = 8192) -> Any:
    """Decode `n` rows drawn in equal shares from `flows`, in batches (bounded memory).

    The draw depends only on the released flows, the public schema and `seed`.
    """
    import numpy as np
    import polars as pl
    import torch

    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    generator = sampling_generator(seed)
    shares = [n // len(flows) + (1 if i < n % len(flows) else 0) for i in range(len(flows))]
    parts = []
    with torch.no_grad():
        for flow, share in zip(flows, shares, strict=True):
            for start in range(0, share, batch):
                parts.append(flow.sample(min(batch, share - start), generator).cpu().numpy())
    return codec.decode(np.concatenate(parts, axis=0)) if parts else pl.DataFrame()
