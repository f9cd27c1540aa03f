"""Ctrl-C and SIGTERM for the CLI: raised as exceptions where the main thread is, so that every
cleanup runs (the ledger's abandon, the scratch folder's removal, MLflow's run end), and never lost.

A handler's exception can land where Python ignores exceptions: in a ctypes callback (numba's
LLVM binding calls one while it compiles or loads a kernel on a run's first steps; a CI run
caught the Ctrl-C swallowed there, and the run went on to release), in a finaliser, in a weakref
callback. Python hands such an exception to `sys.unraisablehook`. The hook installed here sends
the signal again, from a helper thread, so that it lands in ordinary code once the callback has
returned; while the hook itself runs, the handlers defer instead of raising.
"""

from __future__ import annotations

import _thread
import logging
import signal
import sys
import threading
import time
from typing import Any

log = logging.getLogger("privflow")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is: a KeyboardInterrupt, so every cleanup that
    Ctrl-C runs also runs for a scheduler cancelling the job."""


_RESEND_DELAY_S = 0.02
_in_hook = False  # the hook below is running: a handler that ran now would raise inside it


def install() -> None:
    """The CLI's handlers: SIGTERM always, SIGINT unless it is ignored (`nohup`, a background job)."""
    signal.signal(signal.SIGTERM, on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)


def on_sigint(signum: int, frame: object) -> None:
    if not _deferred(signal.SIGINT):
        raise KeyboardInterrupt


def on_sigterm(signum: int, frame: object) -> None:
    if not _deferred(signal.SIGTERM):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        raise Terminated()


def _deferred(signum: signal.Signals) -> bool:
    """Whether the handler must not raise now: inside the hook its exception would be lost, so
    the signal is sent again for after it returns."""
    quiet_after_interrupt()
    if _in_hook:
        _send_again(signum)
    return _in_hook


def quiet_after_interrupt() -> None:
    """After a signal, objects a native library was building when it landed can fail in their
    finalisers, which Python prints as 'Exception ignored ... Traceback' under the one-line
    message. The interrupt is the cause and the message says so: such reports go to the debug
    log, and an interrupt swallowed on the way is sent again."""
    sys.unraisablehook = _after_interrupt


def _after_interrupt(unraisable: Any) -> None:
    global _in_hook
    _in_hook = True
    try:
        exc = unraisable.exc_value
        log.debug("after an interrupt, ignored in %r: %r", unraisable.object, exc)
        if isinstance(exc, Terminated):
            signal.signal(signal.SIGTERM, on_sigterm)  # re-armed: the handler reset it to end at once
            _send_again(signal.SIGTERM)
        elif isinstance(exc, KeyboardInterrupt):
            _send_again(signal.SIGINT)
    finally:
        _in_hook = False


def _send_again(signum: signal.Signals) -> None:
    """The signal again, from another thread and a moment later: sent at once, its handler
    would run before this frame returns, inside the callback or the hook that swallowed it."""

    def later() -> None:
        time.sleep(_RESEND_DELAY_S)
        _thread.interrupt_main(signum)

    threading.Thread(target=later, name="privflow-resignal", daemon=True).start()
