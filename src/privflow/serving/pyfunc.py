"""The released generator as an MLflow pyfunc: ``FlowSampler``, MLflow's side of a release.

Kept apart from `privflow.serving.sampler` (the sampling itself), so that `privflow generate`
and the Python API sample without importing MLflow or pandas: this module is imported only
when MLflow loads a registered model (`sampler_model.py`, "models from code"), or by name
through ``privflow.serving.sampler.FlowSampler`` (resolved lazily there).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from mlflow.pyfunc import PythonModel

from privflow.serving.sampler import load_release, sample_rows


class FlowSampler(PythonModel):
    """predict(DataFrame with column `n` and optional `seed`) -> synthetic rows (pandas).

    With several selected checkpoints (top-k Report-Noisy-Max, DP-GAN note section 4) the
    table is the union of equal shares sampled from each.
    """

    def load_context(self, context: Any) -> None:
        release = load_release(context.artifacts)
        self.schema, self.codec, self.flows = release.schema, release.codec, release.flows

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        n = int(model_input["n"].iloc[0])
        seed = int(model_input["seed"].iloc[0]) if "seed" in model_input.columns else None
        from privflow.data.codec import to_pandas
        from privflow.data.surface import to_surface

        rows = to_surface(sample_rows(self.flows, self.codec, n, seed), self.schema)  # as the input is written
        return to_pandas(rows, self.schema)  # integers stay integers


__all__ = ["FlowSampler"]
