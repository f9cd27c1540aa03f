"""Main side of the peers (MST, AIM from smartnoise-synth): public spec, discretise, run, decode.

smartnoise-synth lives in its own venv (.venv-peers; benchmarks/peers/setup.sh) and runs as a
subprocess (benchmarks/peers/run_peer.py): table in, synthetic table out. This module is the
half that runs in the project's environment, so the benchmark (benchmarks/cells.py) gets a
synthetic table with the schema's types, evaluated exactly like privflow's.

Discretisation, from the PUBLIC schema only (privacy rule 2; nothing is fitted on rows):

- categorical: one code per declared category, in declared order;
- integer whose bounds hold at most `bins` integers: one code per integer (exact);
- other integer and numeric columns: `bins` (20) equal-width bins of [t(lo), t(hi)] on the
  schema's transform scale t (identity or log1p), values outside the bounds clipped into the
  end bins: the bins of the benchmark's marginal TV (privflow/data/features.py);
- a nullable column has one more code, last, for null.

Decoding (post-processing, explicit generator seeded by the public sampling seed): a
category's label; an atom's integer; a numeric bin's value uniform on the t-scale inside the
bin; an integer bin's value uniform on the t-scale over the dequantized span [t(a), t(b + 1))
of the integers a..b the bin holds, then floored, so it is always one of the bin's integers
(a bin holding no integer, possible only on a log scale's first bins, decodes like a numeric
bin and is floored). Types are those `validate` returns: Int64, Float64, Enum of the
declared categories.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from privflow.data.schema import Column, Schema

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SETUP = HERE / "setup.sh"
RUNNER = HERE / "run_peer.py"
METHODS: tuple[str, ...] = ("mst", "aim")
BINS = 20  # the benchmark's marginal-TV bins (privflow/features.N_BINS)
AIM_ROUNDS = 48  # AIM with 48 rounds, the comparison's fixed setting


def quick_aim_rounds(schema: Schema) -> int:
    """AIM's rounds for a smoke test: a few selection rounds after the one-way marginals, which
    take 0.9 d / rounds of the budget (so rounds must exceed 0.9 d)."""
    return len(schema.columns) + 8


SETUP_COMMAND = "bash benchmarks/peers/setup.sh"


class PeersUnavailable(RuntimeError):
    """The peers' venv is missing or broken; the message holds the one command that builds it."""


def _t(x: Any, transform: str) -> Any:
    return np.log1p(x) if transform == "log1p" else x


def _t_inv(v: Any, transform: str) -> Any:
    return np.expm1(v) if transform == "log1p" else v


@dataclass(frozen=True, eq=False)
class PeerColumn:
    """One column's public code domain: kind 'categorical' (labels), 'atoms' (one code per
    integer from `lo`), or 'bins' (`edges` on the t-scale); a nullable column's null code last."""

    name: str
    kind: Literal["categorical", "atoms", "bins"]
    integer: bool
    nullable: bool
    transform: str = "none"
    labels: tuple[str, ...] = ()
    lo: float = 0.0
    hi: float = 0.0
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n_values(self) -> int:
        if self.kind == "categorical":
            return len(self.labels)
        if self.kind == "atoms":
            return int(self.hi - self.lo) + 1
        return int(self.edges.size - 1)

    @property
    def size(self) -> int:
        """Number of codes the peer sees (values, plus null)."""
        return self.n_values + (1 if self.nullable else 0)

    def to_json(self) -> dict[str, Any]:
        """The spec entry: name and size (all the peer needs), with the public description."""
        out: dict[str, Any] = {"name": self.name, "size": self.size, "kind": self.kind, "nullable": self.nullable}
        if self.kind == "categorical":
            out["categories"] = list(self.labels)
        else:
            out.update(bounds=[self.lo, self.hi], transform=self.transform, integer=self.integer)
        if self.kind == "bins":
            out["edges_t"] = [float(e) for e in self.edges]
        return out


def peer_column(col: Column, bins: int = BINS) -> PeerColumn:
    """The public code domain of one schema column (module docstring)."""
    if col.is_categorical:
        return PeerColumn(col.name, "categorical", False, col.nullable, labels=tuple(col.categories or ()))
    lo, hi = col.bounds  # type: ignore[misc]
    if col.type == "integer":
        lo_i, hi_i = math.ceil(lo), math.floor(hi)
        if hi_i - lo_i + 1 <= bins:
            return PeerColumn(col.name, "atoms", True, col.nullable, col.transform, lo=float(lo_i), hi=float(hi_i))
    edges = np.linspace(float(_t(lo, col.transform)), float(_t(hi, col.transform)), bins + 1)
    return PeerColumn(
        col.name, "bins", col.type == "integer", col.nullable, col.transform, lo=float(lo), hi=float(hi), edges=edges
    )


def peer_columns(schema: Schema, bins: int = BINS) -> list[PeerColumn]:
    """`peer_column` for every schema column, in schema order."""
    return [peer_column(c, bins) for c in schema.columns]


def peer_spec(
    schema: Schema,
    method: str,
    epsilon: float,
    delta: float,
    seed: int,
    rows: int,
    *,
    bins: int = BINS,
    aim_rounds: int = AIM_ROUNDS,
) -> dict[str, Any]:
    """The JSON spec run_peer.py reads: method, budget, public sampling seed and row count, and
    the columns' public code domains. Nothing in it is read off the rows."""
    if method not in METHODS:
        raise ValueError(f"unknown peer '{method}'; choose from {METHODS}")
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon}, {delta})")
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    d = len(schema.columns)
    if method == "aim" and not aim_rounds > 0.9 * d:
        # AIM spends 0.9 rho / rounds on each of the d one-way marginals first: with rounds <= 0.9 d
        # they alone exceed the budget and its noise scale turns NaN
        raise ValueError(f"AIM needs more than 0.9 x {d} columns rounds, got {aim_rounds}")
    return {
        "method": method,
        "epsilon": float(epsilon),
        "delta": float(delta),
        "seed": int(seed),
        "rows": int(rows),
        "aim_rounds": int(aim_rounds),
        "bins": int(bins),
        "columns": [c.to_json() for c in peer_columns(schema, bins)],
    }


# ---------------------------------------------------------------------------- encode / decode


def _column_codes(s: pl.Series, pc: PeerColumn) -> np.ndarray:
    isnull = s.is_null().to_numpy()
    if pc.kind == "categorical":
        mapping = {label: i for i, label in enumerate(pc.labels)}
        codes = s.cast(pl.String).replace_strict(mapping, default=None, return_dtype=pl.Int64)
        unknown = codes.is_null().to_numpy() & ~isnull
        if unknown.any():
            raise ValueError(f"column '{pc.name}': {int(unknown.sum())} value(s) outside the declared categories")
        idx = codes.fill_null(0).to_numpy().astype(np.int64)
    else:
        x = s.cast(pl.Float64).to_numpy().astype(np.float64)
        isnull = isnull | np.isnan(x)
        xv = np.clip(np.where(isnull, pc.lo, x), pc.lo, pc.hi)
        if pc.kind == "atoms":
            idx = (np.floor(xv) - pc.lo).astype(np.int64)
        else:
            tv = _t(xv, pc.transform)
            idx = np.clip(np.searchsorted(pc.edges, tv, side="right") - 1, 0, pc.n_values - 1).astype(np.int64)
    if isnull.any():
        if not pc.nullable:
            raise ValueError(f"column '{pc.name}': {int(isnull.sum())} null(s) in a column that is not nullable")
        idx = np.where(isnull, pc.n_values, idx)
    return idx


def encode_for_peer(schema: Schema, df: pl.DataFrame, bins: int = BINS) -> pl.DataFrame:
    """Typed rows -> integer codes per column (a per-row map fixed by the schema), schema order."""
    missing = [n for n in schema.names if n not in df.columns]
    if missing:
        raise ValueError(f"the table lacks the schema's column(s) {missing}")
    return pl.DataFrame(
        {pc.name: _column_codes(df.get_column(pc.name), pc) for pc in peer_columns(schema, bins)},
        schema={n: pl.Int64 for n in schema.names},
    )


def _integer_span(pc: PeerColumn) -> tuple[np.ndarray, np.ndarray]:
    """Per bin of an integer 'bins' column: its first and last integer (first > last: none)."""
    lo_i, hi_i = math.ceil(pc.lo), math.floor(pc.hi)
    ints = np.arange(lo_i, hi_i + 1, dtype=np.float64)
    which = np.clip(np.searchsorted(pc.edges, _t(ints, pc.transform), side="right") - 1, 0, pc.n_values - 1)
    first = np.full(pc.n_values, np.inf)
    last = np.full(pc.n_values, -np.inf)
    np.minimum.at(first, which, ints)
    np.maximum.at(last, which, ints)
    return first, last


def _column_values(codes: np.ndarray, pc: PeerColumn, rng: np.random.Generator) -> pl.Series:
    isnull = codes >= pc.n_values
    k = np.minimum(codes, pc.n_values - 1)
    if pc.kind == "categorical":
        labels = pl.Series(pc.name, [*pc.labels, None], dtype=pl.String)
        return labels.gather(np.where(isnull, len(pc.labels), k)).cast(pl.Enum(list(pc.labels))).alias(pc.name)
    if pc.kind == "atoms":
        s = pl.Series(pc.name, (pc.lo + k).astype(np.int64), dtype=pl.Int64)
    else:
        lo_t, hi_t = pc.edges[k], pc.edges[k + 1]
        if pc.integer:
            first, last = (a[k] for a in _integer_span(pc))
            has = first <= last  # the bin holds integers first..last: their dequantized span
            lo_t = np.where(has, _t(np.where(has, first, 0.0), pc.transform), lo_t)
            hi_t = np.where(has, _t(np.where(has, last + 1.0, 1.0), pc.transform), hi_t)
        x = _t_inv(lo_t + rng.random(codes.size) * (hi_t - lo_t), pc.transform)
        if pc.integer:
            x = np.floor(x)
            x = np.where(has, np.clip(x, np.where(has, first, 0.0), np.where(has, last, 0.0)), x)  # rounding
            x = np.clip(x, math.ceil(pc.lo), math.floor(pc.hi))
            s = pl.Series(pc.name, x.astype(np.int64), dtype=pl.Int64)
        else:
            s = pl.Series(pc.name, np.clip(x, pc.lo, pc.hi), dtype=pl.Float64)
    if isnull.any():
        s = s.scatter(np.flatnonzero(isnull), None)
    return s


def decode_from_peer(schema: Schema, codes: pl.DataFrame, seed: int, bins: int = BINS) -> pl.DataFrame:
    """Integer codes -> rows of the schema (module docstring, "Decoding"); `seed` is the public
    sampling seed of the post-processing draws."""
    rng = np.random.default_rng([int(seed), 0x9E3779B9])  # a stream apart from the peer's own sampler
    cols = {}
    for pc in peer_columns(schema, bins):
        c = codes.get_column(pc.name).to_numpy().astype(np.int64)
        if c.size and (c.min() < 0 or c.max() >= pc.size):
            raise ValueError(f"column '{pc.name}': codes outside 0..{pc.size - 1}")
        cols[pc.name] = _column_values(c, pc, rng)
    return pl.DataFrame(cols)


# ---------------------------------------------------------------------------- the subprocess


def peers_venv() -> Path:
    """The peers' venv: $PRIVFLOW_PEERS_VENV, else .venv-peers at the repository root."""
    return Path(os.environ.get("PRIVFLOW_PEERS_VENV") or REPO / ".venv-peers")


def peers_python() -> Path | None:
    """The peers' interpreter if the venv holds smartnoise-synth, else None (no install is tried)."""
    py = peers_venv() / "bin" / "python"
    if not py.is_file():
        return None
    probe = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('smartnoise-synth'))"],
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    return py if probe.returncode == 0 and probe.stdout.strip() == "1.0.8" else None


def ensure_peers_venv(install: bool = True) -> Path:
    """The peers' interpreter, building the venv with setup.sh when it is missing (`install`);
    raises PeersUnavailable naming the one command otherwise."""
    py = peers_python()
    if py is not None:
        return py
    if install:
        done = subprocess.run(["bash", str(SETUP)], cwd=REPO, capture_output=True, text=True)
        py = peers_python()
        if py is not None:
            return py
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise PeersUnavailable(f"`{SETUP_COMMAND}` failed: " + " | ".join(tail))
    raise PeersUnavailable(f"the peers' venv {peers_venv()} is missing; build it with `{SETUP_COMMAND}`")


def _clean_env() -> dict[str, str]:
    """The environment for the peers' interpreter: nothing of this venv leaks in, one thread,
    JAX on CPU, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        PYTHONNOUSERSITE="1",
        JAX_PLATFORMS="cpu",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    )
    return env


@dataclass(frozen=True)
class PeerResult:
    """A peer's synthetic table (schema types) and facts about its run (seconds, cliques, versions)."""

    frame: pl.DataFrame
    facts: dict[str, Any]


def run_peer(
    method: str,
    schema: Schema,
    train_df: pl.DataFrame,
    epsilon: float,
    delta: float,
    seed: int,
    rows: int,
    *,
    aim_rounds: int = AIM_ROUNDS,
    bins: int = BINS,
    timeout: float | None = None,
    install: bool = False,
) -> PeerResult:
    """Fit `method` on `train_df` in the peers' venv at (epsilon, delta) and decode `rows` i.i.d.
    rows. The private codes live in a temporary folder removed on return."""
    py = ensure_peers_venv(install)
    spec = peer_spec(schema, method, epsilon, delta, seed, rows, bins=bins, aim_rounds=aim_rounds)
    codes = encode_for_peer(schema, train_df, bins)
    with tempfile.TemporaryDirectory(prefix="privflow-peer-") as tmp:
        folder = Path(tmp)
        paths = {k: folder / n for k, n in (("spec", "spec.json"), ("train", "train.csv"), ("out", "out.csv"))}
        paths["facts"] = folder / "facts.json"
        paths["spec"].write_text(json.dumps(spec))
        codes.write_csv(paths["train"])
        cmd = [str(py), str(RUNNER)] + [a for k in ("spec", "train", "out", "facts") for a in (f"--{k}", str(paths[k]))]
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=_clean_env(), timeout=timeout)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            raise RuntimeError(f"{method} failed in the peers' venv (exit {done.returncode}):\n{tail}")
        out = pl.read_csv(paths["out"], schema={n: pl.Int64 for n in schema.names})
        facts = json.loads(paths["facts"].read_text())
    facts["subprocess_seconds"] = time.perf_counter() - started
    if out.height != rows:
        raise RuntimeError(f"{method} returned {out.height} rows, asked for {rows}")
    return PeerResult(decode_from_peer(schema, out, seed, bins), facts)


def peer_synthetic(
    method: str,
    schema: Schema,
    train_df: pl.DataFrame,
    epsilon: float,
    delta: float,
    seed: int,
    rows: int,
    **kwargs: Any,
) -> pl.DataFrame:
    """`rows` synthetic rows of `schema` from the peer `method` ('mst' or 'aim') fitted on
    `train_df` at (epsilon, delta); see `run_peer` for the options."""
    return run_peer(method, schema, train_df, epsilon, delta, seed, rows, **kwargs).frame


__all__ = [
    "AIM_ROUNDS",
    "BINS",
    "METHODS",
    "PeerColumn",
    "PeerResult",
    "PeersUnavailable",
    "decode_from_peer",
    "encode_for_peer",
    "ensure_peers_venv",
    "peer_columns",
    "peer_spec",
    "peer_synthetic",
    "peers_python",
    "quick_aim_rounds",
    "run_peer",
]
