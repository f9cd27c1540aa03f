"""Reading the user's YAML files (schema, run config): every way one can be unreadable becomes
one user-facing error naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_mapping(path: str | Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The mapping a YAML file holds (an empty file: {}), or `error` naming `what` and the file:
    unreadable, not UTF-8, not YAML, nested past the parser's depth, or not a mapping."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} '{p}' cannot be read as UTF-8 text ({exc}).") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{what} '{p}' is not valid YAML: {exc}") from None
    except RecursionError:
        raise error(
            f"{what} '{p}' nests its values too deeply to read; it cannot be a privflow {what.lower()}."
        ) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise error(f"{what} '{p}' must hold a mapping of settings, not a {type(doc).__name__}.")
    return doc


__all__ = ["read_mapping"]
