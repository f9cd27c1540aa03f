"""The curator-only diagnostics store: a folder per run that is never part of a release.

What the data owner needs to look after the data, computed on private rows without a
mechanism (exact validation counts, the quarantine file, training losses, evaluation
metrics, the HTML report and figures of real marginals), lives here and only here
(docs/architecture.md, privacy rule 5; docs/privacy.md, "Trust boundary"). It sits under the store as
``curator/<run id>/``, created with owner-only permissions, and nothing in it is logged
to the MLflow run behind a registered model or printed in the publishable ledger summary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LABEL = (
    "CURATOR ONLY: computed on the private rows without a privacy mechanism; not differentially "
    "private; never released with the model, the synthetic data or the ledger summary."
)


def curator_dir(store: Path, run_id: str) -> Path:
    """The run's curator-only folder (owner-only permissions), created if needed."""
    root = store / "curator"
    path = root / run_id
    path.mkdir(parents=True, exist_ok=True)
    for p in (root, path):
        os.chmod(p, 0o700)
    return path


def write_json(folder: Path, name: str, payload: dict[str, Any]) -> Path:
    """Write `payload` with the curator-only label as `folder/name`."""
    path = folder / name
    path.write_text(json.dumps({"label": LABEL, **payload}, indent=2, default=str))
    return path


__all__ = ["LABEL", "curator_dir", "write_json"]
