"""One cell of the sweep: a (dataset, model, epsilon, seed) point, fitted, sampled and evaluated.

Each flow cell follows the training pipeline's steps (privflow.tasks.fit: `prepare` then `fit`):
plan, [DP marginals and the copula codec], encode with the per-row selection split, DP
statistics, DP-SGD, Report-Noisy-Max checkpoint selection, sampling in the codec the fit
used; then diagnostics that are NOT differentially private (privflow.tasks.evaluation): utility
of the nine classifiers (macro-F1, AUROC, AP), Kendall's tau RMSE/MAE, marginal TV, SDMetrics'
quality score, and the test NLL where it is comparable (the schema codec's space; 2-D
densities in DP-NF's convention, standardised coordinates, nats per point).

Models: ``dphflow`` (DP-HFlow, privflow's default configuration), ``maf`` (DP-NF's masked
autoregressive flow), ``dpmog`` (DP-NF's baseline: a DP-EM mixture of Gaussians alone,
Waites & Cummings 2021, App. B.2); privflow's ablations ``flow-nomarg`` / ``flow-nohead``
(the default with the DP-marginals stage / the target head off) and ``copula`` (the DP
marginals alone at the whole epsilon, columns independent); and the peers ``mst`` and ``aim``
(smartnoise-synth in their own venv, benchmarks/peers; private cells only). ``real-data`` is
the reference row of a table: classifiers trained on the real training split.

`cell_task` is `run_cell` as a Prefect task: the sweep (benchmarks/sweep.py) submits one per
cell to its task runner, so this module must be importable on every worker (the repository
root on its path).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import task
from threadpoolctl import threadpool_limits

from benchmarks import datasets as dm
from benchmarks.peers import driver as peers
from privflow.core.config import RunConfig
from privflow.data.copula import DEFAULT_GRID_BINS, CopulaCodec, cell_positions
from privflow.data.target_head import TargetCodec, conditional_loglik
from privflow.flows.steps import private_options
from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.accounting.plan import Remainder, make_plan
from privflow.privacy.mechanisms import dp_marginals, dp_mog, dp_stats
from privflow.serving.sampler import sample_rows
from privflow.tasks.encode import encode_rows
from privflow.tasks.evaluation.fidelity import fidelity
from privflow.tasks.evaluation.quality import quality_scores
from privflow.tasks.evaluation.report import likelihood_metrics
from privflow.tasks.evaluation.utility import utility
from privflow.tasks.fit import Spend, exact_marginal_codec, fit, initial_model, initialise, prepare
from privflow.tasks.run_plan import run_plan
from privflow.tasks.select import row_loglik

MODELS: tuple[str, ...] = ("dphflow", "maf", "dpmog", "flow-nomarg", "flow-nohead", "copula", "mst", "aim")
PEERS: tuple[str, ...] = ("mst", "aim")  # smartnoise-synth, in their own venv (benchmarks/peers)
# privflow ablations: the default configuration (`dphflow`) with one stage switched off
ABLATIONS: dict[str, dict[str, dict[str, Any]]] = {
    "flow-nomarg": {"marginals": {"enabled": False}},
    "flow-nohead": {"head": {"enabled": False}},
}
DELTA = 1e-5
REAL = "real-data"  # reference rows: classifiers trained on the real training table

# DP-MoG components per dataset: DP-NF's choices for the 2-D densities (Table 2: 5 on
# pinwheel; Table 5: 3 on the moons, 8 on the Gaussians); tables: a public, fixed choice.
MOG_COMPONENTS: dict[str, int] = {"pinwheel": 5, "half-moons": 3, "8-gaussians": 8, "adult": 10, "german": 5}

# Per-dataset overrides of the RunConfig defaults (privflow.core.config). Every dataset runs
# the defaults (4 blocks, 64 hidden units, batch 512, 8 epochs, DP-Adam lr 3e-3, C = 1),
# except German credit, whose 700 training rows would make a batch of 512 most of the table
# (sample rate 0.73, 11 steps): it uses batches of 64. The same settings hold for the
# private and the non-private run of a model: only the noise and clipping differ.
BENCH_CONFIG: dict[str, dict[str, dict[str, Any]]] = {
    "tabular": {},
    "german": {"train": {"batch_size": 64}},
    "2d": {},
}
QUICK_CONFIG: dict[str, dict[str, Any]] = {
    "model": {"blocks": 1, "hidden": 8, "spline_bins": 4, "mog_iterations": 3},
    "train": {"epochs": 1, "batch_size": 128, "checkpoint_every": 4},
}
QUICK_ROWS = {"tabular": (1500, 600), "2d": (800, 300)}  # (train, test) rows in quick mode
QUICK_SYNTHETIC = 600
WORK_DIR = Path.home() / ".cache" / "privflow-benchmark"  # the datasets' files, shared by the cells


@dataclass(frozen=True)
class Cell:
    """One point of the sweep; epsilon None is the non-private run."""

    dataset: str
    model: str
    epsilon: float | None
    seed: int

    @property
    def label(self) -> str:
        eps = "non-private" if self.epsilon is None else f"eps={self.epsilon:g}"
        return f"{self.dataset}/{self.model}/{eps}/seed={self.seed}"


def parse_epsilon(text: str) -> float | None:
    """'1' -> 1.0; 'inf', 'none', 'non-private' -> None (no privacy)."""
    t = text.strip().lower()
    if t in ("inf", "none", "nonprivate", "non-private", "np"):
        return None
    value = float(t)
    if math.isinf(value):
        return None
    if not value > 0:
        raise ValueError(f"epsilon must be positive or 'inf', got {text!r}")
    return value


def build_cells(
    datasets: Sequence[str], models: Sequence[str], epsilons: Sequence[float | None], seeds: Sequence[int]
) -> list[Cell]:
    """The sweep, plus one real-data reference cell per (table, seed) for the utility columns.
    The peers (MST, AIM) are DP mechanisms with no non-private mode: they get private cells only."""
    for d in datasets:
        if d not in dm.ALL:
            raise ValueError(f"unknown dataset '{d}'; choose from {dm.ALL}")
    for m in models:
        if m not in MODELS:
            raise ValueError(f"unknown model '{m}'; choose from {MODELS}")
    cells = [
        Cell(d, m, e, int(s))
        for d in datasets
        for m in models
        for e in epsilons
        for s in seeds
        if not (m in PEERS and e is None)
    ]
    cells += [Cell(d, REAL, None, int(s)) for d in datasets if d in dm.TABULAR for s in seeds]
    return cells


def cost(cell: Cell) -> float:
    """Rough relative cost, to start the longest cells first and keep the tail short."""
    base = {"adult": 10.0, "german": 2.0}.get(cell.dataset, 1.5)
    factor = {"dphflow": 1.6, "flow-nomarg": 1.6, "flow-nohead": 1.6, "maf": 1.0, "dpmog": 0.3, "copula": 0.1}
    factor.update({"mst": 3.0, "aim": 30.0, REAL: 0.3})
    return base * factor[cell.model]


def run_config(data: Any, cell: Cell, quick: bool) -> Any:
    """The RunConfig of a cell: project defaults, the benchmark's per-dataset overrides, quick sizes."""
    sections: dict[str, dict[str, Any]] = {
        "model": {},
        "train": {},
        "select": {},
        "privacy": {},
        "marginals": {},
        "head": {},
    }
    for key in (data.kind if data.kind == "2d" else "tabular", data.name):
        for section, values in BENCH_CONFIG.get(key, {}).items():
            sections[section].update(values)
    if quick:
        for section, values in QUICK_CONFIG.items():
            sections[section].update(values)
    name = {"dpmog": "maf", REAL: "maf", "maf": "maf"}.get(cell.model, "dphflow")
    sections["model"].update(name=name, mog_components=MOG_COMPONENTS.get(data.name, 5))
    if cell.model == "dpmog":
        sections["model"].update(prior="mog", blocks=1)
    for section, values in ABLATIONS.get(cell.model, {}).items():
        sections[section].update(values)
    sections["train"].update(seed=cell.seed, device="cpu")
    sections["privacy"].update(epsilon=cell.epsilon if cell.epsilon is not None else 1.0, delta=DELTA)
    return RunConfig.build(data=Path(f"benchmark:{data.name}"), schema_path=Path(f"benchmark:{data.name}"), **sections)


def dpmog_plan(epsilon: float, delta: float, stats_share: float, iterations: int) -> Any:
    """Plan for DP-MoG alone: the DP statistics get their share of epsilon standalone and
    DP-EM takes the rest, calibrated as privacy/accounting/plan.py calibrates DP-SGD in the pipeline."""

    def stats_event(eps: float) -> Any:
        return dp_stats.dp_stats_event(dp_stats.noise_for_epsilon(eps, delta))

    return make_plan(
        epsilon,
        delta,
        {"dp_stats": (stats_share, stats_event)},
        Remainder("dp_prior", lambda sigma: dp_mog.dp_mog_event(sigma, iterations), sigma_range=(1e-2, 1e4)),
    )


def fit_dpmog(data: Any, cell: Cell, cfg: Any, x_train: np.ndarray) -> tuple[Any, list[Any], dict[str, Any]]:
    """DP-NF's baseline: the flow's preprocessing with DP statistics and a DP-EM prior, no
    training (the pipeline's own initialisation step, `tasks/fit.initialise`, on its own plan)."""
    model = initial_model(cfg, data.codec)
    if cell.epsilon is None:
        initialise(model, cfg, None, x_train, Spend())
        return model.eval(), [], {}
    plan = dpmog_plan(cell.epsilon, DELTA, cfg.privacy.stats_share, cfg.model.mog_iterations)
    spend = Spend()
    initialise(model, cfg, plan, x_train, spend)
    return model.eval(), spend.events, {"dp_em_noise_multiplier": plan.stage("dp_prior").event.event.noise_multiplier}


def fit_model(data: Any, cell: Cell, cfg: Any) -> tuple[Any, Any, list[Any], dict[str, Any]]:
    """The pipeline's `prepare` + `fit` (tasks/fit.py) for a flow cell, or the DP-MoG baseline:
    the chosen flow, the codec it was trained in (the DP-marginals copula codec when the
    config enables it), the events spent and facts about the run."""
    if cell.model == "dpmog":
        share = cfg.select.fraction(data.schema.dataset.expected_rows)
        x_train, _ = encode_rows(data.train, data.codec, share, cell.seed)
        model, events, facts = fit_dpmog(data, cell, cfg, x_train)
        return model, data.codec, events, facts
    private = cell.epsilon is not None
    plan = run_plan(cfg, data.schema) if private else None
    spend = Spend()
    codec, x_train, x_val = prepare(cfg, data.schema, data.train, plan, spend)
    fitted = fit(cfg, data.schema, codec, x_train, x_val, plan=plan, private=private, spend=spend)
    losses = fitted.train.losses
    facts = {
        "steps": fitted.train.steps,
        "sample_rate": fitted.settings.sample_rate,
        "noise_multiplier": fitted.settings.noise_multiplier,
        "final_train_loss": float(np.nanmean(losses[-20:])) if losses else float("nan"),
        "chosen_step": fitted.chosen_steps[0],
        # what was released: a trained flow, the flow before DP-SGD (selection fell back to it), or no
        # flow at all (a table too small for DP-SGD: the independent copula of the DP marginals)
        "release": "copula-only" if fitted.copula_only else "fell-back" if fitted.fell_back else "flow",
    }
    return fitted.flows[0], fitted.codec, fitted.events, facts


def synthetic_rows(data: Any, quick: bool) -> int:
    """Rows of every synthetic table: the public size of the training split (2-D: of the test split)."""
    if quick:
        return QUICK_SYNTHETIC
    if data.kind == "2d":
        return data.test.height
    return data.schema.dataset.expected_rows or data.train.height


def copula_to_schema_logdet(codec: CopulaCodec, df: Any) -> np.ndarray | None:
    """[n] log |du/dv| from the schema codec's space v to the copula's u, per row, when every
    column is numeric (None otherwise): on column j, u = F_k + p_k (t(x) - e_k) / (e_k+1 - e_k)
    and v = (t(x) - t(lo)) / (t(hi) - t(lo)), so du/dv = p_k (t(hi) - t(lo)) / (e_k+1 - e_k).
    Adding it to a copula model's log-density gives its density in the schema codec's space,
    comparable with every other cell's `nll` (-inf where a row's bin has no released mass: the
    model gives those rows density 0). Integer and categorical cells are dequantized
    differently by the two codecs, so tables keep `nll_copula` only."""
    if any(c.kind != "numeric" or c.atoms.size for c in codec.cells):  # an atom has no density
        return None
    out = np.zeros(df.height)
    for j, c in enumerate(codec.cells):
        idx, _ = cell_positions(df.get_column(c.column), c)
        e = c.edges
        with np.errstate(divide="ignore"):
            out += np.log(codec.probs[j][idx]) + np.log((e[-1] - e[0]) / (e[idx + 1] - e[idx]))
    return out


def likelihood_cell(data: Any, cell: Cell, model: Any, codec: Any) -> dict[str, float]:
    """Test NLL in nats/row of the codec's space (2-D: DP-NF's standardised convention). Only
    the schema codec's space is shared by cells; a copula codec's space is that cell's own DP
    marginals, so its NLL goes to `nll_copula` (raw cells only), never to the compared `nll`.
    With a target head the flow's density of the other columns is added to the head's
    log-probability of the target (privflow/data/target_head.py)."""
    generator = torch.Generator().manual_seed(cell.seed)  # the bound's dequantization noise, reproducible
    inner = codec.inner if isinstance(codec, TargetCodec) else codec
    head = conditional_loglik(codec, data.test)
    if isinstance(inner, CopulaCodec):
        x = codec.encode(data.test, np.random.default_rng(cell.seed))
        ll = row_loglik(model, x, generator=generator) + head
        out = {"nll_copula": -likelihood_metrics({"test": ll})["likelihood/test_nats_per_row"]}
        logdet = copula_to_schema_logdet(inner, data.test)
        if logdet is not None:  # all numeric: the same density in the schema codec's space
            out.update(_compared_nll(likelihood_metrics({"test": ll + logdet}), data.nll_offset))
        return out
    lik = likelihood_metrics({"test": row_loglik(model, codec.encode(data.test), generator=generator) + head})
    return _compared_nll(lik, data.nll_offset)


def _compared_nll(lik: dict[str, float], offset: float) -> dict[str, float]:
    """The compared NLL: +inf when any test row has zero density (or a non-finite score), never the
    mean over the finite rows alone; the non-finite share is kept beside it."""
    share = lik["likelihood/test_nonfinite_share"]
    nll = -lik["likelihood/test_nats_per_row"] if share == 0 else math.inf
    return {"nll_encoded": nll, "nll": nll + offset, "nll_nonfinite_share": share}


def synthetic_metrics(data: Any, cell: Cell, synthetic: Any) -> dict[str, float]:
    """Diagnostics of one synthetic table, NOT differentially private: marginal TV, Kendall's tau
    errors, SDMetrics' quality score (against the training split) and, for the tables, the nine
    classifiers' utility on the real test split."""
    fid = fidelity(data.schema, data.train, synthetic).metrics()
    out = {"tv_mean": fid["fidelity/tv_mean"]}
    out.update(quality_scores(data.schema, data.train, synthetic))
    if data.kind == "tabular":
        out.update(kendall_rmse=fid["fidelity/kendall_rmse"], kendall_mae=fid["fidelity/kendall_mae"])
        util = utility(data.schema, synthetic, None, data.test, repeats=1, seed=cell.seed).metrics()
        out.update(macro_f1=util["utility/macro_f1_mean"], auroc=util["utility/auroc_mean"], ap=util["utility/ap_mean"])
    return out


def real_reference(data: Any, cell: Cell) -> dict[str, float]:
    """The real-data row: classifiers trained on the real training split (the utility ceiling),
    and the real test split scored like a synthetic table against the training split (the
    sampling-noise floor of TV, Kendall's tau and the quality score)."""
    util = utility(data.schema, data.train, None, data.test, repeats=1, seed=cell.seed).metrics()
    out = {
        "macro_f1": util["utility/macro_f1_mean"],
        "auroc": util["utility/auroc_mean"],
        "ap": util["utility/ap_mean"],
    }
    fid = fidelity(data.schema, data.train, data.test).metrics()
    out.update(tv_mean=fid["fidelity/tv_mean"], kendall_rmse=fid["fidelity/kendall_rmse"])
    out.update(kendall_mae=fid["fidelity/kendall_mae"], **quality_scores(data.schema, data.train, data.test))
    return out


def copula_cell(data: Any, cell: Cell, cfg: Any, rows: int) -> tuple[Any, list[Any], dict[str, Any]]:
    """DP marginals alone: one release of every column's histogram at the whole (epsilon, delta),
    columns sampled independently (the copula codec decoding independent uniforms drawn from
    the public sampling seed). Non-private: the exact marginals of the training split."""
    grid = cfg.marginals.grid_bins
    if cell.epsilon is None:
        codec, events, facts = exact_marginal_codec(data.schema, data.train, grid), [], {}
    else:
        sigma = dp_marginals.noise_for_epsilon(cell.epsilon, DELTA)
        if grid == "auto":  # the pipeline's rule (tasks/marginals_stage.planned_grid_bins)
            grid = DEFAULT_GRID_BINS
        released = dp_marginals.dp_marginals(data.train, data.schema, sigma, grid_bins=int(grid))
        codec = CopulaCodec.from_marginals(data.schema, released)
        events, facts = [dp_marginals.dp_marginals_event(sigma)], {"noise_multiplier": sigma, "grid_bins": int(grid)}
    u = np.random.default_rng(cell.seed).random((rows, codec.dim))
    return codec.decode(u), events, facts


def peer_cell(data: Any, cell: Cell, rows: int, quick: bool) -> tuple[Any, dict[str, Any]]:
    """MST or AIM (smartnoise-synth 1.0.8 in .venv-peers) on the same training split, sampled
    i.i.d. from its fitted graphical model (benchmarks/peers)."""
    assert cell.epsilon is not None
    rounds = peers.quick_aim_rounds(data.schema) if quick else peers.AIM_ROUNDS
    result = peers.run_peer(
        cell.model, data.schema, data.train, cell.epsilon, DELTA, cell.seed, rows, aim_rounds=rounds
    )
    facts = {"fit_seconds": result.facts["fit_seconds"], "peer_cliques": len(result.facts["cliques"])}
    if cell.model == "aim":
        facts["aim_rounds"] = rounds
    # smartnoise's own zCDP accounting: rho from (epsilon, delta) by OpenDP's conversion, all of it spent
    facts["epsilon_spent"] = cell.epsilon
    return result.frame, facts


@lru_cache(maxsize=8)
def load_dataset(name: str, quick: bool, work_dir: str) -> Any:
    """Load once per worker process (the quick sizes subsample with fixed seeds)."""
    kind = "2d" if name in dm.TWO_D else "tabular"
    n_train, n_test = QUICK_ROWS[kind] if quick else (None, None)
    return dm.load(name, Path(work_dir), max_train=n_train, max_test=n_test)


def cell_body(c: Cell, data: Any, quick: bool) -> dict[str, Any]:
    """Fit, sample and evaluate one cell (real-data: the references only)."""
    if c.model == REAL:
        return real_reference(data, c)
    record: dict[str, Any] = {}
    rows = synthetic_rows(data, quick)
    t0 = time.perf_counter()
    if c.model in PEERS:
        synthetic, facts = peer_cell(data, c, rows, quick)
        record.update(facts)
    elif c.model == "copula":
        synthetic, spent, facts = copula_cell(data, c, run_config(data, c, quick), rows)
        record.update(facts, fit_seconds=time.perf_counter() - t0)
        record["epsilon_spent"] = PLDAccountant().epsilon(spent, DELTA) if spent else None
    else:
        model, codec, spent, facts = fit_model(data, c, run_config(data, c, quick))
        record.update(facts, fit_seconds=time.perf_counter() - t0)
        record["epsilon_spent"] = PLDAccountant().epsilon(spent, DELTA) if spent else None
        record.update(likelihood_cell(data, c, model, codec))
        synthetic = sample_rows([model], codec, rows, seed=c.seed)
    record.update(synthetic_metrics(data, c, synthetic))
    return record


def run_cell(cell: dict[str, Any], quick: bool = False, work_dir: str | None = None) -> dict[str, Any]:
    """Run one cell end to end; never raises: a failure is recorded with its error."""
    torch.set_num_threads(1)
    c = Cell(**cell)
    record: dict[str, Any] = {**asdict(c), "status": "ok"}
    started = time.perf_counter()
    try:
        with threadpool_limits(1):
            data = load_dataset(c.dataset, quick, work_dir or str(WORK_DIR))
            record.update(train_rows=data.train.height, test_rows=data.test.height)
            record.update(cell_body(c, data, quick))
    except Exception as exc:  # a failed cell is reported, the sweep goes on
        record.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=6))
    record["seconds"] = time.perf_counter() - started
    return record


cell_task = task(run_cell, name="benchmark-cell", **private_options())
