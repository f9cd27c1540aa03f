"""The released generator as an MLflow pyfunc: sample synthetic rows by model alias.

Everything it holds went through a mechanism: the flow weights of the checkpoint(s) that
Report-Noisy-Max chose, and the public schema. Loading it needs no training data and no
Prefect; MLflow bundles `models/` and `privflow/` with it (code_paths).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd


class FlowSampler(mlflow.pyfunc.PythonModel):
    """predict(DataFrame with column `n` and optional `seed`) -> synthetic rows (pandas).

    With several selected checkpoints (top-k Report-Noisy-Max, DP-GAN note section 4) the
    table is the union of equal shares sampled from each.
    """

    def load_context(self, context: Any) -> None:
        import torch

        from privflow.data.schema import Schema
        from privflow.data.target_head import release_codec
        from privflow.models import build_flow

        meta = json.loads(Path(context.artifacts["meta"]).read_text())
        self.schema = Schema.model_validate(meta["schema"])
        self.codec = release_codec(self.schema, meta.get("marginals"), meta.get("head"))
        self.flows = []
        for key in meta["checkpoints"]:
            flow = build_flow(meta["model"]["name"], self.codec.cardinalities, **meta["model"]["config"])
            flow.load_state_dict(torch.load(context.artifacts[key], map_location="cpu", weights_only=True))
            flow.eval()
            self.flows.append(flow)

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        n = int(model_input["n"].iloc[0])
        seed = int(model_input["seed"].iloc[0]) if "seed" in model_input.columns else None
        from privflow.data.codec import to_pandas
        from privflow.data.surface import to_surface

        rows = to_surface(sample_rows(self.flows, self.codec, n, seed), self.schema)  # as the input is written
        return to_pandas(rows, self.schema)  # integers stay integers


def sampling_generator(seed: int | None) -> Any:
    """The one generator a synthetic table is drawn from (docs/privacy.md, privacy rule 6).

    Explicit, never torch's global RNG: after private rows are read, the global state has
    been advanced by data-sized draws, and a table drawn from it would let anyone who can
    replay the public seed test guesses of the private row count. `seed` is a public
    sampling seed for reproducible post-processing; without one, the seed comes from the
    OS CSPRNG and is not recorded.
    """
    import secrets

    import torch

    return torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))


def _draw(flow: Any, m: int, generator: Any) -> tuple[Any, bool]:
    """The random half of a batch, on the calling thread: base draws z when the flow can map
    them (``from_base``), else the whole sample. (tensor, needs from_base)."""
    if hasattr(flow, "from_base") and hasattr(flow, "prior"):
        p = next(flow.parameters(), None)
        kw = {} if p is None else {"dtype": p.dtype, "device": p.device}
        return flow.prior.sample(m, generator, **kw), True
    return flow.sample(m, generator, batch_size=m), False


def _load_cuda_libraries(flows: list[Any]) -> None:
    """Map one all-zero row through each flow on a GPU, on the calling thread, before the worker
    threads start. CUDA's linear-algebra libraries load on first use and torch's loader must not
    be raced: two workers meeting the LU inverse's first triangular solve at once failed with
    "lazy wrapper should be called at most once" (torch 2.11, H100). Zeros, not draws: the
    sampling generator's sequence, and so the rows, stay as they are."""
    import torch

    for flow in flows:
        p = next(flow.parameters(), None)
        if p is not None and p.device.type == "cuda" and hasattr(flow, "from_base"):
            with torch.inference_mode():
                flow.from_base(torch.zeros(1, flow.d, dtype=p.dtype, device=p.device))


def _jitter(codec: Any, m: int, generator: Any) -> Any:
    """The uniform offsets of the copula codec's randomised rank transform (None for other
    codecs), drawn on the calling thread from the one sampling generator."""
    import torch

    if not hasattr(codec, "uniformize"):
        return None
    return torch.rand(m, codec.dim, generator=generator, dtype=torch.float64).numpy()


def _target_draws(codec: Any, m: int, generator: Any) -> Any:
    """One uniform per row for the target head's draw (privflow/data/target_head.py), on the calling
    thread from the one sampling generator; None for a codec without a head."""
    import torch

    if not hasattr(codec, "head"):
        return None
    return torch.rand(m, generator=generator, dtype=torch.float64).numpy()


def _rows(flow: Any, codec: Any, t: Any, mapped: bool, jitter: Any = None, target_u: Any = None) -> Any:
    """Map one batch of draws to decoded rows (on a worker thread). Inference mode, not just
    no_grad: the flow's thousands of small kernels per batch skip autograd's version counting
    and views (less CPU; the same numbers)."""
    import torch

    with torch.inference_mode():
        v = (flow.from_base(t) if mapped else t).cpu().numpy()
    if jitter is not None:
        v = codec.uniformize(v, jitter)
    return codec.decode(v) if target_u is None else codec.decode(v, target_u)


def iter_samples(
    flows: list[Any],
    codec: Any,
    n: int,
    seed: int | None = None,
    batch: int = 16384,
    workers: int | None = None,
    where: Any = None,
) -> Any:
    """Decoded frames of at most `batch` rows, `n` rows in all, drawn in equal shares from
    `flows` by the one explicit generator of ``sampling_generator(seed)``.

    `where` ({column: label}, COLUMN=VALUE texts or `Conditions`): only rows with these
    categorical values, drawn from the model's conditional law in rounds until `n` match
    (privflow/serving/conditions.py; ConfigError when they are too rare to reach `n`).

    Every random draw happens on the calling thread, in batch order; `workers` threads (default:
    the CPU count, at most 8) only map the draws through the flow and decode them, so the rows
    depend only on the released flows, the public schema, `seed` and `batch`, never on the
    number of workers or on timing. While it runs with several workers torch's intra-op
    threads are set to 1 (each worker then keeps a core busy; restored at the end). Memory is
    bounded by (workers + 1) batches whatever `n` is.
    """
    import os
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    import torch

    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    workers = max(1, workers if workers is not None else min(8, os.cpu_count() or 1))
    generator = sampling_generator(seed)
    shares = [n // len(flows) + (1 if i < n % len(flows) else 0) for i in range(len(flows))]
    jobs: Any = [
        (flow, min(batch, share - start))
        for flow, share in zip(flows, shares, strict=True)
        for start in range(0, share, batch)
    ]
    conditions = None
    if where:
        from privflow.serving import conditions as cond

        conditions = cond.conditions_for(codec.schema, where, getattr(where, "option", "where"))
        jobs, pick = cond.rounds(flows, n, batch), cond.subset_rng(generator)
    threads = torch.get_num_threads()
    if workers > 1:
        _load_cuda_libraries(flows)
        torch.set_num_threads(1)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="privflow-sample")
    pending: deque[Any] = deque()

    def results() -> Any:
        for flow, m in jobs:
            with torch.inference_mode():
                t, mapped = _draw(flow, m, generator)
            jitter, target_u = _jitter(codec, m, generator), _target_draws(codec, m, generator)
            if conditions is None:
                pending.append(pool.submit(_rows, flow, codec, t, mapped, jitter, target_u))
            else:
                pending.append(pool.submit(conditions.kept, _rows, flow, codec, t, mapped, jitter, target_u))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    try:
        yield from results() if conditions is None else conditions.collect(results(), n, len(flows), pick)
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)
        if workers > 1:
            torch.set_num_threads(threads)


def sample_rows(
    flows: list[Any],
    codec: Any,
    n: int,
    seed: int | None = None,
    batch: int = 16384,
    workers: int | None = None,
    where: Any = None,
) -> Any:
    """Decode `n` rows drawn in equal shares from `flows` as one frame (``iter_samples``;
    the same seed and batch give the same rows as ``write_samples``; `where`: conditions)."""
    import polars as pl

    parts = list(iter_samples(flows, codec, n, seed, batch, workers, where))
    return pl.concat(parts, rechunk=False) if parts else pl.DataFrame()


def write_samples(
    flows: list[Any],
    codec: Any,
    n: int,
    path: str | Path,
    seed: int | None = None,
    batch: int = 16384,
    progress: bool = False,
    workers: int | None = None,
    schema: Any = None,
    where: Any = None,
) -> Path:
    """Stream `n` sampled rows to `path` (.csv, or .parquet / .pq) batch by batch: CSV chunks
    are appended after one header, Parquet goes through one pyarrow ParquetWriter (a row
    group per batch). Memory stays bounded by `batch` whatever `n` is. `progress` shows a
    rich progress bar. Integer columns are written as integers (nulls as empty fields). With the
    release's `schema` (as written), rows are written as its input is (privflow/data/surface.py:
    dates as text in their format, booleans as labels, rounded decimals, no ignored column)."""
    from privflow.data.io import TABLE_SUFFIXES
    from privflow.data.surface import to_surface

    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"Output '{out}' must end in .csv or .parquet.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("sampling"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True)
        task = bar.add_task("rows", total=n)
        bar.start()
    writer = None
    try:
        with tmp.open("wb") as fh:
            for k, decoded in enumerate(iter_samples(flows, codec, n, seed, batch, workers, where)):
                frame = decoded if schema is None else to_surface(decoded, schema)
                if suffix == ".csv":
                    frame.write_csv(fh, include_header=k == 0)
                else:
                    import pyarrow.parquet as pq

                    table = frame.to_arrow()
                    if writer is None:
                        writer = pq.ParquetWriter(fh, table.schema)
                    writer.write_table(table.cast(writer.schema))
                if bar is not None:
                    bar.advance(task, frame.height)
            if writer is not None:
                writer.close()
                writer = None
        tmp.replace(out)  # a partial file never takes the output's name
    finally:
        if writer is not None:  # the write failed: its error is the one to report, and the file goes
            with contextlib.suppress(Exception):
                writer.close()
        if bar is not None:
            bar.stop()
        tmp.unlink(missing_ok=True)
    return out
