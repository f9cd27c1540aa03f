"""`privflow score`: rows scored by log-likelihood under a registered model, anomalies flagged
below a public or a DP threshold.

Order (privacy rules 7 and 8): the arguments and the files' public structure (format, header
against the model's schema) are checked first, so a user's mistake exits 2 with nothing
reserved; then a DP threshold is reserved, released on the reference's passing rows and
settled; then the table is scored with the total reader. No row decides whether anything is
charged, the exit status or what is printed: a failing row is kept with an empty score, and
the exact counts go to the run's curator-only folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from privflow.cli._common import StoreOpt, VerboseOpt, guarded

SCORING_REPORT = "scoring.json"  # in the run's curator-only folder: the exact counts, for the operator only


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
    --epsilon of the reference dataset's budget. A row that fails the schema's checks is kept
    with an empty score; the exact counts go to the curator-only folder."""
    guarded(
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
    import uuid

    from privflow.core.config import SelectConfig
    from privflow.core.curator import curator_dir, write_json
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

        assert fpr is not None and epsilon is not None  # none of dp_args is missing
        if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):
            raise ConfigError(f"--epsilon must be a positive number of at most {MAX_EPSILON:g}, got {epsilon}.")

        defaults = SelectConfig()
        try:
            mechanism = DPQuantile(
                float(fpr),
                float(epsilon),
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
        from privflow.tasks.score import SCORED_QUARANTINE, dp_threshold, load_model, score_table

        env.quiet_imported(verbose)
        name, loaded = load_model(model, store)
    # public structure only (format, header against the model's schema), before the ledger reserves
    check_table(data, loaded.schema, "Data file")
    if reference is not None:
        check_table(reference, loaded.schema, "Reference file")
    say = Console().print
    spent, charged = 0.0, "A public threshold spends no privacy, and scoring is post-processing of the model (free)"
    if mechanism is not None:
        released = dp_threshold(loaded, reference, mechanism, store)  # type: ignore[arg-type]
        threshold, spent = released.threshold, released.epsilon
        folder = released.curator or curator_dir(store.resolve(), released.ledger_run_id)
        say(
            f"DP threshold: {threshold:.4g} nats (the {mechanism.q:g}-quantile of the reference log-likelihoods, "
            f"grid step {mechanism.step:.3g} over [{mechanism.low:g}, {mechanism.high:g}]); epsilon spent "
            f"{spent:g} on dataset '{released.dataset}' (ledger run {released.ledger_run_id}). Reference rows "
            "that fail the schema's checks are left out of the quantile (a per-row filter: its sensitivity holds)",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        charged = (
            f"The DP threshold charged epsilon {spent:g} to dataset '{released.dataset}'; the scoring itself is "
            "post-processing of the model and the threshold (no further spend)"
        )
    else:
        folder = curator_dir(store.resolve(), f"score-{uuid.uuid4()}")
        say(f"public threshold: {threshold:g} nats; epsilon spent 0", highlight=False, soft_wrap=True)
    from privflow.data.io import write_table

    # read after the DP release, with the total reader: a row that fails gets an empty score, never a refusal
    scored = score_table(loaded, data, float(threshold), folder / SCORED_QUARANTINE)  # type: ignore[arg-type]
    replaced = " (replacing the file that was there)" if out.exists() else ""
    write_table(scored.table, out)
    write_json(
        folder,
        SCORING_REPORT,
        {
            "data_path": str(data),
            "output_path": str(out),
            "model": name,
            "model_version": str(loaded.version),
            "threshold": threshold,
            "rows_scored": scored.table.height - scored.unscored,
            "rows_unscored": scored.unscored,
            "rows_flagged": scored.flagged,
            "validation": scored.report.to_dict(),
        },
    )
    say(
        f"scored {data} under {name} v{loaded.version} (anomaly: loglik < {threshold:.4g}); wrote {out}{replaced}. "
        "Every row is kept in its place; a row that fails the schema's checks has an empty loglik and anomaly. "
        f"{charged}. How many rows were scored, flagged and left unscored (exact counts, not differentially "
        f"private) is in the curator-only {folder / SCORING_REPORT}.",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
