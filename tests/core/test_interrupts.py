"""The CLI's Ctrl-C and SIGTERM (privflow.core.interrupts): never lost where Python ignores exceptions,
and no 'Exception ignored ... Traceback' under the one-line message."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from privflow.core import interrupts

GUARD_S = 120

# each signal and the exception its handler raises
SIGNALS = pytest.mark.parametrize(
    ("signum", "raised"),
    [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, interrupts.Terminated)],
    ids=["ctrl-c", "sigterm"],
)


def _the_run_goes_on() -> None:
    """The run's next steps, in ordinary code, where the re-sent signal lands: wait until the
    helper thread that sends it again has done so (interrupts._send_again), then run a few
    statements, at the first of which the handler raises. The wait's bound only guards against
    a signal that is never sent again; it is not what ends the wait."""
    for thread in threading.enumerate():
        if thread.name == "privflow-resignal":
            thread.join(timeout=GUARD_S)
    for _ in range(1000):
        time.sleep(0)


@pytest.fixture()
def handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI's handlers installed in this process, and everything they change restored after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    signal.signal(signal.SIGINT, interrupts.on_sigint)
    signal.signal(signal.SIGTERM, interrupts.on_sigterm)
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


@SIGNALS
def test_a_signal_swallowed_by_a_ctypes_callback_is_raised_after_it(handlers: None, signum: int, raised: type) -> None:
    """A CI run sent Ctrl-C while numba's LLVM binding called back into Python (a ctypes
    callback, which ignores exceptions): the KeyboardInterrupt vanished and the run went on to
    release. The signal is sent again and raised in the code that called the callback."""
    progress: list[str] = []

    def callback() -> None:
        os.kill(os.getpid(), signum)
        for _ in range(1000):  # the handler runs here, inside the callback, which ignores its exception
            pass
        progress.append("the callback went on")

    native = ctypes.CFUNCTYPE(None)(callback)
    with pytest.raises(raised):
        native()
        _the_run_goes_on()
        progress.append("went on")
    assert progress == []


@SIGNALS
def test_a_signal_landing_in_the_hook_is_raised_after_it(
    handlers: None, monkeypatch: pytest.MonkeyPatch, signum: int, raised: type
) -> None:
    """A signal that lands while the hook reports another ignored error (a half-built object's
    finaliser, after a first interrupt): raised inside the hook it would be lost too, so the
    handler defers it, and it is raised after the hook returns."""
    interrupts.quiet_after_interrupt()

    class Landing:  # the signal arrives while the hook logs
        def debug(self, *args: object) -> None:
            os.kill(os.getpid(), signum)
            for _ in range(1000):
                pass

    monkeypatch.setattr(interrupts, "log", Landing())

    def callback() -> None:
        raise ValueError("a half-built object's own error")

    native = ctypes.CFUNCTYPE(None)(callback)
    went_on = False
    with pytest.raises(raised):
        native()
        _the_run_goes_on()
        went_on = True
    assert not went_on


@pytest.mark.parametrize("handler", [interrupts.on_sigint, interrupts.on_sigterm], ids=["ctrl-c", "sigterm"])
def test_finaliser_failures_after_an_interrupt_go_to_the_debug_log(
    handler: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A signal that lands while a native library builds an object leaves finalisers that fail
    later; Python would print each as 'Exception ignored ... Traceback' under the one-line
    message. After the handler they are logged at debug level instead of reaching the hook
    that prints them."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after the test
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the SIGTERM handler resets itself
    printed: list[object] = []
    sys.unraisablehook = printed.append  # stands for the default hook, which prints

    class HalfBuilt:
        def __del__(self) -> None:
            raise AttributeError("no attribute '_as_parameter_'")

    with pytest.raises(KeyboardInterrupt):
        handler(0, None)  # type: ignore[operator]
    with caplog.at_level("DEBUG", logger="privflow"):
        obj = HalfBuilt()
        del obj
        gc.collect()
    assert printed == []
    assert any("_as_parameter_" in r.getMessage() for r in caplog.records)
