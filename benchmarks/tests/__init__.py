"""Tests of the benchmark harness: `python -m pytest benchmarks/tests` from the repository root."""
