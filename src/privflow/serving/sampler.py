"""Sampling a released generator: synthetic rows by batch, streamed to a file.

What is sampled is a release's flows and codec (`privflow.serving.release.Release`, loaded by
`load_release`); sampling needs no training data, no Prefect, no MLflow and no pandas
(`privflow generate`'s start-up). The MLflow pyfunc that a registered version runs,
``FlowSampler``, lives in privflow/serving/pyfunc.py, which imports this module, never the
reverse.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    """``FlowSampler`` by its old address, for the code file of versions registered before the
    pyfunc moved to privflow/serving/pyfunc.py (their sampler_model.py imports it from here).
    Resolved by name at run time, so this module neither imports the pyfunc (MLflow, pandas)
    nor depends on it."""
    if name == "FlowSampler":
        import importlib

        return importlib.import_module("privflow.serving.pyfunc").FlowSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sampling_generator(seed: int | None) -> Any:
    """The one generator a synthetic table is drawn from (docs/architecture.md, privacy rule 6).

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


def _rows(
    flow: Any, codec: Any, t: Any, mapped: bool, jitter: Any = None, target_u: Any = None, mend: bool = False
) -> Any:
    """Map one batch of draws to decoded rows (on a worker thread); `mend`: broken inequalities
    of the schema's rules swapped back (`rules.reflected`). Inference mode, not just no_grad: the
    flow's thousands of small kernels per batch skip autograd's version counting and views (less
    CPU; the same numbers)."""
    import torch

    with torch.inference_mode():
        v = (flow.from_base(t) if mapped else t).cpu().numpy()
    if jitter is not None:
        v = codec.uniformize(v, jitter)
    rows = codec.decode(v) if target_u is None else codec.decode(v, target_u)
    if mend:
        from privflow.data.rules import reflected

        rows = reflected(codec.schema, rows)
    return rows


def iter_samples(
    flows: list[Any],
    codec: Any,
    n: int,
    seed: int | None = None,
    batch: int = 16384,
    workers: int | None = None,
    where: Any = None,
    rules: bool = True,
) -> Any:
    """Decoded frames of at most `batch` rows, `n` rows in all, drawn in equal shares from
    `flows` by the one explicit generator of ``sampling_generator(seed)``.

    `where` ({column: value}, condition texts such as 'sex=Female' or 'age>=40', or `Conditions`
    checked against the release's public schema): only rows that meet every condition, drawn
    from the model's conditional law in rounds until `n` match (privflow/serving/conditions.py;
    ConfigError when they are too rare to reach `n`). A mapping or texts are checked against
    `codec.schema`, the modelled one (a date there is its day number): give `Conditions` from
    `conditions_for(release schema, ...)` to condition on a column as the table writes it.

    The rules of `codec.schema` (privflow/data/rules.py) hold on every row, `where` or not: a
    broken inequality is first mended by swapping its two values (`rules.reflected`), and the
    rules are conditions every row meets (`conditions.with_rules`, AND with `where`'s), so a row that
    breaks one is redrawn, in rounds as for `where`, and the share of draws that broke a rule is
    counted in the `tally` of a `Conditions` given as `where` (curator-facing). A schema without
    rules samples as before.

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
    mend = bool(rules and getattr(getattr(codec, "schema", None), "rules", ()))
    if where or mend:  # conditions every row meets
        from privflow.serving import conditions as cond

        given = cond.conditions_for(codec.schema, where, getattr(where, "option", "where")) if where else None
        conditions = cond.with_rules(given, codec.schema) if rules else given
        if conditions is not None:
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
                pending.append(pool.submit(_rows, flow, codec, t, mapped, jitter, target_u, mend))
            else:
                pending.append(pool.submit(conditions.kept, _rows, flow, codec, t, mapped, jitter, target_u, mend))
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
    rules: bool = True,
) -> Any:
    """Decode `n` rows drawn in equal shares from `flows` as one frame (``iter_samples``;
    the same seed and batch give the same rows as ``write_samples``; `where`: conditions;
    `rules=False`: the schema's rules not enforced)."""
    import polars as pl

    parts = list(iter_samples(flows, codec, n, seed, batch, workers, where, rules))
    return pl.concat(parts, rechunk=False) if parts else pl.DataFrame()


def _drawn_column(tally: Any) -> Any:
    """A progress column that reads the rows drawn so far off a conditional table's `Tally` at
    each refresh (privflow/serving/conditions.py), so a long draw shows it is under way between
    the rounds that keep rows (and the share of the draws that broke a rule of the schema)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Drawn(ProgressColumn):
        def render(self, task: Any) -> Text:
            rules = f", {100.0 * tally.rule_share:.3g}% broke a rule" if getattr(tally, "broke_rules", 0) else ""
            return Text(f"{tally.drawn:,} drawn{rules}", style="progress.data")

    return Drawn()


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
    rich progress bar (with `where` as `Conditions`, the rows drawn so far beside it). Integer
    columns are written as integers (nulls as empty fields). With the release's `schema` (as
    written), rows are written as its input is (privflow/data/lowering.py:
    dates as text in their format, booleans as labels, rounded decimals, no ignored column); in a
    CSV a numeric column that declares `decimals` is written with exactly that many (`csv_text`),
    one without keeps float64's shortest round-trip text. The file holds the same rows whatever
    the batches are written as (one CSV chunk or Parquet row group per batch)."""
    from privflow.data.io import TABLE_SUFFIXES
    from privflow.data.lowering import csv_text, to_surface

    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"Output '{out}' must end in .csv or .parquet.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns: list[Any] = [TextColumn("sampling"), BarColumn(), MofNCompleteColumn()]
        tally = getattr(where, "tally", None)
        if tally is not None:  # a conditional table: rows are kept a round at a time, the draws go on
            columns.append(_drawn_column(tally))
        bar = Progress(*columns, TimeRemainingColumn(), transient=True)
        task = bar.add_task("rows", total=n)
        bar.start()
    writer = None
    if suffix != ".csv":
        import pyarrow.parquet as pq
    try:
        with tmp.open("wb") as fh:
            for k, decoded in enumerate(iter_samples(flows, codec, n, seed, batch, workers, where)):
                frame = decoded if schema is None else to_surface(decoded, schema)
                if suffix == ".csv":
                    if schema is not None:
                        frame = csv_text(frame, schema)  # numbers at the precision the schema declares
                    frame.write_csv(fh, include_header=k == 0)
                else:
                    table = frame.to_arrow()
                    if writer is None:
                        writer = pq.ParquetWriter(fh, table.schema)
                    writer.write_table(table if table.schema.equals(writer.schema) else table.cast(writer.schema))
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
