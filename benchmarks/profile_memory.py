"""Resident memory of one `privflow run` by pipeline phase: a sampling profiler.

Runs the CLI in this process (all arguments after `--` go to `privflow`) while a thread reads
VmRSS from /proc every 0.2 s together with the function the main thread is in. Prints, per
phase of the pipeline (first pass, head, encoding, DP statistics, training, selection, ...),
the time it spanned and its lowest and highest RSS, then the largest samples with their
stacks, and each rise of the high-water mark (VmHWM) with where the main thread was when it
was seen: where a large run's peak memory comes from, including peaks too short to sample. Linux only (/proc).

    .venv/bin/python -m benchmarks.profile_memory -- run --data T.parquet --schema T.yaml \\
        --epsilon 1 --engine local --stream --quiet

Not a benchmark of record: the sampler thread adds a few MB and reads other threads' frames
(sys._current_frames), so use it to find a phase, and bench_stream.py for the figures.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
PHASES = (
    "first_pass",
    "fit_head",
    "stream_prepare",
    "prepare",
    "dp_statistics",
    "dp_prior",
    "train_flow_model",
    "cumulative_epsilon",
    "select_checkpoints",
    "calibrated",
    "_account",
    "_release_table",
    "_diagnose",
    "_register",
)


def resident_mb(field: str = "VmRSS") -> float:
    """The process's resident set (VmRSS) or its high-water mark so far (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def our_frames(thread_id: int) -> list[str]:
    """The main thread's stack, the project's frames only, outermost first."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return []
    return [
        f"{os.path.basename(f.filename)}:{f.name}"
        for f in traceback.extract_stack(frame)
        if f.filename.startswith(ROOT) and "/.venv/" not in f.filename
    ]


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    samples: list[tuple[float, float, list[str]]] = []
    rises: list[tuple[float, float, float, list[str]]] = []  # (t, old HWM, new HWM, stack)
    main_id = threading.main_thread().ident
    done = threading.Event()

    def sample() -> None:
        high = resident_mb("VmHWM")
        while not done.wait(0.2):
            try:
                stack = our_frames(main_id)
            except Exception:  # a frame torn down while read: skip the sample
                continue
            samples.append((time.perf_counter(), resident_mb(), stack))
            now = resident_mb("VmHWM")
            if now > high + 1:  # a peak since the last sample, even one too short to be sampled
                rises.append((time.perf_counter(), high, now, stack))
                high = now

    threading.Thread(target=sample, daemon=True).start()
    from privflow.cli import main as privflow_main

    sys.argv = ["privflow", *argv]
    t0 = time.perf_counter()
    try:
        code = privflow_main()
    except SystemExit as exc:
        code = exc.code
    finally:
        done.set()
    spans: dict[str, list[float]] = {}
    for t, rss, stack in samples:
        phase = next((p for p in PHASES if any(f.endswith(":" + p) for f in stack)), None)
        if phase is not None:
            s = spans.setdefault(phase, [t - t0, t - t0, rss, rss])
            s[1], s[2], s[3] = t - t0, min(s[2], rss), max(s[3], rss)
    print("\n| phase | from s | to s | min RSS MB | max RSS MB |\n| --- | ---: | ---: | ---: | ---: |")
    for phase, (a, b, lo, hi) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        print(f"| {phase} | {a:.1f} | {b:.1f} | {lo:.0f} | {hi:.0f} |")
    print("\nlargest samples:")
    for t, rss, stack in sorted(samples, key=lambda s: -s[1])[:5]:
        print(f"  {t - t0:7.1f} s {rss:6.0f} MB  {' > '.join(stack[-4:])}")
    print("\nhigh-water mark rises of more than 5 MB (where the main thread was when seen):")
    for t, old, new, stack in rises:
        if new - old > 5:
            print(f"  {t - t0:7.1f} s {old:6.0f} -> {new:6.0f} MB  {' > '.join(stack[-4:])}")
    print(f"peak (VmHWM) {resident_mb('VmHWM'):.0f} MB")
    print(f"exit {code}")
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
