"""The publishable ledger summary (`privflow ledger show`): per dataset its budget and spend,
and its charged runs, with the columns of PUBLISHABLE_RUN_COLUMNS only (a test checks it)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from privflow.privacy.accounting.events import Event
from privflow.privacy.ledger.compose import compose_epsilon, describe_event, headroom_epsilon
from privflow.privacy.ledger.filter import FIRST_RUN_DELTA_SHARE, adaptive_epsilon

if TYPE_CHECKING:
    from privflow.privacy.ledger.store import Ledger

# the statuses whose runs are charged (store.CHARGED_STATUSES) and how the summary names them
_STATUS_LABEL = {"reserved": "reserved (open)", "settled": "settled", "failed": "abandoned"}

# What the publishable ledger summary (`describe`, `privflow ledger show`) prints, per run,
# and why each is public. `describe` builds its table from this tuple only, and a test fails
# if it prints anything else. Data fingerprints are deliberately absent: they are keyed
# HMACs of private files, kept in the database for the curator and out of published output.
# No time finer than the day: the gaps between a dataset's runs (a reservation made after a run
# read, trained and registered) would time the private work (privacy rule 10).
PUBLISHABLE_RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "the run's id: a random identifier (Prefect flow-run UUID and attempt), not derived from rows"),
    (
        "status",
        "settled / abandoned / reserved (open): whether the run finished, a fact the released "
        "model already shows, and never data-dependent beyond the validation gate's DP decision",
    ),
    ("created", "the UTC calendar day of the reservation (the date only: no time of day)"),
    ("eps (run)", "the run's own epsilon: PLD composition of its events, which are mechanism parameters"),
    ("eps (cumulative)", "PLD composition of this run's and all earlier runs' events on the dataset"),
    (
        "adaptive (cumulative)",
        "the bound valid for adaptively chosen runs (privacy/ledger/filter.py) over this run and all "
        "earlier ones: a function of the same published events",
    ),
    (
        "events",
        "the mechanisms' parameters (noise multipliers, sample rates, steps), set by the public "
        "plan before any row is read: Gaussian (DP statistics, DP prior), Poisson-sampled Gaussian "
        "(DP-SGD), pure DP (Report-Noisy-Max, the validation gate)",
    ),
    ("stages", "the plan's standalone epsilon per stage, computed from public settings only"),
)
# Per dataset: name, budget (public settings of the schema), the two figures the budget is
# enforced by (PLD composition of the published events, and the bound valid for adaptively
# chosen runs), the epsilon a next run can ask for (`headroom_epsilon`, found by composing those
# events with one more mechanism under both figures, never budget minus spent), the number of
# charged runs, and the notes (budget changes), dated to the day.
PUBLISHABLE_DATASET_FIELDS: tuple[tuple[str, str], ...] = (
    ("dataset", "the schema's public dataset name"),
    ("budget", "the schema's public total (epsilon, delta)"),
    ("spent", "PLD composition of every charged run's events"),
    (
        "adaptive bound",
        "the bound valid however each run was chosen after earlier releases (a Rényi privacy filter over "
        "every charged run's events, privacy/ledger/filter.py); the budget is enforced by it and by the "
        "PLD figure together",
    ),
    (
        "next run",
        "the largest epsilon of one more Gaussian mechanism (calibrated at the budget's delta) that both "
        "figures keep within the budget: a function of public figures only",
    ),
    ("runs", "the number of charged runs listed below"),
    ("note", "a budget change and the UTC calendar day it was made (the date only)"),
)
_HEX = re.compile(r"\b[0-9a-f]{12,}\b")


def _day(stamp: str) -> str:
    """The calendar day of an ISO time stamp (the ledger stores UTC times): 'YYYY-MM-DD'."""
    return stamp[:10]


def describe(ledger: Ledger, dataset: str | None = None) -> str:
    """The publishable summary: per dataset its budget and spend, and its charged runs
    (settled, abandoned, open reservations) with the columns of PUBLISHABLE_RUN_COLUMNS only.

    Released reservations (they spent nothing) are left out, and so are data fingerprints
    and the curator-only notes about them (`curator_notes`); times are printed to the day.
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
        adaptive = adaptive_epsilon([r.events for r in runs], d.budget_delta)
        # printed rounded down, so that the printed figure itself fits the budget
        headroom = math.floor(headroom_epsilon(events, d.budget_epsilon, d.budget_delta) * 1e4) / 1e4
        if headroom > 0:
            next_run = (
                f"a next run can ask for about epsilon={headroom:.4f} at delta={d.budget_delta:g} (found by "
                "composition under both figures, not budget minus spent: a run's stages compose close to one "
                "Gaussian at that epsilon; pre-flight checks the exact plan)"
            )
        else:
            next_run = "no further run fits the budget (raise it with `privflow ledger set-budget`)"
        lines.append("")
        lines.append(
            f"Dataset {d.name}: budget epsilon={d.budget_epsilon:.4g} delta={d.budget_delta:g}; "
            f"spent epsilon={d.spent_epsilon:.4f} (PLD), adaptive bound epsilon={adaptive:.4f}; {next_run}; "
            f"{len(runs)} run(s); every epsilon below at delta={d.budget_delta:g}, the budget's (a run that "
            "targeted a smaller delta shows a smaller epsilon here than the one it was planned for)"
        )
        if runs:
            lines.append(
                "  the budget is enforced by two figures together: the PLD composition (tight when each run's "
                "parameters were fixed in advance) and the adaptive bound, which holds however each run was chosen "
                "after earlier releases (a Rényi privacy filter over every run's events; a dataset's first run, "
                f"while it is the only one, by its own PLD at {FIRST_RUN_DELTA_SHARE:g} of the delta): a run is "
                "refused when either would pass the budget"
            )
            table = [tuple(c for c in columns if c != "stages")]
            so_far: list[Event] = []
            so_far_runs: list[tuple[Event, ...]] = []
            for r in runs:
                so_far.extend(r.events)
                so_far_runs.append(r.events)
                cells = {
                    "run": r.run_id,
                    "status": _STATUS_LABEL.get(r.status, r.status),
                    "created": _day(r.created),
                    "eps (run)": f"{r.epsilon:.4f}",
                    "eps (cumulative)": f"{compose_epsilon(so_far, d.budget_delta):.4f}",
                    "adaptive (cumulative)": f"{adaptive_epsilon(so_far_runs, d.budget_delta):.4f}",
                    "events": "; ".join(describe_event(e) for e in r.events) or "-",
                }
                table.append(tuple(cells[c] for c in table[0]))
            widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
            for row in table:
                padded = [row[i].ljust(widths[i]) for i in range(len(widths))]
                lines.append("  " + "  ".join(padded) + "  " + row[-1])
            for r in runs:
                if r.stages:  # the plan's: a run that stopped early (the gate) spent only its events
                    label = "stages" if tuple(r.events) == tuple(r.reserved_events) else "planned stages"
                    lines.append(f"  {r.run_id} {label}: " + ", ".join(f"{k}={v}" for k, v in r.stages))
        for _, at, message in ledger.notes(d.name):
            lines.append(f"  note {_day(at)}: {_HEX.sub('<redacted>', message)}")
    return "\n".join(lines)


__all__ = ["PUBLISHABLE_DATASET_FIELDS", "PUBLISHABLE_RUN_COLUMNS", "describe"]
