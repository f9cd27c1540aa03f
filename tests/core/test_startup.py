"""privflow/core/startup.py: the CLI's start-up runs without cyclic collection, and leaves the
collector as it found it, with what start-up built frozen out of later collections."""

from __future__ import annotations

import gc
import threading
from types import SimpleNamespace

import pytest

from privflow.core import startup
from privflow.core.startup import imports_without_gc, meanwhile

GUARD_S = 120


@pytest.fixture(autouse=True)
def _restore_collector():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_no_collection_inside_and_the_collector_back_after() -> None:
    gc.enable()
    frozen = gc.get_freeze_count()
    with imports_without_gc():
        assert not gc.isenabled()
        built = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(built)


def test_a_disabled_collector_stays_disabled_even_when_the_block_fails() -> None:
    gc.disable()
    with pytest.raises(RuntimeError), imports_without_gc():
        raise RuntimeError("pre-flight refused the run")
    assert not gc.isenabled()


def test_meanwhile_works_during_the_wait_and_is_finished_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work runs while the block runs, and the block's end waits for it: the work here can
    only finish once `meanwhile` waits for its thread (the join lets it go on), so it is
    finished after the block on any machine, and unfinished if nothing waited for it."""
    started, release, done = threading.Event(), threading.Event(), []

    class Waited(threading.Thread):
        def join(self, timeout: float | None = None) -> None:
            release.set()  # the block has ended and waits for the work: let the work finish
            super().join(timeout)

    monkeypatch.setattr(startup, "threading", SimpleNamespace(Thread=Waited))

    def work() -> None:
        started.set()
        release.wait(GUARD_S)  # the bound is a guard only
        done.append(True)

    with meanwhile(work):
        assert started.wait(GUARD_S)  # running while the block waits (the bound is a guard only)
        assert done == []
    assert done == [True]  # and finished when the block ends


def test_meanwhile_drops_the_works_error_and_keeps_the_blocks() -> None:
    def failing() -> None:
        raise ImportError("no such module")

    with meanwhile(failing):
        pass  # the real import raises later, where the run needs the module
    with pytest.raises(RuntimeError), meanwhile(lambda: None):
        raise RuntimeError("the server never answered")
