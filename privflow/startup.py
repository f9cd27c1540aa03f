"""Start-up without the cyclic garbage collector: heavy imports built once per process.

Importing torch, MLflow, Great Expectations and opacus allocates millions of objects that
live as long as the process. With the collector on, every full collection on the way walks
all of them again: about 1.2 s of `privflow run`'s start on the 2-core machine
(benchmarks/bench_overhead.py, issue 15). `imports_without_gc` pauses collection while such
work runs, then `gc.freeze()` moves what it built out of every later collection's way;
reference counting still frees everything as usual, and collection resumes for the work.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """No cyclic collection inside the block; afterwards, what exists is frozen and the
    collector is back as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


__all__ = ["imports_without_gc"]
