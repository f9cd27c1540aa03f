"""privflow.data.sources and core/source_uri.py: a PostgreSQL URI as --data, parsed and masked
(no server: the one connection tried goes to a closed loopback port)."""

from __future__ import annotations

import copy
import json
import pickle
import socket
from pathlib import Path

import pytest

from privflow.core.config import RunConfig
from privflow.core.errors import DataError
from privflow.core.source_uri import SourceURI, as_data_source, is_database_uri, mask_uri
from privflow.data.io import read_header, sniff
from privflow.data.sources import parse_source

SECRET = "s3cr&t@pw"
ENCODED = "s3cr%26t%40pw"


def test_a_table_uri_is_parsed() -> None:
    src = parse_source(f"postgresql://alice:{ENCODED}@db.example:6543/sales?sslmode=require&table=public.People")
    assert (src.user, src.password, src.host, src.port, src.database) == ("alice", SECRET, "db.example", 6543, "sales")
    assert (src.table, src.query, src.params) == ("public.People", None, (("sslmode", "require"),))
    assert src.relation() == '"public"."People"'
    assert src.describe() == "PostgreSQL table 'public.People' in database 'sales' at db.example:6543 as user 'alice'"
    assert src.shown == "postgresql://alice:***@db.example:6543/sales?sslmode=require&table=public.People"
    conn = src.connection()
    assert conn.startswith(f"postgresql://alice:{ENCODED}@db.example:6543/sales?sslmode=require&connect_timeout=10&")
    assert "options=-c%20default_transaction_read_only%3Don" in conn and "table=" not in conn


def test_a_query_takes_the_rest_of_the_uri() -> None:
    src = parse_source("postgres://bob@h/db?query=SELECT a, b FROM t WHERE c = 'x&y#z' AND d LIKE 'q%25';")
    assert (src.user, src.password, src.port, src.table) == ("bob", None, None, None)
    assert src.query == "SELECT a, b FROM t WHERE c = 'x&y#z' AND d LIKE 'q%';"
    assert src.relation() == "(SELECT a, b FROM t WHERE c = 'x&y#z' AND d LIKE 'q%') AS _privflow_source"
    assert parse_source("postgresql://h/db?table=we%22ird").relation() == '"we""ird"'


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("postgresql://u:{pw}@h:5432/?table=t", "names no database"),
        ("postgresql://u:{pw}@h:5432/db", "exactly one of table=NAME and query"),
        ("postgresql://u:{pw}@h:5432/db?table=t&query=SELECT 1", "exactly one of table=NAME and query"),
        ("postgresql://u:{pw}@h:5432/db?table=a&table=b", "more than one table"),
        ("postgresql://u:{pw}@h:99999/db?table=t", "host or port does not parse"),
        ("postgresql://u:{pw}@h/db?table=a.b.c", "not NAME or SCHEMA.NAME"),
        ("postgresql://u:{pw}@h/db?query=", "query is empty"),
    ],
)
def test_a_malformed_uri_is_one_paragraph_without_the_password(uri: str, why: str) -> None:
    with pytest.raises(DataError, match=why) as err:
        parse_source(uri.format(pw=ENCODED))
    text = str(err.value)
    assert "\n" not in text and ENCODED not in text and SECRET not in text and "u:***@h" in text


def test_masking_covers_every_spelling() -> None:
    assert mask_uri(f"postgresql://u:{ENCODED}@h/db?table=t") == "postgresql://u:***@h/db?table=t"
    assert mask_uri("postgres://u:p@ss@h/db?table=t") == "postgres://u:***@h/db?table=t"  # to the last '@'
    assert mask_uri("postgresql://h/db?password=pw&table=t") == "postgresql://h/db?password=***&table=t"
    assert mask_uri("postgresql://u@h/db?table=t") == "postgresql://u@h/db?table=t"
    said = "could not connect to postgresql://u:pw@h/db (password=pw)"
    assert mask_uri(said) == "could not connect to postgresql://u:***@h/db (password=***)"
    src = parse_source(f"postgresql://u:{ENCODED}@h/db?table=t")
    assert src.scrub(f"FATAL: auth failed for {SECRET} / {ENCODED}") == "FATAL: auth failed for *** / ***"


def test_the_config_keeps_a_uri_whose_text_masks_the_password() -> None:
    uri = f"postgresql://u:{ENCODED}@h:5432/db?table=t"
    for given in (uri, Path(uri)):  # a Path (the CLI's option type) takes a '/' out: it is put back
        cfg = RunConfig.build(data=given, schema_path="s.yaml")
        assert isinstance(cfg.data, SourceURI) and cfg.data.uri == uri
        shown = "postgresql://u:***@h:5432/db?table=t"
        assert str(cfg.data) == f"{cfg.data}" == f"{cfg.data!s:>1}" == shown and ENCODED not in repr(cfg)
        assert cfg.model_dump(mode="json")["data"] == shown and ENCODED not in cfg.model_dump_json()
        assert json.dumps(cfg.model_dump(mode="json")).count("***") == 1
        for copied in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), RunConfig.build(**cfg.model_dump())):
            assert copied.data.uri == uri
    assert RunConfig.build(data="t.csv", schema_path="s.yaml").data == Path("t.csv")
    assert as_data_source("postgres:/h/db?table=t").uri == "postgres://h/db?table=t"
    assert not is_database_uri(Path("postgresql.csv")) and is_database_uri("PostgreSQL://h/db?table=t")


def test_sniff_does_not_connect_and_streaming_is_refused() -> None:
    from privflow.data.chunked import streamed
    from privflow.data.schema import Schema
    from privflow.preflight import check_stream

    uri = "postgresql://u:pw@192.0.2.1:5432/db?table=t"  # TEST-NET: never reached
    assert sniff(uri).describe() == "PostgreSQL table 't' in database 'db' at 192.0.2.1:5432 as user 'u'"
    demo = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"
    schema = Schema.from_yaml(demo / "adult.yaml")
    cfg = RunConfig.build(data=uri, schema_path="s.yaml")
    assert not streamed(cfg, schema) and not check_stream(cfg, schema)
    on = RunConfig.build(data=uri, schema_path="s.yaml", stream={"enabled": True})
    with pytest.raises(DataError, match="a streamed run .* reads an uncompressed Parquet file") as err:
        check_stream(on, schema)
    assert "Export it to Parquet" in str(err.value) and ":pw@" not in str(err.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_connection_failure_is_a_data_error_naming_host_and_database() -> None:
    pytest.importorskip("adbc_driver_postgresql")
    from privflow.data.schema import Schema
    from privflow.preflight import check_table

    port = _closed_port()
    uri = f"postgresql://u:{ENCODED}@127.0.0.1:{port}/sales?table=t"
    with pytest.raises(DataError, match=f"cannot connect to PostgreSQL database 'sales' at 127.0.0.1:{port}") as err:
        read_header(uri)
    assert ENCODED not in str(err.value) and SECRET not in str(err.value)
    demo = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"
    with pytest.raises(DataError, match="cannot connect") as err:
        check_table(Path(uri), Schema.from_yaml(demo / "adult.yaml"))
    assert ENCODED not in str(err.value) and "u:***@127.0.0.1" in str(err.value)
