"""Composed epsilons kept on disk (privacy/accounting/composed_cache.py): a hit returns exactly what the
accountant computed, anything that changes the answer changes the key, and a bad file never
fails a composition."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from privflow.privacy.accounting import accountant, composed_cache
from privflow.privacy.accounting.accountant import PLDAccountant, RDPAccountant, remember_on_disk
from privflow.privacy.accounting.events import GaussianEvent, PoissonGaussianEvent

EVENTS = [GaussianEvent(3.0), PoissonGaussianEvent(0.01, 1.2, 200)]


@pytest.fixture
def on_disk(tmp_path: Path):
    path = tmp_path / "cache" / "composed.sqlite"
    remember_on_disk(path)
    accountant._COMPOSED.clear()
    yield path
    remember_on_disk(None)
    accountant._COMPOSED.clear()


class Counting:
    """Wraps an accountant class's _epsilon to count real compositions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
        self.calls = 0
        real = cls._epsilon

        def counted(acc, pairs, delta):  # noqa: ANN001, ANN202
            self.calls += 1
            return real(acc, pairs, delta)

        monkeypatch.setattr(cls, "_epsilon", counted)


def fresh_process() -> None:
    accountant._COMPOSED.clear()  # what a new process starts with


def test_a_second_process_reads_the_same_epsilon_without_composing(on_disk, monkeypatch):
    count = Counting(monkeypatch, PLDAccountant)
    first = PLDAccountant().epsilon(EVENTS, 1e-5)
    assert count.calls == 1 and on_disk.is_file()
    fresh_process()
    assert PLDAccountant().epsilon(EVENTS, 1e-5) == first
    assert count.calls == 1
    assert stat.S_IMODE(os.stat(on_disk).st_mode) == 0o600


@pytest.mark.parametrize(
    "change",
    [
        lambda: PLDAccountant().epsilon(EVENTS, 2e-5),  # delta
        lambda: PLDAccountant().epsilon([GaussianEvent(3.0), PoissonGaussianEvent(0.01, 1.2, 201)], 1e-5),  # steps
        lambda: PLDAccountant().epsilon([GaussianEvent(3.0 + 1e-12), *EVENTS[1:]], 1e-5),  # a float's last bits
        lambda: PLDAccountant().epsilon(EVENTS + EVENTS[:1], 1e-5),  # one more event
        lambda: PLDAccountant(2e-4).epsilon(EVENTS, 1e-5),  # the accountant's settings
    ],
    ids=["delta", "steps", "float-bits", "events", "settings"],
)
def test_anything_that_changes_the_answer_is_composed_again(on_disk, monkeypatch, change):
    count = Counting(monkeypatch, PLDAccountant)
    PLDAccountant().epsilon(EVENTS, 1e-5)
    fresh_process()
    change()
    assert count.calls == 2


def test_another_library_version_or_accountant_is_composed_again(on_disk, monkeypatch):
    pld, rdp = Counting(monkeypatch, PLDAccountant), Counting(monkeypatch, RDPAccountant)
    e_pld = PLDAccountant().epsilon(EVENTS, 1e-5)
    fresh_process()
    e_rdp = RDPAccountant().epsilon(EVENTS, 1e-5)  # same events, the other accountant: its own answer
    assert rdp.calls == 1 and e_rdp != e_pld
    fresh_process()
    monkeypatch.setattr(composed_cache, "library_version", lambda dist: "0.0-other")
    PLDAccountant().epsilon(EVENTS, 1e-5)
    assert pld.calls == 2


def test_the_key_is_exact_json_of_the_events():
    key = json.loads(composed_cache.cache_key("pld", "dp-accounting", (1e-4,), [(EVENTS[1], 2)], 1e-5))
    event = {"kind": "poisson_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.2, "steps": 200}
    assert key["events"] == [[event, 2]]
    assert key["delta"] == 1e-5 and key["format"] == composed_cache.FORMAT


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b""])
def test_a_damaged_file_leaves_the_answer_to_the_accountant(tmp_path, monkeypatch, content):
    path = tmp_path / "composed.sqlite"
    path.write_bytes(content)
    remember_on_disk(path)
    accountant._COMPOSED.clear()
    try:
        expected = PLDAccountant(2e-4).epsilon(EVENTS, 1e-5)
        fresh_process()
        assert PLDAccountant(2e-4).epsilon(EVENTS, 1e-5) == expected
    finally:
        remember_on_disk(None)
        accountant._COMPOSED.clear()


def test_a_wrong_stored_value_type_is_ignored(on_disk, monkeypatch):
    import sqlite3

    count = Counting(monkeypatch, PLDAccountant)
    expected = PLDAccountant().epsilon(EVENTS, 1e-5)
    con = sqlite3.connect(on_disk)
    con.execute("UPDATE composed SET epsilon = -1.0")
    con.commit()
    con.close()
    fresh_process()
    assert PLDAccountant().epsilon(EVENTS, 1e-5) == expected
    assert count.calls == 2


@pytest.mark.parametrize("value", ["off", "OFF", "", "0"])
def test_the_environment_switches_it_off(monkeypatch, value):
    monkeypatch.setenv(composed_cache.ENV, value)
    assert composed_cache.default_path() is None


def test_the_default_lives_in_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(composed_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert composed_cache.default_path() == tmp_path / "privflow" / "composed-epsilons.sqlite"


PLAN = """
import sys
from pathlib import Path
from privflow.core.config import RunConfig
from privflow.data.schema import Schema
from privflow.privacy.accounting.accountant import remember_on_disk
from privflow.tasks.run_plan import run_plan
demo = Path(sys.argv[1])
cfg = RunConfig.build(data=demo / "adult_train.csv", schema_path=demo / "adult.yaml")
remember_on_disk()
plan = run_plan(cfg, Schema.from_yaml(demo / "adult.yaml"))
print(repr(plan.epsilon), repr(plan.stage("train").event.noise_multiplier), "dp_accounting" in sys.modules)
"""


def test_a_repeated_plan_in_a_new_process_needs_no_composition(tmp_path, demo_dir):
    """The CLI's case: the same run planned again later is a look-up (dp-accounting not even imported)."""
    env = {**os.environ, composed_cache.ENV: str(tmp_path / "composed.sqlite")}
    runs = [
        subprocess.run([sys.executable, "-c", PLAN, str(demo_dir)], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    first, second = (r.stdout.split() for r in runs)
    assert first[:2] == second[:2]
    assert first[2] == "True" and second[2] == "False"
