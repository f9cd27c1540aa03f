"""`privflow schema`: help with a table's public schema. `draft` writes one from a table: without
--epsilon, types from the header (Parquet dtypes) or suggested from the values for the curator's
review and placeholders for bounds and categories; with --epsilon every field by DP or public
metadata, charged to the dataset in the ledger like any run (privflow/tasks/draft.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from privflow.cli._common import StoreOpt, VerboseOpt, console, guarded

schema_app = typer.Typer(
    no_args_is_help=True,
    help="Draft a table's public schema from the table (`privflow check` checks a table against a schema).",
)


@schema_app.command("draft")
def draft(
    data: Annotated[Path, typer.Option("--data", help="Table to draft the schema of (.csv or .parquet, gzip or not).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Schema file to write (.yaml).")] = Path("schema.yaml"),
    epsilon: Annotated[
        float | None,
        typer.Option(
            "--epsilon",
            help="Fill bounds, categories, atoms, nullable and expected_rows by DP, spending this epsilon of the "
            "dataset's budget (without it they are placeholders the data owner fills).",
        ),
    ] = None,
    delta: Annotated[
        float | None,
        typer.Option(
            "--delta",
            help="The DP draft's delta (default 2% of the dataset budget's delta: the ledger keeps a quarter of "
            "that delta for all drafts together, so about twelve drafts fit).",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="dataset.name, the ledger's key (default: from the file's name).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="The label column: written as `target:`, drafted categorical (or boolean) with every class above "
            "0.2% of the rows (DP) kept.",
        ),
    ] = None,
    positive: Annotated[
        str | None,
        typer.Option("--positive", help="The target's positive class (binary utility metrics): `target_positive:`."),
    ] = None,
    budget_epsilon: Annotated[
        float | None, typer.Option("--budget-epsilon", help="The dataset's total epsilon (default the schema's, 10).")
    ] = None,
    budget_delta: Annotated[
        float | None, typer.Option("--budget-delta", help="The dataset's total delta (default the schema's, 1e-5).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the output file if it exists.")] = False,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Draft a schema from a table. Everything a mistake can fail (the path, the header, the output,
    epsilon, the dataset's budget left) is refused before a row is read and nothing is charged."""
    guarded(
        verbose,
        lambda: _draft(
            data, out, epsilon, delta, name, budget_epsilon, budget_delta, force, store, verbose, target, positive
        ),
        spends=epsilon is not None,
    )


def _draft(
    data: Path,
    out: Path,
    epsilon: float | None,
    delta: float | None,
    name: str | None,
    budget_epsilon: float | None,
    budget_delta: float | None,
    force: bool,
    store: Path,
    verbose: bool,
    target: str | None = None,
    positive: str | None = None,
) -> None:
    from privflow.core import env
    from privflow.preflight import check_store
    from privflow.tasks.draft import plan_draft, write_draft

    env.set_verbosity(verbose)
    if epsilon is not None:
        check_store(store)
    plan = plan_draft(
        data, out, name, epsilon, delta, budget_epsilon, budget_delta, store, force, target=target, positive=positive
    )
    result = write_draft(plan, store)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    if result.run_id is None:
        typer.echo(
            f"Wrote {result.out}: a draft with placeholders for bounds and categories ('<FILL>'); fill them with "
            "public values and review the suggested types before using it. Nothing was charged."
        )
    else:
        typer.echo(
            f"Wrote {result.out}: types, formats, bounds, categories, atoms, nullable and expected_rows by DP, "
            f"charged to dataset '{result.name}' (ledger run {result.run_id}, epsilon {result.epsilon:.4g} at the "
            "dataset's delta). Review it before using it; `privflow ledger show` lists the charge."
        )


__all__ = ["schema_app"]
