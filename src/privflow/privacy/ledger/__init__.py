"""The privacy ledger: the SQLite store of every dataset's runs and events (`store`), the
composition that turns events into epsilons and budget verdicts (`compose`), and the publishable
summary (`summary`)."""

from privflow.privacy.ledger.compose import (
    budget_verdict,
    check_budget,
    compose_epsilon,
    describe_event,
    headroom_epsilon,
    merge_events,
)
from privflow.privacy.ledger.store import (
    CHARGED_STATUSES,
    DatasetRecord,
    Ledger,
    Lineage,
    PublicSource,
    RunRecord,
    attempt_run_id,
    check_budget_at,
)
from privflow.privacy.ledger.summary import PUBLISHABLE_DATASET_FIELDS, PUBLISHABLE_RUN_COLUMNS, describe

__all__ = [
    "CHARGED_STATUSES",
    "PUBLISHABLE_DATASET_FIELDS",
    "PUBLISHABLE_RUN_COLUMNS",
    "DatasetRecord",
    "Ledger",
    "Lineage",
    "PublicSource",
    "RunRecord",
    "attempt_run_id",
    "budget_verdict",
    "check_budget",
    "check_budget_at",
    "compose_epsilon",
    "describe",
    "describe_event",
    "headroom_epsilon",
    "merge_events",
]
