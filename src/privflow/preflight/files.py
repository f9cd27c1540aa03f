"""The input and output files, from their names, headers and formats: no row value is read (the
row count of a PUBLIC pretraining table aside)."""

from __future__ import annotations

from pathlib import Path

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError, DataError
from privflow.core.machine import existing_ancestor, refuses_new_files
from privflow.data.schema import Column, Schema


def _type_fits(col: Column, dtype: object) -> bool:
    """Whether a Parquet column's physical dtype can hold the schema's type (values not read)."""
    import polars as pl

    from privflow.data.validation.coerce import numeric_dtype  # the rule validation reads such a column by

    if col.type == "ignore" or dtype == pl.Null:  # an ignored column's values are never read
        return True
    if col.type in ("numeric", "integer"):
        return numeric_dtype(dtype)  # type: ignore[arg-type]
    if dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum | pl.Categorical):
        return True  # text: category labels, boolean labels, dates in the column's format
    if col.type in ("date", "datetime"):  # or a Parquet date / timestamp
        return dtype == pl.Date or isinstance(dtype, pl.Datetime)
    if col.type == "boolean" and dtype == pl.Boolean:
        return True
    if numeric_dtype(dtype):  # type: ignore[arg-type]
        # integer-coded categories ("0", "1", ...) can be stored as numbers
        def numeric(label: str) -> bool:
            try:
                float(label)
            except ValueError:
                return label.lower() in ("true", "false") and dtype == pl.Boolean
            return True

        return all(numeric(c) for c in (col.true_false if col.type == "boolean" else col.categories or ()))
    return False


SELECTION_NEEDS = (
    "so that the checkpoint-selection split gets validation rows: its share is select.validation_fraction, "
    "lowered to select.max_validation_rows over the schema's expected_rows on a large table, so an "
    "expected_rows far above the real row count also raises it"
)


def check_table(path: str | Path, schema: Schema, what: str = "Data file") -> str:
    """The file's format and header (and dtypes, for Parquet) fit the schema. Returns the format's
    description. No row is read or counted: how many rows there are and what they hold are the
    validation gate's DP decisions (privacy rule 8). A folder of Parquet files: their columns agree
    and fit; a database URI (privflow/data/sources.py): the connection and the column names (a
    `LIMIT 0` query), named in messages with the password masked."""
    from privflow.core.source_uri import SourceURI, is_database_uri
    from privflow.data.io import DELIMITER_NAMES, read_header

    label = what  # what the messages below call it
    if is_database_uri(path):
        path, label = SourceURI(path), what.replace("file", "table")  # its text masks the password
    elif Path(path).is_dir():
        label = what.replace("file", "folder")
    try:
        fmt, header, dtypes = read_header(path)
    except DataError as exc:
        if what != "Data file":
            raise DataError(str(exc).replace("Data file", what, 1).replace("Data path", what, 1)) from None
        raise
    declared = schema.names
    missing = [c for c in declared if c not in header]
    undeclared = [c for c in header if c not in declared]
    if missing or undeclared:
        parts = []
        if missing:
            parts.append(f"the schema's column(s) {missing} are missing from it")
        if undeclared:
            parts.append(
                f"it has column(s) {undeclared[:10]}{' ...' if len(undeclared) > 10 else ''} that the "
                "schema does not declare"
            )
        hint = ""
        lower = {c.lower(): c for c in header}
        near = [f"'{lower[c.lower()]}' for '{c}'" for c in missing if c.lower() in lower]
        if near:
            hint += f" Column names are case-sensitive: the file has {', '.join(near)}."
        padded = {c.strip(): c for c in header if c != c.strip()}
        spaced = [f"'{padded[c]}' for '{c}'" for c in missing if c in padded]
        if spaced:
            more = f" and {len(spaced) - 3} more" if len(spaced) > 3 else ""
            hint += (
                f" Column names keep their spaces: the file has {', '.join(spaced[:3])}{more}; remove the spaces "
                "around the names (or after the delimiters) in its header."
            )
        if fmt.kind == "csv" and len(header) == 1:
            others = [DELIMITER_NAMES[d] for d in DELIMITER_NAMES if d in header[0]]
            hint += f" The whole header was read as one column ({fmt.describe()})" + (
                f"; it contains {', '.join(others)} characters: is that the delimiter?" if others else "."
            )
        elif fmt.kind == "csv":
            hint += f" (Read as {fmt.describe()}.)"
        raise DataError(
            f"{label} '{path}' does not match the schema '{schema.dataset.name}': {'; and '.join(parts)}. "
            "Every declared column must be present and no other column may be; fix the file's header or the "
            f"schema.{hint}"
        )
    if dtypes is not None:
        wrong = [
            f"'{c.name}' is stored as {dtypes[c.name]} but declared {c.type}"
            for c in schema.columns
            if not _type_fits(c, dtypes[c.name])
        ]
        if wrong:
            raise DataError(
                f"{label} '{path}' is Parquet with column types that cannot hold the schema's: {'; '.join(wrong)}. "
                "Write those columns with a numeric type for numeric/integer fields, a string (or "
                "categorical) type for categorical fields, a string, date or timestamp type for date/datetime "
                "fields, and a boolean or string type for boolean fields."
            )
    return fmt.describe()


def public_rows(path: str | Path, least: int) -> int:
    """A public table's row count, refused below `least` (pretraining: the file is declared public,
    so its size may decide a refusal)."""
    from privflow.data.io import count_rows

    rows = count_rows(path)
    if rows < least:
        raise DataError(
            f"Public data file '{path}' has {rows} data row(s); pretraining needs at least {least} (a public minimum, "
            f"{SELECTION_NEEDS}). Use a larger table."
        )
    return rows


def check_stream(config: RunConfig, schema: Schema) -> bool:
    """Whether the run reads its table in chunks (privflow/data/chunked.py), and that it can: an
    uncompressed Parquet input and one worker."""
    from privflow.data.chunked import streamed
    from privflow.data.io import sniff

    if not streamed(config, schema):
        return False
    fmt = sniff(config.data)
    if fmt.kind != "parquet" or fmt.compression is not None:
        convert = (
            f"Decompress it (e.g. `gunzip -k {config.data}`; Parquet compresses its own columns)"
            if fmt.kind == "parquet"
            else "Export it to Parquet (e.g. polars: read_database_uri(...).write_parquet(...))"
            if fmt.kind == "postgresql"
            else "Convert it (e.g. polars: scan_csv(...).sink_parquet(...))"
        )
        what = "Data table" if fmt.kind == "postgresql" else "Data file"
        raise DataError(
            f"{what} '{config.data}' is {fmt.describe()}; a streamed run (stream.enabled / --stream) reads an "
            f"uncompressed Parquet file a chunk at a time. {convert}, or run without --stream to read it whole."
        )
    if config.train.workers > 1:
        raise ConfigError(
            f"A streamed run trains in one process (--workers {config.train.workers} would have every worker "
            "read the table). Use --workers 1 with --stream, or read the table whole."
        )
    return True


def check_output(out: Path) -> None:
    """An output table's name and place, before any model is loaded or rows are read: a .csv or
    .parquet name, not a folder, in a folder that takes a new file or can be created there
    (a test file is made and removed; nothing else is created)."""
    from privflow.data.io import TABLE_SUFFIXES

    out = Path(out)
    if out.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"Output '{out}' must end in .csv or .parquet.")
    if out.is_dir():
        raise ConfigError(f"Output '{out}' is a folder; pass a file name ending in .csv or .parquet.")
    folder = existing_ancestor(out.parent)
    if not folder.is_dir():
        raise ConfigError(f"Output '{out}' cannot be written: '{folder}' is a file, not a folder.")
    refused = refuses_new_files(folder)
    if refused:
        raise ConfigError(
            f"Output '{out}' cannot be written: the folder '{folder}' does not take new files ({refused}). "
            "Pass -o a path in a folder you can write to."
        )


__all__ = ["SELECTION_NEEDS", "check_output", "check_stream", "check_table", "public_rows"]
