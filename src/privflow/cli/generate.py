"""`privflow generate`: synthetic rows sampled from a registered model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from privflow.cli._common import Device, StoreOpt, VerboseOpt, choice_value, guarded

if TYPE_CHECKING:
    from privflow.serving.release import Release


def generate(
    model: Annotated[str, typer.Option("--model", help="NAME@ALIAS or NAME/VERSION of a registered model.")],
    n: Annotated[int, typer.Option("-n", help="Number of rows to sample.", min=1)],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output file (.csv or .parquet).")],
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for reproducible samples.")] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            "--where",
            help="Only rows that meet a condition, drawn from the model's conditional law: COLUMN=LABEL for a "
            "categorical or boolean column; for an integer, numeric, date or datetime column a comparison "
            "(COLUMN>=V, >, <=, <, ==, !=) or a range COLUMN=LOW..HIGH (both ends included), dates in the column's "
            "own format. Repeat for several; they combine with AND. Quote each one in a shell. Free, like any "
            "sampling.",
        ),
    ] = None,
    device: Annotated[
        Device,
        typer.Option(
            "--device",
            help="Where the flow's inverse runs (auto: CUDA when present). A seed gives the same rows on the same "
            "kind of device; CPU and GPU arithmetic can differ in the last bits.",
            case_sensitive=False,
        ),
    ] = Device.auto,
    store: StoreOpt = Path(".privflow"),
    verbose: VerboseOpt = False,
) -> None:
    """Sample synthetic rows from a registered model (never touches the training data)."""
    chosen = choice_value(device) or "auto"
    guarded(verbose, lambda: _generate(model, n, out, seed, store, verbose, chosen, where=where), spends=False)


def _generate(
    model: str,
    n: int,
    out: Path,
    seed: int | None,
    store: Path,
    verbose: bool,
    device: str = "auto",
    where: list[str] | None = None,
) -> None:
    from privflow.preflight import check_output, check_registry, check_room, check_seed, resolve_device
    from privflow.serving.conditions import parse_where

    check_output(out)
    replaced = " (replacing the file that was there)" if out.exists() else ""
    seed = check_seed(seed)
    wanted = parse_where(where)  # the conditions' form, before the store is opened
    device = resolve_device(device)  # before the store is opened: a missing GPU costs nothing
    check_registry(store, f"--model {model}", "Train and register one first (`privflow run`) with the same --store.")
    from privflow.core import env
    from privflow.core.startup import imports_without_gc

    env.configure(store, verbose=verbose)
    with imports_without_gc():  # torch's (and maybe MLflow's) import and the model's load (core/startup.py)
        from privflow.serving.local_store import load_local

        # A privflow release in the store's own registry is read from its files, without MLflow
        # (seconds of start-up); anything else loads through MLflow as before.
        release = load_local(model, store)
        generator = None if release is not None else _load_with_mlflow(model, store, verbose)
    if release is None:
        release = _generator_release(generator)
    schema = release.codec.schema if release is not None else _generator_schema(generator)
    conditions = _conditions(release, wanted)  # against the public schema, before sampling
    check_room(out, n, len(schema.columns) if schema is not None else 1)
    if release is not None:
        # Stream: the released flows sample batch by batch straight into the file (bounded
        # memory, one explicit generator from `--seed` or the OS CSPRNG, privflow.serving.sampler).
        from privflow.serving.sampler import write_samples

        flows = [flow.to(device) for flow in release.flows]
        progress = not verbose and _is_tty()
        write_samples(
            flows, release.codec, n, out, seed=seed, progress=progress, schema=release.schema, where=conditions
        )
        _record(model, store, out, release.schema, mlflow_loaded=generator is not None)
        given, cost = "", ""
        if conditions is not None:
            from privflow.serving.conditions import percent

            tally = conditions.tally
            asked = conditions.describe()
            given = f" where {asked}" if asked else ""
            met = "met the conditions" if asked else "met the schema's rules"
            cost = f"; {tally.drawn:,} rows drawn from the model to find them ({percent(tally.share)} {met})"
            rules_note = tally.rules_note()
            cost += f"; {rules_note}" if rules_note else ""
        Console().print(f"wrote {n} rows{given} to {out}{replaced}{cost}", highlight=False, soft_wrap=True)
        return
    import pandas as pd
    import polars as pl

    assert generator is not None, "no privflow release in the store: MLflow loaded the model"
    frame = generator.predict(pd.DataFrame({"n": [n], **({"seed": [seed]} if seed is not None else {})}))
    table = pl.from_pandas(frame)
    if schema is not None:
        from privflow.data.codec import restore_types

        table = restore_types(table, schema)
    from privflow.data.io import write_table

    write_table(table, out)
    if schema is not None:  # a foreign model without a schema: its rows cannot be read as a run reads them
        _record(model, store, out, schema, mlflow_loaded=True)
    Console().print(f"wrote {table.height} rows to {out}{replaced}", highlight=False, soft_wrap=True)


def _record(model: str, store: Path, out: Path, schema: Any, mlflow_loaded: bool) -> None:
    """The written table's keyed row digests in the store's ledger, with the version that sampled
    it (`privflow.tasks.warm_start.record_generated_table`, read back as a run reads it): a
    pretraining on these rows is linked to that version's lineage, never declared public (privacy
    rule 9). Nothing where the store has no ledger: no run of it was charged."""
    if not (Path(store) / "ledger.db").is_file():
        return
    from privflow.tasks.warm_start import record_generated_table

    version = _version(model, store, mlflow_loaded)
    if version is not None:
        record_generated_table(Path(store).resolve(), *version, out, schema)


def _version(model: str, store: Path, mlflow_loaded: bool) -> tuple[str, str] | None:
    """(name, version) of NAME@ALIAS or NAME/VERSION: from the store's registry file where the
    release was read from it, else through MLflow (already loaded then)."""
    if not mlflow_loaded:
        from privflow.serving.local_store import local_version

        return local_version(model, store)
    from privflow.tasks.mlflow_store import resolve_version

    name, version, _ = resolve_version(model)
    return name, version


def _load_with_mlflow(model: str, store: Path, verbose: bool) -> Any:
    """The registered pyfunc loaded by MLflow (`privflow.tasks.mlflow_store.load_generator`)."""
    import mlflow  # noqa: F401 - imported here so its event messages can be switched off

    from privflow.core import env
    from privflow.tasks.mlflow_store import load_generator

    env.quiet_imported(verbose)
    return load_generator(model, store)


def _conditions(release: Release | None, wanted: Any) -> Any:
    """`--where`'s conditions checked against the released model's public schema, with the
    schema's rules that every row meets (None without either); a foreign model, sampled only
    through predict, cannot be conditioned."""
    if wanted and release is None:
        from privflow.core.errors import ConfigError

        raise ConfigError(
            "--where needs a privflow model (its flows and public schema); this one can only be asked for rows "
            "through MLflow's predict. Sample without --where and filter the table."
        )
    if release is None:
        return None
    from privflow.serving.conditions import conditions_for, with_rules

    return with_rules(conditions_for(release.schema, wanted) if wanted else None, release.schema)


def _is_tty() -> bool:
    return sys.stderr.isatty()


def _generator_release(generator: Any) -> Release | None:
    """The release a loaded privflow pyfunc (`FlowSampler`) holds, or None for a foreign model,
    which is then asked for its rows through predict."""
    from privflow.serving.release import Release

    try:
        release = getattr(generator.unwrap_python_model(), "release", None)
    except Exception:  # noqa: BLE001
        return None
    return release if isinstance(release, Release) and release.flows else None


def _generator_schema(generator: Any) -> Any:
    """The public schema inside a loaded pyfunc sampler, when it exposes one."""
    try:
        return getattr(generator.unwrap_python_model(), "schema", None)
    except Exception:  # noqa: BLE001 - an older or foreign model: write what it returned
        return None
