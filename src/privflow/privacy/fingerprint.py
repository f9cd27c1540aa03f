"""Data fingerprints as keyed HMACs (docs/privacy.md, privacy rule 5).

An unsalted hash of a private file is a release: anyone who knows every row but one can
hash each guess for the last row and compare. The ledger needs only to tell "same file as
before" from "different file", so it stores HMAC-SHA256(key, file bytes) with a random
per-store key that never leaves the store (created 0600 on first use). The fingerprint is
kept in the ledger for the curator; it is not logged to MLflow or printed in the
publishable ledger summary.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from privflow.core.errors import DataError

KEY_FILE = "fingerprint.key"


def store_key(store: Path) -> bytes:
    """The store's secret fingerprint key, created from the OS CSPRNG on first use."""
    path = store / "secret" / KEY_FILE
    if path.is_file():
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def keyed_fingerprint(path: str | Path, key: bytes) -> str:
    """HMAC-SHA256 (hex) of the file's bytes under `key`."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Data file '{p}' does not exist, so it cannot be fingerprinted.")
    mac = hmac.new(key, digestmod=hashlib.sha256)
    with p.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            mac.update(chunk)
    return "hmac-sha256:" + mac.hexdigest()


__all__ = ["keyed_fingerprint", "store_key"]
