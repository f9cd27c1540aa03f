"""`privflow score`: rows scored by log-likelihood under a registered model, anomalies flagged
below a public or a DP threshold."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from privflow.cli._common import StoreOpt, VerboseOpt, _guarded


def score(
    model: Annotated[str, typer.Option("--model", help="NAME@ALIAS or NAME/VERSION of a registered model.")],
    data: Annotated[Path, typer.Option("--data", help="Table to score (.csv or .parquet) with the model's columns.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet): rows + loglik, anomaly.")],
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="Public log-likelihood threshold: loglik below it is flagged.")
    ] = None,
    fpr: Annotated[
        float | None,
        typer.Option("--fpr", help="Target false-positive rate q: the threshold is a DP q-quantile of --reference."),
    ] = None,
    reference: Annotated[
        Path | None, typer.Option("--reference", help="Reference table for --fpr (charged to the schema's dataset).")
    ] = None,
    epsilon: Annotated[
        float | None,
        typer.Option(
            "--epsilon", help="Epsilon of the DP quantile, spent from the ledger (no default: required with --fpr)."
        ),
    ] = None,
    score_low: Annotated[
        float | None, typer.Option("--score-low", help="Lower end of the public threshold grid (nats; default -20).")
    ] = None,
    score_high: Annotated[
        float | None, typer.Option("--score-high", help="Upper end of the public threshold grid (nats; default 10).")
    ] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Score a table's rows by log-likelihood under a registered model and flag anomalies.

    Scoring is post-processing of the released model (free); a DP threshold from --fpr spends
    --epsilon of the reference dataset's budget."""
    _guarded(
        verbose,
        lambda: _score(model, data, out, threshold, fpr, reference, epsilon, score_low, score_high, store, verbose),
    )


def _score(
    model: str,
    data: Path,
    out: Path,
    threshold: float | None,
    fpr: float | None,
    reference: Path | None,
    epsilon: float | None,
    score_low: float | None,
    score_high: float | None,
    store: Path,
    verbose: bool,
) -> None:
    import math

    from privflow.core.config import SelectConfig
    from privflow.core.errors import ConfigError
    from privflow.preflight import check_output, check_registry

    check_output(out)
    if Path(out).resolve() == Path(data).resolve():
        raise ConfigError(f"-o '{out}' is the --data table itself; write the scores to another file.")
    check_registry(store, f"--model {model}", "Train and register one first (`privflow run`) with the same --store.")
    dp_args = {"--fpr": fpr, "--reference": reference, "--epsilon": epsilon}
    if threshold is not None:
        given = [k for k, v in dp_args.items() if v is not None]
        if given:
            raise ConfigError(f"Pass either --threshold or --fpr/--reference/--epsilon, not both (got {given}).")
        if not math.isfinite(threshold):
            raise ConfigError(f"--threshold must be a finite number, got {threshold}.")
        mechanism = None
    else:
        missing = [k for k, v in dp_args.items() if v is None]
        if missing:
            raise ConfigError(
                "score needs a threshold: a public number (--threshold T), or a DP quantile of a reference "
                f"table (--fpr q --reference REF.csv --epsilon E); missing {missing}."
            )
        from privflow.privacy.accounting.plan import MAX_EPSILON
        from privflow.privacy.mechanisms.dp_quantile import DPQuantile

        if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):  # type: ignore[arg-type]
            raise ConfigError(f"--epsilon must be a positive number of at most {MAX_EPSILON:g}, got {epsilon}.")

        defaults = SelectConfig()
        try:
            mechanism = DPQuantile(
                float(fpr),  # type: ignore[arg-type]
                float(epsilon),  # type: ignore[arg-type]
                defaults.score_low if score_low is None else score_low,
                defaults.score_high if score_high is None else score_high,
            )
        except ValueError as exc:
            raise ConfigError(f"Bad --fpr/--epsilon/--score-low/--score-high: {exc}.") from None
    from privflow.core import env
    from privflow.core.startup import imports_without_gc

    env.configure(store, verbose=verbose)
    with imports_without_gc():  # MLflow's import and the model's load (privflow/core/startup.py)
        import mlflow  # noqa: F401 - imported here so its event messages can be switched off

        from privflow.preflight import check_table
        from privflow.tasks.score import dp_threshold, flag, load_model, scored_rows

        env.quiet_imported(verbose)
        name, loaded = load_model(model, store)
    check_table(data, loaded.schema, "Data file")  # header against the model's public schema
    if reference is not None:
        check_table(reference, loaded.schema, "Reference file")  # header only, before the ledger reserves
    raw, loglik = scored_rows(loaded, data)  # the table read and checked before any budget is spent
    say = Console().print
    spent, charged = 0.0, "A public threshold spends no privacy, and scoring is post-processing of the model (free)"
    if mechanism is not None:
        released = dp_threshold(loaded, reference, mechanism, store)  # type: ignore[arg-type]
        threshold, spent = released.threshold, released.epsilon
        say(
            f"DP threshold: {threshold:.4g} nats (the {mechanism.q:g}-quantile of the reference log-likelihoods, "
            f"grid step {mechanism.step:.3g} over [{mechanism.low:g}, {mechanism.high:g}]); epsilon spent "
            f"{spent:g} on dataset '{released.dataset}' (ledger run {released.ledger_run_id})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        charged = (
            f"The DP threshold charged epsilon {spent:g} to dataset '{released.dataset}'; the scoring itself is "
            "post-processing of the model and the threshold (no further spend)"
        )
    else:
        say(f"public threshold: {threshold:g} nats; epsilon spent 0", highlight=False, soft_wrap=True)
    from privflow.data.io import write_table

    table = flag(raw, loglik, float(threshold))  # type: ignore[arg-type]
    replaced = " (replacing the file that was there)" if out.exists() else ""
    write_table(table, out)
    flagged = int(table["anomaly"].sum())
    say(
        f"scored {table.height} rows of {data} under {name} v{loaded.version}: {flagged} flagged as anomalies "
        f"(loglik < {threshold:.4g}); wrote {out}{replaced}. {charged}; these counts are of the "
        "rows you brought (for the operator only if they are private).",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
