"""Evaluation diagnostics for the data owner (NOT differentially private: curator-only, never released).

A plain library (no Prefect, no MLflow): fidelity (marginal TV, Kendall's tau and Cramer's V
matrices), utility (DP-HFlow's nine-classifier train-on-synthetic / test-on-real protocol),
privacy-risk checks (distance to closest record, likelihood membership inference), figures,
and `evaluate`, which runs what the EvaluateConfig switches on and writes one HTML report.
"""

from privflow.tasks.evaluation.html import BANNER
from privflow.tasks.evaluation.report import EvaluationResult, evaluate

__all__ = ["BANNER", "EvaluationResult", "evaluate"]
