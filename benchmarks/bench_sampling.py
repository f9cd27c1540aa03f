"""Sampling throughput and memory: rows/s (marginal) and peak RSS writing N rows to a file.

The default DP-HFlow (``build_flow("dphflow", ...)`` defaults) on the Adult schema
(``privflow/demo/adult.yaml``) with random weights (sampling speed does not depend on
training), streamed by ``privflow.sampler.write_samples``. Each size runs in a fresh
subprocess, so start-up (imports, model build) is the same for all and peak memory
(VmHWM from /proc/self/status, else ru_maxrss) is per size. Marginal rows/s =
(n_large - n_small) / (t_large - t_small) on the write time of each child (start-up excluded;
the difference also removes any fixed per-call cost). Prints a Markdown table.

    .venv/bin/python benchmarks/bench_sampling.py [--sizes 100000 1000000 10000000] [--workers 2] [--threads 1] \
        [--format csv|parquet]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(n: int, path: str, threads: int, batch: int, workers: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from privflow.codec import Codec
    from privflow.models import build_flow
    from privflow.sampler import write_samples
    from privflow.schema import Schema

    codec = Codec.from_schema(Schema.from_yaml(ROOT / "privflow" / "demo" / "adult.yaml"))
    torch.manual_seed(0)
    flow = build_flow("dphflow", codec.cardinalities).eval()
    with torch.no_grad():  # random, non-identity weights: every layer does real work
        for p in flow.parameters():
            p.normal_(0.0, 0.1)
    start_rss = peak_rss_mb()
    t0 = time.perf_counter()
    write_samples([flow], codec, n, path, seed=0, batch=batch, workers=workers)
    dt = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "n": n,
                "seconds": dt,
                "peak_rss_mb": peak_rss_mb(),
                "startup_rss_mb": start_rss,
                "bytes": os.path.getsize(path),
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in each child")
    ap.add_argument("--workers", type=int, default=2, help="write_samples worker threads (the machine has 2 cores)")
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--format", default="csv", choices=["csv", "parquet"])
    ap.add_argument("--child", nargs=2, metavar=("N", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(int(args.child[0]), args.child[1], args.threads, args.batch, args.workers)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(args.sizes):
            path = str(Path(tmp) / f"s{n}.{args.format}")
            res = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--threads",
                    str(args.threads),
                    "--batch",
                    str(args.batch),
                    "--workers",
                    str(args.workers),
                    "--child",
                    str(n),
                    path,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            os.unlink(path)
    print(
        f"\nDP-HFlow (defaults), Adult schema, random weights, {args.format}, batch {args.batch}, "
        f"workers {args.workers}, torch threads {args.threads}, one subprocess per size\n"
    )
    print("| rows | write s | rows/s (average) | peak RSS MB | RSS after start-up MB | file MB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['seconds']:.1f} | {r['n'] / r['seconds']:,.0f} | {r['peak_rss_mb']:.0f} "
            f"| {r['startup_rss_mb']:.0f} | {r['bytes'] / 2**20:.0f} |"
        )
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        print(f"\nmarginal rows/s ({a['n']:,} -> {b['n']:,}): {(b['n'] - a['n']) / (b['seconds'] - a['seconds']):,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
