"""The publishable ledger summary (`privflow ledger show`): per dataset its budget and spend,
and its charged runs, with the columns of PUBLISHABLE_RUN_COLUMNS only (a test checks it)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from privflow.privacy.accounting.events import Event
from privflow.privacy.ledger.compose import compose_epsilon, describe_event, headroom_epsilon

if TYPE_CHECKING:
    from privflow.privacy.ledger.store import Ledger

# the statuses whose runs are charged (store.CHARGED_STATUSES) and how the summary names them
_STATUS_LABEL = {"reserved": "reserved (open)", "settled": "settled", "failed": "abandoned"}

# What the publishable ledger summary (`describe`, `privflow ledger show`) prints, per run,
# and why each is public. `describe` builds its table from this tuple only, and a test fails
# if it prints anything else. Data fingerprints are deliberately absent: they are keyed
# HMACs of private files, kept in the database for the curator and out of published output.
PUBLISHABLE_RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "the run's id: a random identifier (Prefect flow-run UUID and attempt), not derived from rows"),
    (
        "status",
        "settled / abandoned / reserved (open): whether the run finished, a fact the released "
        "model already shows, and never data-dependent beyond the validation gate's DP decision",
    ),
    ("created", "wall-clock time of the reservation, made before any row is read"),
    ("eps (run)", "the run's own epsilon: PLD composition of its events, which are mechanism parameters"),
    ("eps (cumulative)", "PLD composition of this run's and all earlier runs' events on the dataset"),
    (
        "events",
        "the mechanisms' parameters (noise multipliers, sample rates, steps), set by the public "
        "plan before any row is read: Gaussian (DP statistics, DP prior), Poisson-sampled Gaussian "
        "(DP-SGD), pure DP (Report-Noisy-Max, the validation gate)",
    ),
    ("stages", "the plan's standalone epsilon per stage, computed from public settings only"),
)
# Per dataset: name, budget (public settings of the schema), spent epsilon (PLD composition
# of the published events), the epsilon a next run can ask for (`headroom_epsilon`, found by
# composing those events with one more mechanism, never budget minus spent) and the number of
# charged runs.
PUBLISHABLE_DATASET_FIELDS: tuple[tuple[str, str], ...] = (
    ("dataset", "the schema's public dataset name"),
    ("budget", "the schema's public total (epsilon, delta)"),
    ("spent", "PLD composition of every charged run's events"),
    (
        "next run",
        "the largest epsilon of one more Gaussian mechanism (calibrated at the budget's delta) whose "
        "composition with the published events stays within the budget: a function of public figures only",
    ),
    ("runs", "the number of charged runs listed below"),
)
_HEX = re.compile(r"\b[0-9a-f]{12,}\b")


def describe(ledger: Ledger, dataset: str | None = None) -> str:
    """The publishable summary: per dataset its budget and spend, and its charged runs
    (settled, abandoned, open reservations) with the columns of PUBLISHABLE_RUN_COLUMNS only.

    Released reservations (they spent nothing) are left out, and so are data fingerprints
    and the curator-only notes about them (`curator_notes`).
    """
    datasets = [d for d in ledger.datasets() if dataset is None or d.name == dataset]
    if dataset is not None and not datasets:
        return f"Dataset '{dataset}' is not in the privacy ledger ({ledger.path})."
    if not datasets:
        return f"The privacy ledger ({ledger.path}) is empty."
    columns = [name for name, _ in PUBLISHABLE_RUN_COLUMNS]
    lines: list[str] = [f"Privacy ledger: {ledger.path}"]
    for d in datasets:
        runs = [r for r in ledger.runs(d.name) if r.status in _STATUS_LABEL]
        events = [e for r in runs for e in r.events]
        # printed rounded down, so that the printed figure itself fits the budget
        headroom = math.floor(headroom_epsilon(events, d.budget_epsilon, d.budget_delta) * 1e4) / 1e4
        if headroom > 0:
            next_run = (
                f"a next run can ask for about epsilon={headroom:.4f} at delta={d.budget_delta:g} (found by "
                "composition, not budget minus spent: a run's stages compose close to one Gaussian at that "
                "epsilon; pre-flight checks the exact plan)"
            )
        else:
            next_run = "no further run fits the budget (raise it with `privflow ledger set-budget`)"
        lines.append("")
        lines.append(
            f"Dataset {d.name}: budget epsilon={d.budget_epsilon:.4g} delta={d.budget_delta:g}; "
            f"spent epsilon={d.spent_epsilon:.4f}; {next_run}; {len(runs)} run(s); "
            f"every epsilon below at delta={d.budget_delta:g}, the budget's (a run that targeted a smaller "
            "delta shows a smaller epsilon here than the one it was planned for)"
        )
        if runs:
            lines.append(
                f"  fully adaptive bound: epsilon={sum(r.epsilon for r in runs):.4f} at "
                f"delta={len(runs) * d.budget_delta:g} (each run's epsilon at the budget's delta, summed: basic "
                "composition, which holds as a privacy filter even where whether and how a run ran depended on "
                "earlier releases; Rogers et al. 2016)"
            )
            table = [tuple(c for c in columns if c != "stages")]
            so_far: list[Event] = []
            for r in runs:
                so_far.extend(r.events)
                cells = {
                    "run": r.run_id,
                    "status": _STATUS_LABEL.get(r.status, r.status),
                    "created": r.created[:19],
                    "eps (run)": f"{r.epsilon:.4f}",
                    "eps (cumulative)": f"{compose_epsilon(so_far, d.budget_delta):.4f}",
                    "events": "; ".join(describe_event(e) for e in r.events) or "-",
                }
                table.append(tuple(cells[c] for c in table[0]))
            widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
            for row in table:
                cells = [row[i].ljust(widths[i]) for i in range(len(widths))]
                lines.append("  " + "  ".join(cells) + "  " + row[-1])
            for r in runs:
                if r.stages:  # the plan's: a run that stopped early (the gate) spent only its events
                    label = "stages" if tuple(r.events) == tuple(r.reserved_events) else "planned stages"
                    lines.append(f"  {r.run_id} {label}: " + ", ".join(f"{k}={v}" for k, v in r.stages))
        for _, at, message in ledger.notes(d.name):
            lines.append(f"  note {at[:19]}: {_HEX.sub('<redacted>', message)}")
    return "\n".join(lines)


__all__ = ["PUBLISHABLE_DATASET_FIELDS", "PUBLISHABLE_RUN_COLUMNS", "describe"]
