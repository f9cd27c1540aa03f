"""A registered privflow release read straight from a local store, without importing MLflow.

`privflow generate` on a store of its own (MLflow's SQLite registry under ``--store``, artifacts
as files beside it) needs three facts from the registry: which version NAME@ALIAS (or
NAME/VERSION) is, where that version's files are, and that they are a privflow sampler. Those
are read here with the standard library (sqlite3, read-only) and the release is loaded from
its files by `privflow.serving.release.load_release`, the one loader of a release (MLflow's
pyfunc and `tasks/mlflow_store.load_version` run it too): the same `Release`, schema, codec and
weights, so the same rows for a seed. Importing and starting MLflow
costs seconds of a command that samples a thousand rows in milliseconds.

Anything outside that plain case returns None, and the caller loads the model through MLflow
as before (its errors, messages and rules included): an operator's tracking server
(MLFLOW_TRACKING_URI) or workspace, a reference that is malformed or not found, a version that
is deleted or not READY, artifacts that are not local files, a model that is not privflow's
"models from code" sampler, or a registry database laid out other than MLflow 3's.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from privflow.core import env

if TYPE_CHECKING:
    from privflow.serving.release import Release

_DELETED = "Deleted_Internal"  # MLflow's stage of a soft-deleted model version
_WORKSPACE = "default"  # MLflow's workspace when none is configured


def load_local(spec: str, store: Path) -> Release | None:
    """The release (`privflow.serving.release.Release`) of NAME@ALIAS or NAME/VERSION in the
    store's own registry, or None where MLflow must load it (module docstring)."""
    files = local_artifacts(spec, store)
    if files is None:
        return None
    from privflow.serving.release import load_release

    return load_release(files)


def local_artifacts(spec: str, store: Path) -> dict[str, Path] | None:
    """The version's artifact files ({"meta": ..., "checkpoint_0": ..., ...}), or None (module
    docstring). Reads the registry only; loads nothing."""
    if env.operator_tracking_uri() is not None or os.environ.get("MLFLOW_WORKSPACE"):
        return None
    ref = _reference(spec)
    db = Path(store) / "mlflow.db"
    if ref is None or not db.is_file():
        return None
    try:
        location = _storage_location(db, *ref)
    except sqlite3.Error:  # another schema, a locked or damaged file: MLflow's load says what
        return None
    root = _local_path(location) if location else None
    return None if root is None else _sampler_files(root)


def local_version(spec: str, store: Path) -> tuple[str, str] | None:
    """(name, version number) of NAME@ALIAS or NAME/VERSION in the store's own registry file,
    or None where it is not there as one live, READY version (`_storage_location`'s rule)."""
    ref = _reference(spec)
    db = Path(store) / "mlflow.db"
    if ref is None or not db.is_file():
        return None
    name, key, by_alias = ref
    try:
        if by_alias:
            with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as con:
                columns = {r[1] for r in con.execute("PRAGMA table_info(registered_model_aliases)")}
                where, args = ("", [name, key])
                if "workspace" in columns:
                    where, args = " AND workspace = ?", [name, key, _WORKSPACE]
                row = con.execute(
                    f"SELECT version FROM registered_model_aliases WHERE name = ? AND alias = ?{where}", args
                ).fetchone()
            con.close()
            if row is None:
                return None
            key = str(row[0])
        return (name, key) if _storage_location(db, name, key, False) is not None else None
    except sqlite3.Error:
        return None


def _reference(spec: str) -> tuple[str, str, bool] | None:
    """(name, alias or version, by alias) of a well-formed reference (`mlflow_store.model_uri`'s
    forms), else None."""
    if "@" in spec:
        name, alias = spec.split("@", 1)
        return (name, alias, True) if name and alias else None
    if "/" in spec:
        name, version = spec.rsplit("/", 1)
        return (name, version, False) if name and version.isdigit() else None
    return None


def _storage_location(db: Path, name: str, key: str, by_alias: bool) -> str | None:
    """The storage location of the one live, READY version the reference names (None when there
    is not exactly one)."""
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as con:
        columns = {row[1] for row in con.execute("PRAGMA table_info(model_versions)")}
        where, args = "", [name]
        if "workspace" in columns:
            where, args = " AND v.workspace = ?", [name, _WORKSPACE]
        if by_alias:
            alias_where = " AND a.workspace = v.workspace" if "workspace" in columns else ""
            sql = (
                "SELECT v.storage_location, v.status, v.current_stage FROM registered_model_aliases a "
                "JOIN model_versions v ON v.name = a.name AND v.version = a.version"
                f"{alias_where} WHERE a.name = ?{where} AND a.alias = ?"
            )
        else:
            sql = (
                "SELECT v.storage_location, v.status, v.current_stage FROM model_versions v "
                f"WHERE v.name = ?{where} AND v.version = ?"
            )
        rows = con.execute(sql, [*args, key if by_alias else int(key)]).fetchall()
    con.close()
    if len(rows) != 1:
        return None
    location, status, stage = rows[0]
    return str(location) if location and status == "READY" and stage != _DELETED else None


def _local_path(uri: str) -> Path | None:
    """A file:// URI (or a plain path) as a local folder, else None."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        path = Path(unquote(parsed.path))
    elif parsed.scheme == "" and uri.startswith("/"):
        path = Path(uri)
    else:
        return None
    return path if path.is_dir() else None


def _sampler_files(root: Path) -> dict[str, Path] | None:
    """The artifact files of a privflow "models from code" sampler whose MLmodel lies in `root`
    (None for any other model)."""
    import yaml

    try:
        mlmodel = yaml.safe_load((root / "MLmodel").read_text())
        flavor = mlmodel["flavors"]["python_function"]
        code_path = str(flavor.get("model_code_path") or flavor.get("python_model") or "")
        artifacts = flavor["artifacts"]
        ok = (
            flavor.get("loader_module") == "mlflow.pyfunc.loaders.code_model"
            and code_path.endswith("sampler_model.py")
            and (root / "code" / "privflow").is_dir()
            and "meta" in artifacts
        )
        files = {key: root / str(entry["path"]) for key, entry in artifacts.items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None
    return files if ok and all(p.is_file() for p in files.values()) else None


__all__ = ["load_local", "local_artifacts", "local_version"]
