"""Recompute a released run's epsilon with dp_accounting alone, from the events it recorded.

    python -m benchmarks.recompute_epsilon --store .privflow [--run MLFLOW_RUN_ID]

Reads `privacy/events.json` from the MLflow run (the latest run of the store when --run is
omitted), rebuilds each event as dp_accounting's own privacy-loss distribution (no privflow accountant
code), composes them at the run's delta, and prints it beside
the epsilon the run reported. A check a data protection officer can run.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld


def to_pld(d: dict):  # noqa: ANN201 - dp_accounting's PrivacyLossDistribution
    """One recorded event as dp_accounting's own privacy-loss distribution (default grid)."""
    if d["kind"] == "gaussian":
        return pld.from_gaussian_mechanism(d["noise_multiplier"])
    if d["kind"] == "laplace":
        return pld.from_laplace_mechanism(d["noise_multiplier"])
    if d["kind"] == "poisson_gaussian":
        return pld.from_gaussian_mechanism(d["noise_multiplier"], sampling_prob=d["sample_rate"]).self_compose(
            d["steps"]
        )
    if d["kind"] == "pure_dp":  # the worst-case PLD of an epsilon-DP mechanism
        return pld.from_privacy_parameters(common.DifferentialPrivacyParameters(d["epsilon"], 0.0))
    if d["kind"] == "repeated":
        return to_pld(d["event"]).self_compose(d["count"])
    raise ValueError(f"unknown event kind {d['kind']!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default=".privflow")
    p.add_argument("--run", default=None, help="MLflow run id (default: the store's latest run)")
    args = p.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    from mlflow import MlflowClient

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(args.store).resolve() / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    run_id = args.run
    if run_id is None:
        runs = mlflow.search_runs(search_all_experiments=True, order_by=["start_time DESC"], max_results=1)
        run_id = str(runs.iloc[0]["run_id"])
    run = client.get_run(run_id)
    events = json.loads(Path(client.download_artifacts(run_id, "privacy/events.json")).read_text())
    delta = float(run.data.metrics["delta"])
    total = to_pld(events[0])
    for e in events[1:]:
        total = total.compose(to_pld(e))
    epsilon = total.get_epsilon_for_delta(delta)
    print(f"run {run_id}: {len(events)} events {[e['kind'] for e in events]}")
    print(f"dp_accounting PLD epsilon at delta={delta:g}: {epsilon:.6f}")
    print(f"reported epsilon:                      {run.data.metrics['epsilon']:.6f}")


if __name__ == "__main__":
    main()
