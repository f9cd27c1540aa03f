"""`privflow audit`: an empirical lower bound on epsilon from one canary training run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from privflow.cli._common import EXIT_AUDIT, Mutation, StoreOpt, VerboseOpt, choice_value, guarded, load_config


def audit(
    data: Annotated[Path, typer.Option("--data", help="Input table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML).")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="Total epsilon of the audited configuration.")],
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML).")] = None,
    canaries: Annotated[
        int,
        typer.Option(
            "--canaries", help="Number of gradient canaries m (at least 100: fewer certify no epsilon).", min=100
        ),
    ] = 1000,
    mutate: Annotated[
        Mutation,
        typer.Option(
            "--mutate",
            help="A check of the check: none (the configuration as shipped), or DP-SGD deliberately broken, its "
            "noise divided by 10 or its clipping off, which the audit must catch.",
            case_sensitive=False,
        ),
    ] = Mutation.none,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Empirical lower bound on epsilon from one canary training run, beside the claimed one.

    One-run auditing (Steinke, Nasr & Jagielski 2023). No ledger spend, nothing in MLflow;
    the report goes to <store>/audits/<id>.json.
    """
    mutation = choice_value(mutate) or "none"
    guarded(verbose, lambda: _audit(data, schema, epsilon, config, canaries, mutation, store, verbose))


def _audit(
    data: Path,
    schema: Path,
    epsilon: float,
    config: Path | None,
    canaries: int,
    mutate: str,
    store: Path,
    verbose: bool,
) -> None:
    from privflow.core import env
    from privflow.core.errors import ConfigError

    env.set_verbosity(verbose)
    if mutate not in ("none", "noise/10", "no-clip"):
        raise ConfigError(f"--mutate must be none, noise/10 or no-clip, not '{mutate}'.")
    overrides = {"data": data, "schema_path": schema, "store": store, "privacy": {"epsilon": epsilon}}
    cfg = load_config(config, overrides, None)
    from privflow.preflight import preflight_audit

    preflight_audit(cfg, canaries)  # before Prefect or MLflow are imported
    env.configure(cfg.store, verbose=verbose)
    from privflow.flows.audit import audit_pipeline

    env.quiet_imported(verbose)
    r = audit_pipeline(cfg, canaries=canaries, mutation=mutate)
    verdict = "PASS (lower bound <= claimed)" if r.passed else "FAIL (lower bound > claimed epsilon)"
    # the verdict a healthy configuration gives: PASS for the shipped one, FAIL for a mutant
    expected = r.passed == (mutate == "none")
    Console().print(
        f"audit {r.audit_id} ({r.mutation}): {r.canaries} canaries ({r.included} included), {r.correct}/{r.guesses} "
        f"guesses correct -> epsilon >= {r.epsilon_lower_bound:.3f} at {r.confidence:.0%} confidence (delta "
        f"{r.delta:g}); claimed DP-SGD epsilon {r.claimed_epsilon:.3f} (run total {r.run_epsilon:g}). {verdict}. "
        f"Report: {r.report_path}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    if not expected:  # a scheduled or CI audit must see this in the exit status
        raise typer.Exit(EXIT_AUDIT)
