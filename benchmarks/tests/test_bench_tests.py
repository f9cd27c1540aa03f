"""The CI timing benchmark's readers of `bash -x` traces and of pytest's output."""

from __future__ import annotations

import pytest

from benchmarks.bench_tests import failures, pytest_summary, slowest, step_times

TRACE = """++ 100.0 dirname .ci/run
+ 100.5 cd .ci/..
+ 101.0 python3 -m venv .venv
+ 104.0 .venv/bin/python -m pip install -q torch==2.13.0
+ 160.0 .venv/bin/ruff check .
"""


def test_each_top_level_command_lasts_until_the_next() -> None:
    steps = step_times(TRACE, end=161.5)
    assert [cmd for cmd, _ in steps] == [
        "cd .ci/..",
        "python3 -m venv .venv",
        ".venv/bin/python -m pip install -q torch==2.13.0",
        ".venv/bin/ruff check .",
    ]  # a subshell's line (++) is not a step
    assert [s for _, s in steps] == pytest.approx([0.5, 3.0, 56.0, 1.5])
    assert step_times("no trace at all\n", end=1.0) == []


OUTPUT = """........ [100%]
============================= slowest 20 durations =============================
17.78s setup    tests/flows/test_warm_start.py::test_a
9.61s call     tests/test_api.py::test_b
=========================== short test summary info ============================
SKIPPED [1] tests/x.py:1: no CUDA device
1515 passed, 12 skipped, 37 warnings in 273.45s (0:04:33)
"""


def test_the_summary_line_and_the_slowest_tests_are_read() -> None:
    assert pytest_summary(OUTPUT) == ("1515 passed, 12 skipped, 37 warnings", 273.45)
    assert pytest_summary("= 1 failed, 3 passed in 2.00s =") == ("1 failed, 3 passed", 2.0)
    assert pytest_summary("no summary here") is None
    assert failures(OUTPUT + "FAILED tests/a.py::test_x - AssertionError\n") == [
        "FAILED tests/a.py::test_x - AssertionError"
    ]
    assert failures(OUTPUT) == []
    assert slowest(OUTPUT) == [
        "17.78s setup    tests/flows/test_warm_start.py::test_a",
        "9.61s call     tests/test_api.py::test_b",
    ]
