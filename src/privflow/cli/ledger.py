"""`privflow ledger`: the per-dataset privacy ledger: the publishable summary, the curator-only
notes, a data owner's change of budget, a dataset's rename and the curator's link of two datasets."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from privflow.cli._common import StoreOpt, VerboseOpt, guarded

ledger_app = typer.Typer(no_args_is_help=True, help="Inspect the per-dataset privacy ledger.")


def _plain(text: str) -> None:
    """Print text as it is (no markup, no highlighting), wrapped by the terminal."""
    Console().print(text, highlight=False, soft_wrap=True, markup=False)


@ledger_app.command("show")
def ledger_show(
    dataset: Annotated[str | None, typer.Argument(help="Dataset name; all datasets when omitted.")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Charged runs (settled, abandoned, open reservations), their privacy events and the
    cumulative (epsilon, delta) by PLD and by the bound valid for adaptively chosen runs, per
    dataset: the publishable summary (no data fingerprints, no time finer than the day)."""
    guarded(verbose, lambda: _ledger_show(dataset, store, verbose), spends=False)


def _ledger_at(store: Path, dataset: str | None = None) -> Any:
    """The store's existing ledger (holding `dataset`, when one is named), or a StoreError
    naming what is there instead."""
    from privflow.core.errors import StoreError
    from privflow.privacy.ledger import Ledger

    path = store / "ledger.db"
    if store.exists() and not store.is_dir():
        raise StoreError(f"--store '{store}' is a file, not a folder; pass the store folder privflow runs used.")
    if path.is_dir():
        raise StoreError(f"'{path}' is a folder, not a privacy ledger; this store's ledger is missing or was moved.")
    if not path.is_file():
        raise StoreError(f"No ledger at '{path}': no run has used this store yet (pass --store to pick another).")
    ledger = Ledger(path)
    names = [d.name for d in ledger.datasets()]
    if dataset is not None and dataset not in names:  # a script asking for one dataset gets an error, not a blank
        held = f"it holds {', '.join(repr(n) for n in names)}" if names else "it holds no dataset yet"
        raise StoreError(f"Dataset '{dataset}' is not in the privacy ledger at '{path}': {held}.")
    return ledger


def _ledger_show(dataset: str | None, store: Path, verbose: bool = False) -> None:
    from privflow.core import env

    env.set_verbosity(verbose)
    ledger = _ledger_at(store, dataset)
    _plain(ledger.describe(dataset))


@ledger_app.command("curator-notes")
def ledger_curator_notes(
    dataset: Annotated[str | None, typer.Argument(help="Dataset name; all datasets when omitted.")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """CURATOR ONLY: what the ledger keeps that depends on the private files (counts and dates,
    never a digest): per dataset, the charged runs whose rows' keyed digests it holds and the rows
    recorded for each, the generated tables recorded per model/version, the public declarations,
    and the notes that depend on the files' bytes (a content fingerprint changed or came back, a
    curator's link of two datasets). Not part of the publishable summary; do not publish."""
    guarded(verbose, lambda: _ledger_curator_notes(dataset, store, verbose), spends=False)


def _ledger_curator_notes(dataset: str | None, store: Path, verbose: bool = False) -> None:
    from privflow.core import env
    from privflow.core.curator import LABEL

    env.set_verbosity(verbose)
    ledger = _ledger_at(store, dataset)
    notes = ledger.curator_notes(dataset)
    lines = [LABEL]
    held = False
    for entry in ledger.curator_summary(dataset):
        charged, generated, public = entry["charged"], entry["generated"], entry["public"]
        if not (charged or generated or public):
            continue
        held = True
        lines.append(f"dataset {entry['dataset']} (curator-only):")
        if charged:
            lines.append(f"  charged runs with keyed row digests: {len(charged)}")
            lines.extend(f"    {run} {day}: {rows} rows" for run, rows, day in charged)
        for spec, (tables, rows, day) in sorted(generated.items()):
            lines.append(f"  generated tables of {spec}: {tables} ({rows} rows in all; last {day})")
        for spec, day in public:
            lines.append(f"  declared public: {spec} {day}")
    if notes:
        lines.append("notes (curator-only):")
        lines.extend(f"  {name} {at[:10]}: {message}" for name, at, message in notes)
    if not notes and not held:
        lines.append("no curator-only notes" + (f" for dataset '{dataset}'" if dataset else ""))
    _plain("\n".join(lines))


@ledger_app.command("link")
def ledger_link(
    dataset: Annotated[str, typer.Argument(help="The dataset refused for another dataset's rows.")],
    other: Annotated[str, typer.Argument(help="The dataset those rows were charged to.")],
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """CURATOR ONLY: record the data owner's decision that DATASET may be spent on rows OTHER was
    charged for (a curator-only note on both). Their budgets stay separate: a person in both is
    protected by the two budgets' sum. Prefer one dataset name per table (or `ledger rename`)."""
    guarded(verbose, lambda: _ledger_link(dataset, other, store, verbose), spends=False)


def _ledger_link(dataset: str, other: str, store: Path, verbose: bool) -> None:
    from privflow.core import env
    from privflow.core.errors import ConfigError

    env.set_verbosity(verbose)
    if dataset == other:
        raise ConfigError("`privflow ledger link` takes two different dataset names.")
    ledger = _ledger_at(store, other)  # `dataset` may not be in the ledger yet (its run was refused)
    ledger.link(dataset, other)
    _plain(
        f"Linked datasets '{dataset}' and '{other}' (curator-only note): the data-identity check no longer refuses "
        "either for the other's rows; their budgets stay separate."
    )


@ledger_app.command("rename")
def ledger_rename(
    old: Annotated[str, typer.Argument(help="The dataset's name in the ledger now.")],
    new: Annotated[str, typer.Argument(help="Its new name (the schema's dataset.name from now on).")],
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Rename a dataset in the ledger (its runs, budget, row digests, versions and notes move with
    it, in one transaction), recorded as a publishable note; then change the schema's dataset.name
    to NEW: its draft_run still resolves. Refused when NEW is already in the ledger."""
    guarded(verbose, lambda: _ledger_rename(old, new, store, verbose))


def _ledger_rename(old: str, new: str, store: Path, verbose: bool) -> None:
    from pydantic import ValidationError

    from privflow.core import env
    from privflow.core.errors import ConfigError
    from privflow.data.schema import DatasetInfo

    env.set_verbosity(verbose)
    try:
        DatasetInfo(name=new)
    except ValidationError:
        raise ConfigError(
            f"Dataset name '{new}' may hold only letters, digits, '_', '.' and '-' (it is the ledger's key)."
        ) from None
    ledger = _ledger_at(store, old)
    ledger.rename_dataset(old, new)
    _plain(f"Renamed dataset '{old}' to '{new}' in the privacy ledger; set `dataset.name: {new}` in its schema.")


@ledger_app.command("set-budget")
def ledger_set_budget(
    dataset: Annotated[str, typer.Argument(help="Dataset name, as its schema's dataset.name.")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="The dataset's new total epsilon.")],
    delta: Annotated[float | None, typer.Option("--delta", help="The new total delta (default: unchanged).")] = None,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Change a dataset's total privacy budget on purpose (the data owner's decision): recorded in
    the ledger's notes, every run recomposed at the new delta. A schema can lower the budget by
    itself; only this raises it."""
    guarded(verbose, lambda: _ledger_set_budget(dataset, epsilon, delta, store, verbose))


def _ledger_set_budget(dataset: str, epsilon: float, delta: float | None, store: Path, verbose: bool) -> None:
    from privflow.core import env

    env.set_verbosity(verbose)
    from privflow.core.errors import ConfigError

    ledger = _ledger_at(store, dataset)
    if delta is None:
        delta = next(d.budget_delta for d in ledger.datasets() if d.name == dataset)
    # a total across runs, like the schema's `dataset.budget`: any finite positive figure (a single
    # run's --epsilon has its own limit, privacy.accounting.plan.MAX_EPSILON)
    if not (math.isfinite(epsilon) and 0 < epsilon):
        raise ConfigError(f"--epsilon must be a finite number above 0, got {epsilon}.")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise ConfigError(f"--delta must lie strictly between 0 and 1, got {delta}.")
    ledger.set_budget(dataset, epsilon, delta)
    console = Console()
    console.print(ledger.describe(dataset), highlight=False, soft_wrap=True, markup=False)
    from privflow.privacy.ledger import CHARGED_STATUSES
    from privflow.privacy.ledger.filter import adaptive_epsilon

    spent = ledger.spent(dataset)[0]
    adaptive = adaptive_epsilon([r.events for r in ledger.runs(dataset) if r.status in CHARGED_STATUSES], delta)
    if spent >= epsilon or adaptive >= epsilon:
        console.print(
            f"note: dataset '{dataset}' has already spent epsilon={spent:.4g} (PLD; {adaptive:.4g} by the bound "
            f"valid for adaptively chosen runs), at least the new budget of {epsilon:g} by one of them: no further "
            "run on it can be charged until the budget is raised.",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
