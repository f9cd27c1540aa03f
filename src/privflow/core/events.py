"""Progress events a run reports to a process that watches it (a test, a job wrapper): one line
per event, appended to the file named by ``PRIVFLOW_EVENTS``; nothing when it is unset.

The events: ``reserved <run_id>`` once the ledger holds the run's reservation, and ``epoch <k>``
as DP-SGD on the flow starts its k-th epoch (k from 1; one epoch is 1 / sample rate steps). A
watcher acts on what the run says it has reached instead of guessing from the clock.

``PRIVFLOW_EVENTS_HOLD`` names one event (``epoch 2``, say): a run that reports it waits there
until a signal ends the wait (Ctrl-C and SIGTERM unwind the run, SIGKILL ends it), so a signal
sent on that event lands at that point on any machine, however fast.

The lines are for the curator's machine only, never released (they carry no private value: the
run id and planned epoch numbers). Writing is best effort: a file that cannot be written never
fails a run.
"""

from __future__ import annotations

import os
import time

EVENTS_ENV = "PRIVFLOW_EVENTS"
HOLD_ENV = "PRIVFLOW_EVENTS_HOLD"


def report(event: str) -> None:
    """Append `event` as one line to the file PRIVFLOW_EVENTS names (no-op when unset); then, if
    PRIVFLOW_EVENTS_HOLD names this event, wait until a signal ends the run or the wait."""
    line = " ".join(event.split())
    path = os.environ.get(EVENTS_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")  # one short write in append mode: lines never interleave
        except OSError:
            pass  # a side channel: the run goes on without it
    hold = os.environ.get(HOLD_ENV)
    if hold and " ".join(hold.split()) == line:
        _hold()


def _hold() -> None:
    """Wait for a signal: its handler's exception (Ctrl-C, SIGTERM) ends the sleep and unwinds."""
    while True:
        time.sleep(3600)


__all__ = ["EVENTS_ENV", "HOLD_ENV", "report"]
