"""The sweep's results file: provenance, how to read it, per-dataset tables (mean ± std over
seeds and the worst seed), the papers' own figures, the targets line by line, failed cells and
every cell's raw numbers. Provenance (commit, machine) comes from benchmarks/bench_common.py,
as for every other benchmark of this folder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import datasets as dm
from benchmarks.bench_common import git_commit, machine
from benchmarks.cells import DELTA, MODELS, MOG_COMPONENTS, PEERS, REAL, Cell
from benchmarks.presets import TARGET_SETS, Target
from privflow.core.config import HeadConfig, MarginalsConfig, PrivacyConfig
from privflow.tasks.evaluation.figures import utility_vs_epsilon_figure

PAPER_NOTE = {
    "adult": [
        "DP-HFlow paper (Lee et al. 2022), Adult, nine classifiers trained on synthetic, tested on real: "
        "DP-HFlow at eps=1: macro-F1 **0.56**, AUROC **0.75**, AP **0.50**; non-private DP-HFlow: 0.75 / 0.87 / 0.70; "
        "real training data: 0.79 / 0.90 / 0.77.",
        "DP-HFlow paper, Kendall's tau errors (on Covertype, not Adult): RMSE **0.0717**, MAE **0.0482**.",
    ],
    "pinwheel": [
        "DP-NF paper (Waites & Cummings 2021, App. B.2, Table 2): on pinwheel both DP-NF and DP-MoG "
        "'demonstrate difficulty in achieving negative log likelihoods lower than **2.65-2.70**' "
        "(nats per point, standardised data). For scale: the best single Gaussian scores 2.84 there.",
    ],
    "half-moons": ["DP-NF reports half-moons in its Table 5; the values are not legible in our copy of the paper."],
    "8-gaussians": [
        "DP-NF reports the 8 Gaussians in its Table 5; the values are not legible in our copy of the paper."
    ],
}


HIGHER_BETTER = ("macro_f1", "auroc", "ap", "quality_score", "quality_column_shapes", "quality_column_pair_trends")
LOWER_BETTER = ("tv_mean", "kendall_rmse", "kendall_mae", "nll")
QUALITY_COLUMNS = [
    ("quality_score", "SDMetrics quality"),
    ("quality_column_shapes", "column shapes"),
    ("quality_column_pair_trends", "pair trends"),
]
COLUMNS = {
    "tabular": [
        ("macro_f1", "macro-F1"),
        ("auroc", "AUROC"),
        ("ap", "AP"),
        ("kendall_rmse", "Kendall tau RMSE"),
        ("kendall_mae", "Kendall tau MAE"),
        ("tv_mean", "marginal TV"),
        *QUALITY_COLUMNS,
        ("nll", "test NLL (nats/row, schema codec)"),
        ("epsilon_spent", "eps spent"),
        ("seconds", "seconds"),
    ],
    "2d": [
        ("nll", "test NLL (nats/point, standardised; DP-NF convention)"),
        ("nll_encoded", "test NLL (encoded space)"),
        ("tv_mean", "marginal TV"),
        *QUALITY_COLUMNS,
        ("epsilon_spent", "eps spent"),
        ("seconds", "seconds"),
    ],
}
WORST_COLUMNS = {
    "tabular": [
        ("macro_f1", "min macro-F1"),
        ("auroc", "min AUROC"),
        ("ap", "min AP"),
        ("tv_mean", "max marginal TV"),
        ("kendall_rmse", "max Kendall tau RMSE"),
        ("quality_score", "min SDMetrics quality"),
    ],
    "2d": [("nll", "max test NLL"), ("tv_mean", "max marginal TV"), ("quality_score", "min SDMetrics quality")],
}
MODEL_NOTES = {
    "dphflow": "DP-HFlow (Lee et al. 2022) with privflow's default configuration (`src/privflow/core/config.py`; DP "
    f"marginals {'on' if MarginalsConfig().enabled else 'off'} by default, with {MarginalsConfig().share:.0%} of "
    "epsilon: every column's histogram released once, rows encoded through the DP CDFs (copula codec); with a "
    f"schema target, the target head {'on' if HeadConfig().enabled else 'off'} by default, with "
    f"{HeadConfig().share:.0%} of epsilon: the flow models the other columns and a DP softmax regression the "
    "target given them, calibrated to the DP class rates; on a table too small for DP-SGD "
    "(`train.min_effective_batch`) no flow is trained and the marginals take the flow's budget (raw cells: "
    "`release`))",
    "maf": "DP-NF's masked autoregressive flow (Waites & Cummings 2021)",
    "dpmog": "DP-NF's baseline, a DP-EM mixture of Gaussians alone, fitted in the flow's preprocessed space "
    "(bound scaling, logit, DP standardisation) and scored with the exact change of variables",
    "flow-nomarg": "privflow ablation: the default with `marginals.enabled=False` (schema codec)",
    "flow-nohead": "privflow ablation: the default with `head.enabled=False` (the flow models the target too)",
    "copula": "privflow ablation: the DP marginals alone at the whole epsilon, columns sampled independently "
    "(the copula codec decoding independent uniforms)",
    "mst": "MST (McKenna et al. 2021), smartnoise-synth 1.0.8 in its own venv (`benchmarks/peers`)",
    "aim": "AIM (McKenna et al. 2022), smartnoise-synth 1.0.8, 48 rounds, degree-2 workload (`benchmarks/peers`)",
}


def default_command(
    datasets: Sequence[str], models: Sequence[str], epsilons: Sequence[float | None], seeds: Sequence[int], quick: bool
) -> str:
    eps = ",".join("inf" if e is None else f"{e:g}" for e in epsilons)
    cmd = (
        f"python -m benchmarks.sweep --datasets {','.join(datasets)} --models {','.join(models)} "
        f"--epsilons {eps} --seeds {','.join(str(s) for s in seeds)}"
    )
    return cmd + (" --quick" if quick else "")


def _stats(values: list[float]) -> tuple[float, float, int]:
    a = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if a.size == 0:
        return float("nan"), float("nan"), 0
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0, int(a.size)


def _fmt(mean: float, std: float, n: int, digits: int = 3) -> str:
    if n == 0 or not np.isfinite(mean):
        return "—"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def _num(v: float | None, digits: int = 3) -> str:
    return "—" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def _digits(metric: str) -> int:
    return 4 if metric.startswith(("kendall", "tv_")) else 1 if metric == "seconds" else 3


def _eps_label(e: float | None) -> str:
    return "non-private" if e is None else f"{e:g}"


def _eps_key(e: float | None) -> float:
    return math.inf if e is None else float(e)


def _groups(records: list[dict[str, Any]]) -> dict[tuple[str, str, float | None], list[dict[str, Any]]]:
    groups: dict[tuple[str, str, float | None], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("status") == "ok":
            groups.setdefault((r["dataset"], r["model"], r["epsilon"]), []).append(r)
    return groups


def summarise(
    records: list[dict[str, Any]],
) -> dict[tuple[str, str, float | None], dict[str, tuple[float, float, int]]]:
    """(dataset, model, epsilon) -> metric -> (mean, std over seeds, seeds counted); ok cells only."""
    out = {}
    for key, rs in _groups(records).items():
        metrics = {k for r in rs for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out[key] = {m: _stats([r.get(m) for r in rs]) for m in metrics}
    return out


def worst_seed(records: list[dict[str, Any]]) -> dict[tuple[str, str, float | None], dict[str, float]]:
    """(dataset, model, epsilon) -> metric -> the worst seed's value (min where higher is better,
    max where lower is better): the targets judged on every seed read this."""
    out: dict[tuple[str, str, float | None], dict[str, float]] = {}
    for key, rs in _groups(records).items():
        out[key] = {}
        for m in HIGHER_BETTER + LOWER_BETTER:
            vals = [float(r[m]) for r in rs if isinstance(r.get(m), (int, float)) and np.isfinite(r[m])]
            if vals:
                out[key][m] = min(vals) if m in HIGHER_BETTER else max(vals)
    return out


def utility_figures(dataset: str, summary: dict, folder: Path) -> list[str]:
    """Utility against epsilon (DP-HFlow Fig. 5) for each model with at least two private
    epsilons, as PNGs beside the results file; returns the Markdown lines that show them."""
    lines = []
    real = summary.get((dataset, REAL, None), {})
    for model in MODELS:
        points = [
            (e, *summary[(dataset, model, e)]["auroc"][:2])
            for (d, m, e) in summary
            if d == dataset and m == model and e is not None and "auroc" in summary[(dataset, model, e)]
        ]
        if len(points) < 2:
            continue
        path = folder / f"utility_vs_epsilon_{dataset}_{model}.png"
        utility_vs_epsilon_figure(points, path, "AUROC", real.get("auroc", (None,))[0])
        lines += [f"![{model} AUROC against epsilon on {dataset}]({path.name})", ""]
    return lines


def _model_order(model: str) -> int:
    return (MODELS + (REAL,)).index(model) if model in MODELS + (REAL,) else 99


def _provenance(records: list[dict[str, Any]], command: str, wall: float, runner: str, quick: bool) -> list[str]:
    """The results file's header: how it was produced."""
    seeds = sorted({r["seed"] for r in records})
    return [
        "# privflow benchmark results",
        "",
        "Generated by `benchmarks/sweep.py`"
        + (" in **quick mode (tiny data and steps: not a result)**" if quick else "")
        + ".",
        "",
        f"- Command: `{command}`",
        f"- Commit: `{git_commit()}`",
        f"- Date (UTC): {datetime.now(UTC).strftime('%Y-%m-%d %H:%M')}; machine: {machine()}; torch on CPU with 1 "
        f"thread per cell; task runner: {runner}; wall time {wall / 60:.1f} min.",
        f"- Seeds: {', '.join(str(s) for s in seeds)}; cells: {len(records)} "
        f"({sum(r.get('status') == 'ok' for r in records)} ok). Cells show mean ± sample std over seeds; the "
        "worst-seed table beside each shows the worst single seed.",
        f"- delta = {DELTA:g} for every private cell. `eps spent`: for privflow's cells the PLD composition of the "
        "events the cell actually recorded (DP marginals, DP statistics, [DP prior], DP-SGD, Report-Noisy-Max; "
        "DP-MoG: DP statistics and DP-EM; copula: the one marginals release); for MST and AIM smartnoise's own zCDP "
        "accounting (rho from (epsilon, delta) by OpenDP's conversion, all of it spent).",
        "",
    ]


def _how_to_read(records: list[dict[str, Any]]) -> list[str]:
    """How to read the tables: the models present, budget rules, metrics."""
    present = sorted({r["model"] for r in records if r["model"] != REAL}, key=_model_order)
    p, m = PrivacyConfig(), MarginalsConfig()
    lines = ["## How to read this", "", "- **Models.** " + "; ".join(f"`{m}`: {MODEL_NOTES[m]}" for m in present)]
    lines[-1] += (
        ". `non-private`: the same model, data split, steps and checkpoint rule without clipping or noise. "
        "`real-data`: the nine classifiers trained on the real training table (the utility ceiling), and the real "
        "test table scored like a synthetic one against the training table (the sampling-noise floor of TV, "
        "Kendall's tau and the quality score). DP-MoG components: "
        + ", ".join(f"{k} {v}" for k, v in MOG_COMPONENTS.items())
        + "; 10 EM iterations (the config default)."
    )
    lines += [
        "- **Budget rules.** All flow models of a dataset share one configuration; the private and non-private runs "
        "differ only in noise and clipping. The plan splits epsilon as `src/privflow/core/config.py` declares "
        "(validation "
        f"gate {p.gate_share:.0%} (planned, not run here), DP statistics {p.stats_share:.0%}, selection "
        f"{p.select_share:.0%} standalone, DP marginals {m.share:.0%} when enabled, DP-SGD calibrated so the PLD "
        "composition lands within 1% under the target). Training row counts used by the planner are the public "
        "split sizes. No hyper-parameter was chosen on a test set.",
    ]
    if any(m in PEERS for m in present):
        lines.append(
            "- **Peers.** Same training split, same synthetic row count, same evaluation. Each column is handed to "
            "smartnoise pre-discretised from the PUBLIC schema (declared categories; integers, or 20 equal-width "
            "bins on the schema's transform scale, the marginal-TV bins; a null code), as a fixed code domain, so "
            "smartnoise fits no preprocessing and spends no `preprocessor_eps` (checked on every run). Rows are "
            "drawn i.i.d. from the fitted graphical model's junction tree (smartnoise's default sampler rounds "
            "counts and invents rank correlation) and decoded uniformly inside their bin on the transform scale "
            "(integers floored into the bin). MST takes the true row count as known (as published). "
            "Fitting noise is not seeded (DP), so reruns differ."
        )
    lines += [
        "- **Utility** (tables): the nine classifiers of the DP-HFlow protocol trained on a synthetic table of the "
        "training split's size and tested on the real test table; mean over the nine. **Kendall tau** RMSE/MAE: "
        "upper triangle of the numeric columns' tau matrices, synthetic vs real training table. **Marginal TV**: "
        "mean over columns of the total-variation distance over 20 public bins (categories: declared list).",
        "- **SDMetrics quality** (sdmetrics 0.32 QualityReport, metadata from the public schema): column shapes "
        "(KS / TV complements), column-pair trends (correlation / contingency similarity), overall = their mean; "
        "synthetic vs real training table; higher is better.",
        "- **Test NLL.** Only where the model's density lives in the schema codec's space (numerics scaled by the "
        "public bounds to [0, 1], integers and categoricals dequantized: a bound on a proper density), in nats per "
        "row; a copula codec's space is built from that cell's own DP marginals, so its NLL is not comparable "
        "across cells (raw cells: `nll_copula`), and MST, AIM and copula have no test NLL here. 2-D densities: "
        "DP-NF's convention, standardised coordinates (`benchmarks/datasets.py: std_nll_offset`). Lower is better.",
        "- All diagnostics here are computed on real rows: **not differentially private**, for evaluation only.",
        "",
    ]
    return lines


def _table(title: str, cols: list[tuple[str, str]], rows: list[tuple[str, str, list[str]]]) -> list[str]:
    lines = [title, "", "| model | epsilon | " + " | ".join(label for _, label in cols) + " |"]
    lines.append("|---|---|" + "---|" * len(cols))
    lines += [f"| {m} | {e} | " + " | ".join(cells) + " |" for m, e, cells in rows]
    return lines + [""]


def _dataset_sections(records: list[dict[str, Any]], summary: dict, out: Path) -> list[str]:
    """Per dataset: mean ± std over seeds, the worst seed, figures and the papers' own numbers."""
    worst = worst_seed(records)
    lines: list[str] = []
    for d in dict.fromkeys(r["dataset"] for r in records):
        kind = "2d" if d in dm.TWO_D else "tabular"
        rows = [r for r in records if r["dataset"] == d]
        n_train = next((r.get("train_rows") for r in rows if r.get("train_rows")), "?")
        n_test = next((r.get("test_rows") for r in rows if r.get("test_rows")), "?")
        lines += [f"## {d}", "", f"Train rows {n_train}, test rows {n_test}.", ""]
        keys = sorted(
            {(m, e) for (dd, m, e) in summary if dd == d}, key=lambda me: (_model_order(me[0]), _eps_key(me[1]))
        )
        mean_rows, worst_rows = [], []
        for m, e in keys:
            s, w, label = summary[(d, m, e)], worst.get((d, m, e), {}), _eps_label(e) if m != REAL else "—"
            cells = [_fmt(*s.get(k, (float("nan"), 0.0, 0)), _digits(k)) for k, _ in COLUMNS[kind]]
            mean_rows.append((m, label, cells))
            n = max((v[2] for v in s.values()), default=0)
            worst_rows.append((m, label, [str(n)] + [_num(w.get(k), _digits(k)) for k, _ in WORST_COLUMNS[kind]]))
        lines += _table("Mean ± sample std over seeds:", COLUMNS[kind], mean_rows)
        lines += _table("Worst seed:", [("seeds", "seeds"), *WORST_COLUMNS[kind]], worst_rows)
        if kind == "tabular":
            lines += utility_figures(d, summary, out.parent)
        lines += [f"- Papers' figures: {note}" for note in PAPER_NOTE.get(d, [])] + [""]
    return lines


def _target_lines(records: list[dict[str, Any]], summary: dict, targets: list[Target]) -> list[str]:
    """One line per (target, model): the number it is judged on, and met / not met."""
    worst = worst_seed(records)
    lines = [
        "| dataset | metric | target | model | judged on | value | mean ± std | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        for m in sorted({m for (d, m, e) in summary if d == t.dataset and e == t.epsilon}, key=_model_order):
            s = summary[(t.dataset, m, t.epsilon)]
            if m == REAL or t.metric not in s or (t.versus is not None and m in PEERS):
                continue
            mean, std, n = s[t.metric]
            value = worst[(t.dataset, m, t.epsilon)].get(t.metric, float("nan")) if t.every_seed else mean
            if t.spread:
                value = std if n >= t.min_seeds else float("nan")  # too few seeds: not judged, never "met"
            ref = (
                summary.get((t.dataset, t.versus, t.epsilon), {}).get(t.metric, (float("nan"),))[0]
                if t.versus
                else None
            )
            goal = f"{t.op} {t.versus} ({_num(ref, _digits(t.metric))})" if t.versus else f"{t.op} {t.bound:g}"
            judged = f"worst of {n} seeds" if t.every_seed else f"mean of {n} seeds"
            if t.spread:
                judged = f"sample std over {n} seeds" + (f" (needs {t.min_seeds})" if n < t.min_seeds else "")
            met = "met" if t.met(value, ref) else "not met"
            mark = f"{m} (peer)" if m in PEERS else m
            lines.append(
                f"| {t.dataset} | {t.metric} | {goal} | {mark} | {judged} | {_num(value, _digits(t.metric))} | "
                f"{_fmt(mean, std, n, _digits(t.metric))} | **{met}** |"
            )
    return lines


def _targets_and_failures(records: list[dict[str, Any]], summary: dict, target_set: str = "papers") -> list[str]:
    """The target set's targets, one line per model, and the cells that failed."""
    targets = TARGET_SETS[target_set]
    eps = sorted({t.epsilon for t in targets})
    lines = [f"## Targets ({target_set}), at epsilon = {', '.join(f'{e:g}' for e in eps)}, delta = {DELTA:g}", ""]
    lines += _target_lines(records, summary, targets) + [""]
    failed = [r for r in records if r.get("status") != "ok"]
    if failed:
        lines += ["## Failed cells", ""]
        for r in failed:
            lines.append(f"- {Cell(r['dataset'], r['model'], r['epsilon'], r['seed']).label}: `{r.get('error', '?')}`")
        lines.append("")
    return lines


def _raw_cells(records: list[dict[str, Any]]) -> list[str]:
    """Every cell's raw numbers, folded."""
    raw_keys = [
        "macro_f1",
        "auroc",
        "ap",
        "kendall_rmse",
        "tv_mean",
        "quality_score",
        "nll",
        "nll_encoded",
        "nll_copula",
        "epsilon_spent",
        "noise_multiplier",
        "dp_em_noise_multiplier",
        "steps",
        "chosen_step",
        "fit_seconds",
        "seconds",
        "release",
    ]
    lines = [
        "<details><summary>Every cell</summary>",
        "",
        "| dataset | model | epsilon | seed | status | " + " | ".join(raw_keys) + " |",
        "|---|---|---|---|---|" + "---|" * len(raw_keys),
    ]
    for r in sorted(records, key=lambda r: (r["dataset"], _model_order(r["model"]), _eps_key(r["epsilon"]), r["seed"])):
        vals = []
        for k in raw_keys:
            v = r.get(k)
            vals.append("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append(
            f"| {r['dataset']} | {r['model']} | {_eps_label(r['epsilon'])} | {r['seed']} | {r['status']} | "
            + " | ".join(vals)
            + " |"
        )
    lines += ["", "</details>", ""]
    return lines


def write_results(
    records: list[dict[str, Any]],
    out: Path,
    command: str,
    wall: float,
    runner: str,
    quick: bool,
    target_set: str = "papers",
) -> Path:
    """Markdown: provenance, how to read it, per-dataset tables (mean ± std over seeds and the
    worst seed), papers' figures, the targets line by line, failures, every cell's raw numbers."""
    summary = summarise(records)
    lines = _provenance(records, command, wall, runner, quick) + _how_to_read(records)
    lines += _dataset_sections(records, summary, out)
    lines += _targets_and_failures(records, summary, target_set) + _raw_cells(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
