"""privflow's benchmarks: the sweep (``python -m benchmarks.sweep``) and one script per measured
question (``python -m benchmarks.bench_x``), run from the repository root; each writes a
results file under benchmarks/results/ with the command that reproduces it.

A package of the checkout, not of the installed privflow: its modules import each other as
``benchmarks.datasets``, ``benchmarks.peers.driver``. opacus also installs a top-level package
named ``benchmarks``; the repository's wins when the repository root comes first on sys.path,
as it does under ``python -m`` from the root and under pytest.
"""
