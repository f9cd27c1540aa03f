"""Streamed preparation: the table read in chunks, never whole (privflow/data/chunked.py).

What a streamed run computes is what `tasks.fit.prepare` computes on the table read whole;
only the order of the reads differs:

1. `first_pass`, inside the validation gate: every chunk validated
   (``privflow.data.validation.validate_chunks``: the gate decides once, on the total), its clean
   rows counted into the DP marginals' statistic, written to disk as the head's rows, and
   their equality keys partitioned on disk for the occurrence ranks
   (``privflow.data.rank_spill.SpilledRanks``). Nothing is released here: if the gate stops the
   run, the counts and files are discarded.
2. `stream_prepare`: the planned releases, the marginals from the summed counts (the same
   vector as ``marginal_counts`` of the whole table, so the same Gaussian event) and the head
   by DP-SGD over its rows on disk (each step gathers its Poisson sample, at the rate the
   public expected_rows sets); then the chunks again, validated again (the same checks drop
   the same rows, no quarantine written twice), encoded through the released codec into the
   training and selection files (the same salted row-hash split, with each row's occurrence
   rank in the whole table from the first pass's keys), and a hash-coin sample of
   about `stream.diagnostic_rows` clean rows kept for the curator-only diagnostics.

The stages after these read the encoded rows from their files: DP-SGD gathers each Poisson
sample, the DP statistics, the DP mixture prior's DP-EM iterations (`model.prior: mog`) and
Report-Noisy-Max read them in slices. Not streamed: data-parallel workers (each process would
read the table; pre-flight refuses the combination).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from privflow.core.config import RunConfig
from privflow.core.steps import StepRunner, plain_call
from privflow.data.chunked import DiskRows, parquet_chunks, parquet_rows
from privflow.data.codec import Codec
from privflow.data.copula import CopulaCodec
from privflow.data.lowering import lower
from privflow.data.rank_spill import SpilledRanks
from privflow.data.row_hash import row_units
from privflow.data.schema import Schema
from privflow.data.target_head import TargetCodec, head_widths
from privflow.data.validation import Gate, ValidationReport, validate, validate_chunks
from privflow.privacy.accounting.plan import PrivacyPlan
from privflow.privacy.fingerprint import row_digests, sampled, store_key
from privflow.privacy.mechanisms import dp_marginals as marginals_mechanism
from privflow.tasks.encode import encode_split, selection_coins
from privflow.tasks.fit import Spend
from privflow.tasks.head_stage import fit_head_planned, head_rows
from privflow.tasks.marginals_stage import codec_from_counts, planned_grid_bins

DIAGNOSTIC_SALT = 0x5A3E_D1A6  # public: the diagnostics' coins differ from the selection split's


@dataclass
class FirstPass:
    """What the first pass leaves for the releases: the marginals' counts on their grid, and the
    head's rows on disk (None where the plan has no such stage); for the encoding pass, the
    clean rows' keys on disk."""

    counts: np.ndarray | None
    grid: int | None
    head: DiskRows | None
    ranks: SpilledRanks
    row_sample: np.ndarray  # the keyed sample of the clean rows' digests (privacy/fingerprint.py, `sampled`)
    rows: int  # the clean rows read


def _chunks(config: RunConfig, schema: Schema, what: str, show_progress: bool) -> Iterator[pl.DataFrame]:
    """The input's chunks (a row over the schema's public line cap fails), with a progress bar
    over the rows (a pass over a large table takes a while)."""
    columns = [TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        bar = progress.add_task(what, total=parquet_rows(config.data))
        for chunk in parquet_chunks(config.data, config.stream.chunk_rows, schema.dataset.max_line_bytes):
            yield chunk
            progress.advance(bar, chunk.height)


def first_pass(
    config: RunConfig,
    schema: Schema,
    plan: PrivacyPlan,
    work: Path,
    gate: Gate,
    quarantine: Path,
    show_progress: bool = False,
) -> tuple[FirstPass, ValidationReport]:
    """Validate the table chunk by chunk under the gate, keeping the statistics the planned
    releases need (module docstring, step 1). `gate` is called as `validate_chunks` calls it: with
    the rows' cells (`cells=RowCells`) where it takes that keyword. The chunks are checked under
    the schema as written, the statistics taken over its modelled columns
    (`privflow.data.lowering.lower`)."""
    model = lower(schema)
    grid = None
    if plan.has("dp_marginals"):
        grid = planned_grid_bins(config.marginals.grid_bins, model.dataset.expected_rows)
    head = None
    if plan.has("dp_head"):
        head = DiskRows(work / "head.f32", len(head_widths(model, config.head.numeric_knots)) + 1)
    counts: list[np.ndarray] = []  # one vector of cell counts per chunk (their sum is the statistic)
    ranks = SpilledRanks(work / "ranks", parquet_rows(config.data))
    key, sample, rows = store_key(config.store), [], 0  # the charged rows' keyed sample, for the ledger

    def consume(clean: pl.DataFrame) -> None:
        nonlocal rows
        ranks.record(clean)
        sample.append(sampled(row_digests(clean, key)))
        rows += clean.height
        if grid is not None:
            counts.append(marginals_mechanism.marginal_counts(clean, model, grid_bins=grid))
        if head is not None:
            head.append(head_rows(model, clean, config.head.numeric_knots))

    chunks = _chunks(config, schema, "Validating (pass 1 of 2)", show_progress)
    report = validate_chunks(chunks, schema, config.policy, quarantine, gate, consume)
    # validate_chunks hands consume every chunk it checks (clean rows or none) or raises: counts is set
    keyed = np.concatenate(sample) if sample else np.zeros(0, dtype="<u8")
    return FirstPass(np.sum(counts, axis=0) if grid is not None else None, grid, head, ranks, keyed, rows), report


def stream_prepare(
    config: RunConfig,
    schema: Schema,
    plan: PrivacyPlan,
    spend: Spend,
    first: FirstPass,
    work: Path,
    runner: StepRunner = plain_call,
    show_progress: bool = False,
) -> tuple[Codec | CopulaCodec | TargetCodec, DiskRows, DiskRows, pl.DataFrame]:
    """The releases and the encoding pass (module docstring, step 2): the codec, the training
    and selection rows on disk, and the diagnostics' sample of clean rows. Each step goes through
    `runner` (core/steps.py; a Prefect task run inside a flow, flows/steps.py), as in
    `tasks.fit.prepare`. The codec is the modelled schema's; the encoding pass checks the chunks
    again under `schema` as written."""
    model = lower(schema)
    codec: Any = Codec.from_schema(model)
    if first.counts is not None:
        assert first.grid is not None
        spend.start()
        codec = runner(codec_from_counts, first.counts, model, plan.stage("dp_marginals"), first.grid)
        spend.add(plan.stage("dp_marginals").event)
    if first.head is not None:
        spend.start()
        head = runner(fit_head_planned, first.head, model, config.head, plan.stage("dp_head"))
        spend.add(plan.stage("dp_head").event)
        codec = TargetCodec.around(model, codec, head)
    x_train, x_val, sample = runner(encode_chunks, config, schema, codec, work, first.ranks, show_progress)
    return codec, x_train, x_val, sample


def encode_chunks(
    config: RunConfig, schema: Schema, codec: Any, work: Path, ranks: SpilledRanks, show_progress: bool = False
) -> tuple[DiskRows, DiskRows, pl.DataFrame]:
    """Encode every clean row into the training / selection files (`tasks.encode.encode_split`,
    fresh dequantization offsets from OS entropy), and keep about `stream.diagnostic_rows` clean
    rows (each by a salted hash coin at rate diagnostic_rows / expected_rows) for the curator-only
    evaluation, which is never released."""
    x_train, x_val = DiskRows(work / "train.f32", codec.dim), DiskRows(work / "select.f32", codec.dim)
    rate = min(1.0, config.stream.diagnostic_rows / max(1, schema.dataset.expected_rows or 1))
    rng = np.random.default_rng()
    sample: list[pl.DataFrame] = []
    try:
        for chunk in _chunks(config, schema, "Encoding (pass 2 of 2)", show_progress):
            if not chunk.height:
                continue
            clean = validate(chunk, schema, "strict", None, lambda _f, _p: False)[0]  # the first pass's checks
            rank = ranks.ranks(clean)  # occurrence ranks in the whole table, as the whole table's would be
            coin = selection_coins(clean, config.select.fraction(schema.dataset.expected_rows), config.train.seed, rank)
            train, val = encode_split(clean, coin, codec, rng)
            x_train.append(train)
            x_val.append(val)
            sample.append(clean.filter(pl.Series(row_units(clean, config.train.seed ^ DIAGNOSTIC_SALT, rank) < rate)))
    finally:
        ranks.close()
    return x_train, x_val, pl.concat(sample)


__all__ = ["FirstPass", "encode_chunks", "first_pass", "stream_prepare"]
