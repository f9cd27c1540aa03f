"""Fit one smartnoise-synth peer (MST or AIM) on pre-discretised rows and sample it i.i.d.

Runs INSIDE .venv-peers (benchmarks/peers/setup.sh), as a subprocess of the benchmark
(benchmarks/peers/driver.py): smartnoise-synth 1.0.8 pins opacus 0.14, opendp 0.14 and
pandas < 3, so it cannot share the project's environment. Table in, table out:

    run_peer.py --spec spec.json --train train.csv --out synthetic.csv --facts facts.json

- spec.json (written by the main side from the PUBLIC schema only): method, epsilon, delta,
  the sampling seed, the number of rows to sample, AIM's rounds, and per column its name and
  its number of codes `size` (plus the public description the codes came from, for the record).
- train.csv: the training rows, already discretised by the main side into integer codes
  0..size-1 per column (declared categories; integers or 20 equal-width public bins on the
  schema's transform scale; a null code last). Nothing here looks at a value's meaning.
- synthetic.csv: `rows` sampled rows in the same codes; the main side decodes them.

Why not smartnoise's own preprocessing: its TableTransformer learns each column's set of
values from the rows (a data-dependent domain, and values absent from the training split can
never be generated), and with continuous columns it asks for `preprocessor_eps` to find
bounds, silently taken from the synthesizer's epsilon. Here every column is a fixed-size code
domain from the public schema (`FixedCodes`, fitted already), so no preprocessing runs; the
script checks that the synthesizer's epsilon is untouched after fitting and that its
transformer's odometer spent nothing.

Why not smartnoise's sampler: `synthetic_data()` of mbi 1.1 defaults to randomised rounding of
counts ("round"), which makes the synthetic marginals a rounded copy of the model's and, for
each later column, assigns values by rank inside each parent group (stratified, not
independent), which invents rank correlation between columns. Its "sample" option draws
from the global NumPy RNG and conditions each column on its neighbours in the measured
cliques, which is only exact when those cliques are already chordal (MST's tree is; AIM's
selections need not be). `sample_iid` draws every row independently from the fitted model
through its junction tree: each column from its conditional given the already-sampled
members of its junction-tree clique (reverse elimination order: those members separate it
from everything sampled before), with an explicit NumPy generator seeded by the public
sampling seed. MST's domain compression (values whose noisy 1-way count is below 3 sigma
merged into one cell) is undone the way MST does it, a uniform draw among the merged values,
with the same generator.

Fitting randomness: smartnoise draws its Gaussian noise from OpenDP's samplers and its
exponential-mechanism choices from the global NumPy RNG; neither is seeded from the public
seed here (a public seed on a mechanism's randomness would void its guarantee), so repeated
fits differ like any DP release. Privacy: smartnoise's own zCDP accounting (rho from
(epsilon, delta) by OpenDP's conversion); MST, as published, takes the true row count as
known (`known_total`), which is not charged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# one core per cell: the benchmark runs cells side by side on a small shared machine
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

METHODS = ("mst", "aim")


def _smartnoise() -> tuple[Any, Any, Any, Any, Any]:
    """snsynth's pieces, imported late so `--help` and the pure helpers work without them."""
    from snsynth.aim import AIMSynthesizer
    from snsynth.mst import MSTSynthesizer
    from snsynth.transform.base import ColumnTransformer
    from snsynth.transform.definitions import ColumnType
    from snsynth.transform.table import TableTransformer

    return AIMSynthesizer, MSTSynthesizer, ColumnTransformer, ColumnType, TableTransformer


def fixed_transformer(sizes: list[int]) -> Any:
    """A TableTransformer of `FixedCodes`: every column's domain is its public number of codes,
    and it is fitted before it sees a row, so smartnoise never runs (or charges) preprocessing."""
    _, _, ColumnTransformer, ColumnType, TableTransformer = _smartnoise()

    class FixedCodes(ColumnTransformer):
        """Integer codes 0..size-1 passed through; the domain comes from the spec, not the rows."""

        def __init__(self, size: int) -> None:
            self.size = int(size)
            super().__init__()

        @property
        def output_type(self) -> Any:
            return ColumnType.CATEGORICAL

        @property
        def cardinality(self) -> list[int]:
            return [self.size]

        def _clear_fit(self) -> None:
            self._fit_complete = True
            self.output_width = 1

        def _fit(self, val: Any) -> None:
            raise RuntimeError("FixedCodes is never fitted on rows")

        def _transform(self, val: Any) -> int:
            return int(val)

        def _inverse_transform(self, val: Any) -> int:
            return int(val)

    return TableTransformer([FixedCodes(s) for s in sizes])


def make_synthesizer(spec: dict[str, Any]) -> Any:
    """MST (an MSTSynthesizer that remembers its compression supports) or AIM, from the spec."""
    AIMSynthesizer, MSTSynthesizer, *_ = _smartnoise()
    eps, delta = float(spec["epsilon"]), float(spec["delta"])
    if spec["method"] == "aim":
        return AIMSynthesizer(
            epsilon=eps,
            delta=delta,
            rounds=int(spec["aim_rounds"]),
            max_model_size=float(spec.get("aim_max_model_size", 80)),
            degree=2,
        )

    class MST(MSTSynthesizer):
        """MST whose compression supports are kept, to undo compression with our generator."""

        def transform_data(self, data: Any, supports: dict[str, np.ndarray]) -> Any:
            self.supports = {k: np.asarray(v, dtype=bool) for k, v in supports.items()}
            return super().transform_data(data, supports)

    return MST(epsilon=eps, delta=delta)


def sample_iid(model: Any, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`rows` i.i.d. draws from an mbi MarkovRandomField, exact for any clique structure.

    The potentials are expanded onto the maximal cliques of the junction tree (the
    triangulated graph), calibrated once by message passing; columns are drawn in reverse
    elimination order, each from its conditional given the already-drawn members of the
    junction-tree cliques holding it (a clique of the triangulated graph, so one maximal
    clique holds them all with the column: the conditional is read off that marginal).
    """
    from mbi import junction_tree, marginal_oracles

    domain = model.domain
    jtree, order = junction_tree.make_junction_tree(domain, [tuple(c) for c in model.cliques])
    maximal = [tuple(c) for c in junction_tree.maximal_cliques(jtree)]
    marginals = marginal_oracles.message_passing_stable(model.potentials.expand(maximal), 1.0)
    data: dict[str, np.ndarray] = {}
    for col in order[::-1]:
        holders = [set(c) for c in maximal if col in c]
        parents = tuple(a for a in data if any(a in h for h in holders))
        table = np.asarray(marginals.project(parents + (col,)).datavector(flatten=False), dtype=np.float64)
        table = np.clip(table, 0.0, None)
        k = table.shape[-1]
        flat = table.reshape(-1, k)
        norm = flat.sum(axis=1, keepdims=True)
        cond = np.where(norm > 0, flat / np.where(norm > 0, norm, 1.0), 1.0 / k)
        cdf = np.cumsum(cond, axis=1)
        cdf[:, -1] = 1.0
        if parents:
            group = np.ravel_multi_index(tuple(data[p] for p in parents), table.shape[:-1])
        else:
            group = np.zeros(rows, dtype=np.int64)
        u = rng.random(rows)
        # per row: first code whose conditional CDF exceeds u, in its parents' group
        data[col] = (u[:, None] >= cdf[group]).sum(axis=1).clip(0, k - 1).astype(np.int64)
    return {a: data[a] for a in domain.attrs}


def uncompress(codes: dict[str, np.ndarray], supports: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """MST's domain compression undone in place: the merged cell becomes a uniform draw among
    the merged values (as MST's own `reverse_data`), the kept cells their original values."""
    for col, support in supports.items():
        kept, merged = np.flatnonzero(support), np.flatnonzero(~support)
        c = codes[col]
        is_merged = c == kept.size
        out = np.empty_like(c)
        out[~is_merged] = kept[c[~is_merged]]
        if is_merged.any():
            out[is_merged] = rng.choice(merged, int(is_merged.sum())) if merged.size else kept[-1]
        codes[col] = out


def read_codes(path: Path, spec: dict[str, Any]) -> pd.DataFrame:
    """The training codes, checked against the spec's column names and domain sizes."""
    names = [c["name"] for c in spec["columns"]]
    sizes = [int(c["size"]) for c in spec["columns"]]
    df = pd.read_csv(path, dtype=np.int64)
    if list(df.columns) != names:
        raise SystemExit(f"train columns {list(df.columns)} differ from the spec's {names}")
    for name, size in zip(names, sizes, strict=True):
        v = df[name].to_numpy()
        if v.size and (v.min() < 0 or v.max() >= size):
            raise SystemExit(f"column {name!r}: codes outside 0..{size - 1}")
    return df


def run(spec: dict[str, Any], train: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Fit the spec's method on the codes and draw `rows` i.i.d. rows; (codes, facts)."""
    if spec["method"] not in METHODS:
        raise SystemExit(f"method must be one of {METHODS}, got {spec['method']!r}")
    names = list(train.columns)
    sizes = [int(c["size"]) for c in spec["columns"]]
    synth = make_synthesizer(spec)
    transformer = fixed_transformer(sizes)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        synth.fit(train, transformer=transformer, preprocessor_eps=0.0)
    fit_seconds = time.perf_counter() - t0
    # no hidden budget: the synthesizer kept its whole epsilon and the transformer spent nothing
    if float(synth.epsilon) != float(spec["epsilon"]):
        raise SystemExit(f"smartnoise changed epsilon during preprocessing: {synth.epsilon} != {spec['epsilon']}")
    spent = transformer.odometer.spent
    if any(float(x) != 0.0 for x in spent):
        raise SystemExit(f"smartnoise's preprocessing spent privacy: {spent}")
    model = synth.synthesizer
    rng = np.random.default_rng(int(spec["seed"]))
    t1 = time.perf_counter()
    codes = sample_iid(model, int(spec["rows"]), rng)
    if spec["method"] == "mst":
        uncompress(codes, synth.supports, rng)
    columns = [f"col{i}" for i in range(len(names))]  # smartnoise's own names for the columns
    out = pd.DataFrame({name: codes[c] for name, c in zip(names, columns, strict=True)})
    facts = {
        "method": spec["method"],
        "fit_seconds": fit_seconds,
        "sample_seconds": time.perf_counter() - t1,
        "cliques": [[names[columns.index(a)] for a in cl] for cl in model.cliques],
        "preprocessor_epsilon": 0.0,
        "epsilon": float(synth.epsilon),
        "delta": float(spec["delta"]),
    }
    if spec["method"] == "aim":
        facts["rho"] = float(synth.rho)
        facts["aim_rounds"] = int(spec["aim_rounds"])
    return out, facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, required=True)
    p.add_argument("--train", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--facts", type=Path, default=None)
    args = p.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    train = read_codes(args.train, spec)
    out, facts = run(spec, train)
    out.to_csv(args.out, index=False)
    if args.facts is not None:
        import importlib.metadata as md

        facts["versions"] = {k: md.version(k) for k in ("smartnoise-synth", "mbi", "opendp", "jax", "pandas")}
        args.facts.write_text(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
