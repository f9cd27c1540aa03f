"""A database named as `--data` by a URI (`postgresql://user:password@host:port/db?table=NAME`).

`SourceURI` is how the configuration carries such a source: its text is the URI with the
password masked, so every message, log line, MLflow param or Prefect parameter that shows the
source shows no secret; only the reader (privflow/data/sources.py) takes the URI itself, from
`.uri`. It lives in core because the configuration (core/config.py) keeps it; parsing the URI
and reading the database are the data layer's.

pathlib collapses `//` to `/`, so a URI that went through a `Path` (the CLI's `--data` option)
comes back as `postgresql:/user@host/...`: it is still recognised, and its `//` restored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

SCHEMES = ("postgresql", "postgres")
MASK = "***"
_DATABASE = re.compile(r"(?i)^(postgres(?:ql)?):/+")
# in any text (an error message from a driver): user:PASSWORD@ after a scheme, and password=...
_USERINFO = re.compile(r"(?i)(postgres(?:ql)?:/+[^/@\s:?]*:)([^\s/?]*)@")
_PARAM = re.compile(r"(?i)(\bpassword\s*=\s*)('[^']*'|[^&\s)]*)")


def _text(data: object) -> str | None:
    if isinstance(data, SourceURI):
        return data.uri
    if isinstance(data, (str, os.PathLike)):
        text = os.fspath(data)
        return text if isinstance(text, str) else None
    return None


def is_database_uri(data: object) -> bool:
    """Whether `data` (a str, a Path or a SourceURI) names a database rather than a file."""
    text = _text(data)
    return text is not None and _DATABASE.match(text) is not None


def normal_uri(text: str) -> str:
    """The URI with the `//` after its scheme that pathlib takes away (`postgresql:/h/db`)."""
    m = _DATABASE.match(text)
    if m is None:
        return text
    return f"{m.group(1)}://{text[m.end() :]}"


def mask_uri(text: str) -> str:
    """`text` with the password of every PostgreSQL URI in it (user:PASSWORD@, or a password=
    parameter) replaced by `***`. The URI's own userinfo runs to its last '@' before the path."""
    m = _DATABASE.match(text)
    if m is not None:  # the URI itself: its netloc ends at the first '/' or '?' after the scheme
        rest = text[m.end() :]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        netloc, tail = rest[:cut], rest[cut:]
        user, at, hostport = netloc.rpartition("@")
        if at and ":" in user:
            netloc = f"{user.split(':', 1)[0]}:{MASK}@{hostport}"
        text = f"{m.group(1)}://{netloc}{tail}"
        start = m.end() + len(netloc) + 1
        return text[:start] + _PARAM.sub(lambda p: p.group(1) + MASK, text[start:])
    return _PARAM.sub(lambda p: p.group(1) + MASK, _USERINFO.sub(lambda u: u.group(1) + MASK + "@", text))


class SourceURI(str):
    """A database source: the text is the URI with its password masked (what any print, log or
    serialisation shows); `.uri` is the URI itself, for the reader only."""

    uri: str

    def __new__(cls, uri: str | os.PathLike[str]) -> SourceURI:
        full = uri.uri if isinstance(uri, SourceURI) else normal_uri(os.fspath(uri))
        obj = super().__new__(cls, mask_uri(full))
        obj.uri = full
        return obj

    def __repr__(self) -> str:
        return f"SourceURI({str.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceURI, (self.uri,))


def as_data_source(data: str | os.PathLike[str]) -> Path | SourceURI:
    """`--data` as the configuration keeps it: a SourceURI for a database URI, else a Path."""
    if isinstance(data, SourceURI):
        return data
    if is_database_uri(data):
        return SourceURI(data)
    return Path(data)


__all__ = ["MASK", "SCHEMES", "SourceURI", "as_data_source", "is_database_uri", "mask_uri", "normal_uri"]
