"""`privflow dpad`: DP anomaly detection by sample-and-aggregate (DP-NF section 5, Algorithm 2):
`fit` trains the curator-only ensemble, `score` answers queries, each charged to the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from privflow.cli._common import (
    FlowOpt,
    ModelFamilyOpt,
    StoreOpt,
    VerboseOpt,
    console,
    flow_choice,
    guarded,
    load_config,
)

dpad_app = typer.Typer(
    no_args_is_help=True,
    help="DP anomaly detection by sample-and-aggregate (DP-NF section 5); every query is charged.",
)


@dpad_app.command("fit")
def dpad_fit(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="Private table (.csv or .parquet).")],
    schema: Annotated[Path, typer.Option("--schema", help="Public schema (YAML); its dataset is charged per query.")],
    partitions: Annotated[int, typer.Option("--partitions", "-k", help="Number of disjoint parts k (one flow each).")],
    epsilon_per_query: Annotated[
        float, typer.Option("--epsilon-per-query", help="Epsilon of each answered query (pure DP).")
    ],
    fpr: Annotated[
        float | None,
        typer.Option("--fpr", help="Each part's threshold: this quantile of its held-out rows (default 0.05)."),
    ] = None,
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="One public log-likelihood threshold for every part instead.")
    ] = None,
    holdout: Annotated[
        float | None,
        typer.Option("--holdout", help="Share of each part's rows held out for its threshold (0.2 with --fpr)."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Run configuration (YAML): model, train.")] = None,
    flow: FlowOpt = None,
    model: ModelFamilyOpt = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Passes over each part.")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Train the DP-AD ensemble (curator-only, charges nothing); register it in the ledger.

    k non-private flows on disjoint parts of the rows (a salted hash per row), each with its own
    threshold; every later query is charged to the schema's dataset (DP-NF section 5, Algorithm 2)."""
    family = flow_choice(ctx, flow, model)
    guarded(
        verbose,
        lambda: _dpad_fit(
            data, schema, partitions, epsilon_per_query, fpr, threshold, holdout, config, family, epochs, store, verbose
        ),
    )


def _dpad_epsilon(value: float) -> None:
    import math

    from privflow.core.errors import ConfigError
    from privflow.privacy.accounting.plan import MAX_EPSILON

    if not (math.isfinite(value) and 0 < value <= MAX_EPSILON):
        raise ConfigError(
            f"--epsilon-per-query must be a positive number of at most {MAX_EPSILON:g}, got {value}. Each answered "
            "query spends it; typical values are 0.1 to 1."
        )


def _dpad_fit(
    data: Path,
    schema_path: Path,
    partitions: int,
    epsilon_per_query: float,
    fpr: float | None,
    threshold: float | None,
    holdout: float | None,
    config_path: Path | None,
    model: str | None,
    epochs: float | None,
    store: Path,
    verbose: bool,
) -> None:
    from privflow.core import env
    from privflow.core.errors import ConfigError

    env.set_verbosity(verbose)
    from privflow.data.schema import Schema
    from privflow.preflight import check_store, check_table
    from privflow.privacy.mechanisms.dp_ad import MAX_PARTITIONS

    _dpad_epsilon(epsilon_per_query)
    if not 2 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"--partitions must be an integer from 2 to {MAX_PARTITIONS}, got {partitions}.")
    if fpr is not None and threshold is not None:
        raise ConfigError("Pass either --fpr (a per-part threshold from held-out rows) or --threshold, not both.")
    overrides = {
        "data": data,
        "schema_path": schema_path,
        "store": store,
        "model": {"name": model},
        "train": {"epochs": epochs},
    }
    cfg = load_config(config_path, overrides, None)  # its model and train sections; marginals do not apply
    sch = Schema.from_yaml(schema_path)
    check_store(store)
    # format and header only: no row is read or counted (a minimum on private rows would be a
    # refusal one row decides; a part with too few rows trains no flow and votes "normal")
    check_table(data, sch, "Data file")
    from privflow.core.config import DPAD_MIN_PART_ROWS

    if threshold is None:  # a per-part threshold from held-out rows, by default
        fpr, holdout = (0.05 if fpr is None else fpr), (0.2 if holdout is None else holdout)
    from privflow.privacy.mechanisms.dp_ad import EnsembleSettings  # no Prefect, no MLflow

    try:  # the settings' own ranges first: the row rule below uses the held-out share
        settings = EnsembleSettings(partitions, epsilon_per_query, fpr, threshold, 0.0 if holdout is None else holdout)
    except ValueError as exc:
        raise ConfigError(f"Bad dpad settings: {exc}.") from None
    share = 1.0 - settings.holdout_fraction
    n = sch.dataset.expected_rows  # public: only the schema's declared row count, never the file's
    if n is not None and n // partitions * share < DPAD_MIN_PART_ROWS:  # every part would vote "normal"
        most = int(n * share // DPAD_MIN_PART_ROWS)
        advice = f"Use at most {most} partitions, or a larger table." if most >= 2 else "Use a larger table."
        raise ConfigError(
            f"With --partitions {partitions} and the schema's expected_rows of {n}, each part of about "
            f"{n // partitions} rows gets about {n // partitions * share:.0f} training rows, fewer than the "
            f"{DPAD_MIN_PART_ROWS} a part needs to train a flow: no part could vote, yet every query would be "
            f"charged. {advice}"
        )
    env.configure(store, verbose=verbose)
    from privflow.tasks.dpad import fit_ensemble

    env.quiet_imported(verbose)
    say = Console().print
    ens = fit_ensemble(
        data,
        sch,
        cfg,
        settings,
        store,
        on_part=None if verbose else (lambda i, k: console.print(f"  part {i}/{k} trained", highlight=False)),
    )
    say(
        f"DP-AD ensemble {ens.ensemble_id}: {settings.partitions} non-private flows on disjoint parts of dataset "
        f"'{ens.dataset}', kept curator-only in {ens.folder} (never in MLflow or the registry). Nothing was released "
        f"and nothing was charged; the ensemble is registered in the ledger, and every answered query will cost "
        f"epsilon={settings.epsilon_per_query:g} of the dataset's budget. Score with: privflow dpad score "
        f"--ensemble {ens.ensemble_id} --data NEW.csv -o scored.csv --store {store}. Each part's rows and "
        f"whether it trained (a part with too few rows votes normal) are curator-only, in "
        f"{ens.folder / 'ensemble.json'}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


@dpad_app.command("score")
def dpad_score(
    ensemble: Annotated[str, typer.Option("--ensemble", help="Ensemble id printed by `privflow dpad fit`.")],
    data: Annotated[Path, typer.Option("--data", help="Rows to query (.csv or .parquet) with the schema's columns.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet): rows + anomaly.")],
    svt: Annotated[
        bool, typer.Option("--svt", help="Sparse vector technique: only flagged rows pay; halts after --max-flags.")
    ] = False,
    max_flags: Annotated[
        int | None, typer.Option("--max-flags", help="SVT cutoff c: at most c flags (and c x epsilon) per call.")
    ] = None,
    svt_threshold: Annotated[
        float | None, typer.Option("--svt-threshold", help="SVT threshold in anomalous votes (default k/2).")
    ] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """A DP anomalous/normal answer per row, charged per row (per flag with --svt).

    The ensemble's votes go through Report-Noisy-Max (or the sparse vector technique); the call is
    reserved in the ledger before any vote is counted and refused when the budget cannot hold it."""
    guarded(verbose, lambda: _dpad_score(ensemble, data, out, svt, max_flags, svt_threshold, store, verbose))


def _dpad_score(
    ensemble: str,
    data: Path,
    out: Path,
    svt: bool,
    max_flags: int | None,
    svt_threshold: float | None,
    store: Path,
    verbose: bool,
) -> None:
    from privflow.core import env
    from privflow.core.errors import ConfigError

    env.set_verbosity(verbose)
    from privflow.preflight import check_output

    check_output(out)
    if not svt and (max_flags is not None or svt_threshold is not None):
        raise ConfigError("--max-flags and --svt-threshold belong to the sparse vector option: add --svt.")
    if svt and max_flags is None:
        raise ConfigError(
            "--svt needs --max-flags C: the call halts after C flagged rows, and the ledger reserves C x epsilon "
            "before it starts (only the flags that happen are charged)."
        )
    if max_flags is not None and max_flags < 1:
        raise ConfigError(f"--max-flags must be at least 1, got {max_flags}.")
    env.configure(store, verbose=verbose)
    from privflow.preflight import check_table
    from privflow.tasks.dpad import load_ensemble, score_queries

    env.quiet_imported(verbose)
    ens = load_ensemble(store, ensemble)
    check_table(data, ens.schema, "Data file")  # header against the ensemble's public schema
    mechanism = None
    if svt:
        try:
            mechanism = ens.sparse_vector(int(max_flags), svt_threshold)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"Bad --max-flags/--svt-threshold: {exc}.") from None
    result = score_queries(ens, data, store, mechanism)
    from privflow.data.io import write_table

    write_table(result.table, out)
    unanswered = result.queries - result.answered
    Console().print(
        f"DP-AD ensemble {ens.ensemble_id}: {result.answered} of {result.queries} rows answered by {result.mechanism}"
        f", {result.flagged} flagged as anomalous"
        + (f", {unanswered} not answered (the SVT cutoff was reached; 'anomaly' is empty)" if unanswered else "")
        + f"; epsilon spent {result.epsilon:.4g} (PLD, this call) on dataset '{result.dataset}' (ledger run "
        f"{result.ledger_run_id}; dataset total now {result.dataset_epsilon:.4g}); wrote {out}. The answers are "
        "differentially private; the flags may be published.",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
