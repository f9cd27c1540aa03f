"""A PostgreSQL table or query as the private table (`--data postgresql://...`).

The URI (also `postgres://`)::

    postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE?table=[SCHEMA.]NAME
    postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE?query=SELECT ...

`table` is taken as written (case-sensitive, quoted as an identifier; `SCHEMA.NAME` for another
schema). `query` must be the last parameter: it takes the rest of the URI, percent-decoded (write
`%` as `%25`; `&` and `#` need no escaping there). Other parameters (`sslmode`, `connect_timeout`,
...) go to libpq. The password is better left to libpq's `PGPASSWORD` or `~/.pgpass`; one in
the URI is masked in every message (core/source_uri.py), never printed or logged.

Reading is total (privacy rule 8), like a Parquet file's: every column is selected as its text
(`convert_to(col::text, 'UTF8')`, a conversion that no stored value fails; in a `SQL_ASCII`
database, which keeps any bytes, the bytes as stored) as bytes, so that a value that is not
UTF-8, holds a NUL, or a row with more text than the public line
cap is a failing row of its own (`privflow.data.io.parquet_frame`), never a refused query; the
types are then the validation's to coerce, as for CSV. The session is read-only
(`default_transaction_read_only`). What is public, the connection and the column names (a
`LIMIT 0` query), is checked in pre-flight (`read_header`), before anything is spent: each
refusal is a DataError naming the host and database, never the password. A `query` must not
fail on a row (`1/x`, a cast of a text column): its own failure refuses the read.

The driver is ADBC's (`adbc-driver-postgresql`, the `postgres` extra), through polars'
`read_database_uri`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import polars as pl

from privflow.core.errors import DataError
from privflow.core.source_uri import MASK, SourceURI, is_database_uri, mask_uri, normal_uri

CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout unless the URI sets one: an unreachable host fails, not hangs
_READ_ONLY = "-c default_transaction_read_only=on"
_ALIAS = "_privflow_source"
# each value's text as UTF-8 bytes; in a SQL_ASCII database (which keeps any bytes) the bytes as stored:
# a conversion would fail the whole query on one value that is not UTF-8
_TO = "CASE WHEN current_setting('server_encoding') = 'SQL_ASCII' THEN 'SQL_ASCII' ELSE 'UTF8' END"
_INSTALL = "pip install 'privflow[postgres]' (the ADBC PostgreSQL driver, adbc-driver-postgresql)"


def quote_ident(name: str) -> str:
    """A PostgreSQL identifier, double-quoted (taken exactly as written)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class PostgresSource:
    """A parsed `postgresql://` source. `shown` is the URI with its password masked."""

    shown: str
    user: str | None
    password: str | None
    host: str
    port: int | None
    database: str
    table: str | None
    query: str | None
    params: tuple[tuple[str, str], ...]

    @property
    def where(self) -> str:
        """Host, port and database (what a message names; never the password)."""
        host = self.host or "the local socket"
        user = f" as user '{self.user}'" if self.user else ""
        return f"database '{self.database}' at {host}{f':{self.port}' if self.port else ''}{user}"

    def describe(self) -> str:
        what = f"table '{self.table}'" if self.table is not None else "query"
        return f"PostgreSQL {what} in {self.where}"

    def relation(self) -> str:
        """What the reads select from."""
        if self.table is not None:
            return ".".join(quote_ident(part) for part in self.table.split(".", 1))
        assert self.query is not None
        return f"({self.query.strip().rstrip(';')}) AS {_ALIAS}"

    def connection(self) -> str:
        """The URI the driver gets (with the password): our parameters out, a connect timeout and a
        read-only session in."""
        auth = ""
        if self.user is not None:
            auth = quote(self.user, safe="")
            if self.password is not None:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        params = dict(self.params)
        params.setdefault("connect_timeout", str(CONNECT_TIMEOUT_S))
        params["options"] = (params.get("options", "") + " " + _READ_ONLY).strip()
        query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())
        port = f":{self.port}" if self.port else ""
        return f"postgresql://{auth}{host}{port}/{quote(self.database, safe='')}?{query}"

    def scrub(self, text: str) -> str:
        """`text` (a driver's message) without the password, in any spelling."""
        text = mask_uri(text)
        if self.password:
            for form in {self.password, quote(self.password, safe=""), quote(self.password)}:
                text = text.replace(form, MASK)
        return text


def _fail(shown: str, why: str) -> DataError:
    return DataError(
        f"Data source '{shown}' is not a PostgreSQL source privflow reads: {why}. Write it as "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE?table=NAME (or ?query=SELECT ..., as the last "
        "parameter); the password is better kept in PGPASSWORD or ~/.pgpass."
    )


def parse_source(data: str | os.PathLike[str]) -> PostgresSource:
    """The source a `postgresql://` (or `postgres://`) URI names; DataError (password masked) when
    the URI lacks the database or names neither or both of `table` and `query`."""
    full = data.uri if isinstance(data, SourceURI) else normal_uri(os.fspath(data))
    shown = mask_uri(full)
    if not is_database_uri(full):
        raise _fail(shown, "the scheme must be postgresql:// or postgres://")
    head, _, rest = full.partition("?")
    try:
        parts = urlsplit(head)
        port = parts.port
    except ValueError as exc:
        raise _fail(shown, f"its host or port does not parse ({mask_uri(str(exc))})") from None
    params: list[tuple[str, str]] = []
    table = query = password = None
    while rest:
        if rest.startswith("query="):
            query, rest = unquote(rest[len("query=") :]), ""
            break
        piece, _, rest = rest.partition("&")
        if not piece:
            continue
        key, _, value = piece.partition("=")
        key, value = unquote(key), unquote(value)
        if key == "table":
            if table is not None:
                raise _fail(shown, "it names more than one table")
            table = value
        elif key == "password":
            password = value
        else:
            params.append((key, value))
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise _fail(shown, "it names no database (the path after the host)")
    if (table is None) == (query is None):
        raise _fail(shown, "it must name exactly one of table=NAME and query=SELECT ...")
    if table is not None and (not table.strip() or table.count(".") > 1):
        raise _fail(shown, f"the table name '{table}' is not NAME or SCHEMA.NAME")
    if query is not None and not query.strip():
        raise _fail(shown, "its query is empty")
    if parts.password is not None:
        password = unquote(parts.password)
    user = unquote(parts.username) if parts.username is not None else None
    host = parts.hostname or ""
    return PostgresSource(shown, user, password, host, port, database, table, query, tuple(params))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _connect(src: PostgresSource) -> Any:
    try:
        import adbc_driver_postgresql.dbapi as dbapi
    except ImportError:
        raise DataError(f"Data source '{src.shown}' is a PostgreSQL database; reading one needs {_INSTALL}.") from None
    try:
        return dbapi.connect(src.connection())
    except Exception as exc:
        raise DataError(
            f"Data source '{src.shown}': cannot connect to PostgreSQL {src.where} "
            f"({src.scrub(_first_line(exc))}). Check the host, port, database, user and password (PGPASSWORD or "
            "~/.pgpass), and that the server accepts connections from this machine."
        ) from None


def _refused(src: PostgresSource, exc: BaseException, doing: str) -> DataError:
    what = f"table '{src.table}'" if src.table is not None else "query"
    hint = "that the table exists and that the user may read it"
    if src.query is not None:
        hint = "that the query is one SELECT that runs on its own and that the user may read what it reads"
    return DataError(
        f"Data source '{src.shown}': {doing} the {what} in PostgreSQL {src.where} failed "
        f"({src.scrub(_first_line(exc))}). Check {hint}."
    )


def database_header(src: PostgresSource) -> list[str]:
    """The column names of the table or query (a `LIMIT 0` query: no row is read). Connection
    and query failures are DataErrors naming host and database."""
    con = _connect(src)
    try:
        cur = con.cursor()
        try:
            cur.execute(f"SELECT * FROM {src.relation()} LIMIT 0")
            names = [str(d[0]) for d in cur.description or ()]
        except Exception as exc:
            raise _refused(src, exc, "reading the column names of") from None
        finally:
            cur.close()
    finally:
        con.close()
    return names


def database_rows(src: PostgresSource) -> int:
    """`count(*)` of the table or query: for PUBLIC tables only (pretraining), as `count_rows`."""
    con = _connect(src)
    try:
        cur = con.cursor()
        try:
            cur.execute(f"SELECT count(*) FROM {src.relation()}")
            row = cur.fetchone()
        except Exception as exc:
            raise _refused(src, exc, "counting the rows of") from None
        finally:
            cur.close()
    finally:
        con.close()
    return int(row[0]) if row else 0


def _nul_rows(table: Any) -> dict[int, str]:
    """Rows holding a NUL in some value (of the bytes columns), with the first such column."""
    import numpy as np
    import pyarrow.compute as pc

    out: dict[int, str] = {}
    for name in table.column_names:
        hit = pc.match_substring(table.column(name), pattern="\x00").fill_null(False)
        for r in np.flatnonzero(hit.to_numpy(zero_copy_only=False)).tolist():
            out.setdefault(int(r), f"row {int(r) + 1:,} holds a NUL in column '{name}'")
    return out


def read_database(src: PostgresSource, header: list[str], cap: int) -> pl.DataFrame:
    """Every row of the table or query, each column as its text (empty strings not yet nulls),
    totally: a value that is not UTF-8 or holds a NUL, or a row with more than `cap` bytes of
    text, is a row of nulls with its reason in `UNREADABLE` (`privflow.data.io.parquet_frame`)."""
    import pyarrow as pa

    from privflow.data.io import UNREADABLE, capped_rows, parquet_frame

    columns = ", ".join(f"convert_to({quote_ident(c)}::text, {_TO}) AS {quote_ident(c)}" for c in header)
    try:
        import adbc_driver_postgresql  # noqa: F401
    except ImportError:
        raise DataError(f"Data source '{src.shown}' is a PostgreSQL database; reading one needs {_INSTALL}.") from None
    try:
        raw = pl.read_database_uri(f"SELECT {columns} FROM {src.relation()}", src.connection(), engine="adbc")
    except Exception as exc:
        raise _refused(src, exc, "reading the rows of") from None
    arrow = raw.to_arrow()
    binary = pa.table({name: arrow.column(name).combine_chunks().cast(pa.large_binary()) for name in header})
    nul = _nul_rows(binary)
    text = pa.table({name: binary.column(name).combine_chunks().view(pa.large_string()) for name in header})
    df = parquet_frame(text, cap)
    if nul:
        why = df.get_column(UNREADABLE).to_list() if UNREADABLE in df.columns else [None] * df.height
        for r, reason in nul.items():
            why[r] = why[r] or reason
        df = capped_rows(df.drop(UNREADABLE, strict=False), cap, 0, {r: w for r, w in enumerate(why) if w})
    return df


__all__ = [
    "CONNECT_TIMEOUT_S",
    "PostgresSource",
    "database_header",
    "database_rows",
    "parse_source",
    "quote_ident",
    "read_database",
]
