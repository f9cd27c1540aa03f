"""The released generator as an MLflow pyfunc: ``FlowSampler``, MLflow's side of a release.

Kept apart from `privflow.serving.sampler` (the sampling itself), so that `privflow generate`
and the Python API sample without importing MLflow or pandas: this module is imported only
when MLflow loads a registered model (`sampler_model.py`, "models from code"), or by name
through ``privflow.serving.sampler.FlowSampler`` (the address older versions' code files use).
It imports the sampler and the release's loader (`privflow.serving.release`); neither imports it.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from mlflow.pyfunc import PythonModel

from privflow.serving.release import Release, load_release
from privflow.serving.sampler import sample_rows


class FlowSampler(PythonModel):
    """predict(data, params={"n": N, "seed": S}) -> N synthetic rows (pandas); `seed` optional.

    MLflow's way to pass settings is `params` (the signature declares them, so `mlflow models
    serve` takes them too); `data` is then any DataFrame, empty included. A `data` holding
    columns `n` and `seed` (the form models registered before `params` were declared take) is
    read where `params` leave them unset.

    With several selected checkpoints (top-k Report-Noisy-Max, DP-GAN note section 4) the
    table is the union of equal shares sampled from each.
    """

    release: Release

    def load_context(self, context: Any) -> None:
        self.release = load_release(context.artifacts)

    @property
    def schema(self) -> Any:
        """The release's public schema (as written)."""
        return self.release.schema

    @property
    def codec(self) -> Any:
        """The release's codec."""
        return self.release.codec

    @property
    def flows(self) -> list[Any]:
        """The release's flows (eval mode, CPU)."""
        return self.release.flows

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        n, seed = _setting("n", model_input, params), _setting("seed", model_input, params)
        if n is None:
            raise ValueError("predict needs the number of rows: predict(pd.DataFrame(), params={'n': 1000}).")
        from privflow.data.codec import to_pandas
        from privflow.data.lowering import to_surface

        release = self.release
        rows = to_surface(sample_rows(release.flows, release.codec, n, seed), release.schema)  # as the input is written
        return to_pandas(rows, release.schema)  # integers stay integers


def _setting(name: str, model_input: pd.DataFrame | None, params: dict[str, Any] | None) -> int | None:
    """`params[name]`, else the first value of the input's column `name`, else None."""
    value = (params or {}).get(name)
    if value is None and model_input is not None and name in model_input.columns and len(model_input):
        first = model_input[name].iloc[0]
        value = None if pd.isna(first) else first
    return None if value is None else int(value)


__all__ = ["FlowSampler"]
