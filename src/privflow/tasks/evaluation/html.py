"""The evaluation's ONE self-contained HTML report (`render_html`): the figures `evaluate`
computed (privflow/tasks/evaluation/report.py), laid out with their help texts, the figures'
PNGs inlined. Presentation only: nothing here reads a row. The banner at its top says the
diagnostics are NOT differentially private and for the data owner only.
"""

from __future__ import annotations

import base64
import html
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from privflow.data.schema import Schema

if TYPE_CHECKING:
    from privflow.tasks.evaluation.risk import MIAResult

BANNER = "Diagnostics for the data owner — NOT differentially private; never part of the released model or data"
RANGE_PREFIX = "fidelity/"  # the prefix of `range_fidelity`'s figures among the metrics ('fidelity/range/...')
_PER_COLUMN = tuple(f"{RANGE_PREFIX}range/{f}/" for f in ("outside", "std_ratio", "tv_fine"))  # in their own table


HELP: dict[str, str] = {
    "fidelity/tv_mean": "Mean total-variation distance of the per-column marginals (0 = identical, 1 = disjoint).",
    "fidelity/tv_max": "Worst column's total-variation distance.",
    "fidelity/tv_numeric_mean": "Mean TV over numeric columns (20 bins over the public bounds).",
    "fidelity/tv_categorical_mean": "Mean TV over categorical columns (declared categories + missing).",
    "fidelity/kendall_rmse": "RMSE between real and synthetic Kendall's tau matrices, upper "
    "triangle (DP-HFlow Table 1).",
    "fidelity/kendall_mae": "MAE between the Kendall's tau matrices (DP-HFlow Table 1).",
    "fidelity/cramers_v_rmse": "RMSE between real and synthetic Cramér's V matrices of the categorical columns.",
    "fidelity/cramers_v_mae": "MAE between the Cramér's V matrices.",
    "fidelity/range/outside_max": "Worst numeric column's share of synthetic values outside the real rows' [min, max].",
    "fidelity/range/std_ratio_worst": "Synthetic / real standard deviation of the column farthest from 1 "
    "(in log terms).",
    "fidelity/range/tv_fine_mean": "Mean TV over numeric columns on 100 bins over the real rows' own "
    "[min, max], plus an overflow bin each side.",
    "fidelity/corr/pearson_max_error": "Largest absolute difference between real and synthetic Pearson "
    "correlations (numeric columns, pairwise-complete rows).",
    "fidelity/corr/pearson_mean_error": "Mean absolute difference of the Pearson correlations, upper triangle.",
    "fidelity/corr/spearman_max_error": "Largest absolute difference between real and synthetic Spearman "
    "rank correlations.",
    "fidelity/corr/spearman_mean_error": "Mean absolute difference of the Spearman correlations, upper triangle.",
    "utility/macro_f1_mean": "Macro-F1 on the real test set, classifiers trained on synthetic data "
    "(mean over classifiers and repeats).",
    "utility/auroc_mean": "AUROC on the real test set, trained on synthetic data (of the positive class the report "
    "names; a target of more than two classes without target_positive: the one-vs-rest macro average).",
    "utility/ap_mean": "Average precision (APC) on the real test set, trained on synthetic data (positive class "
    "or one-vs-rest macro average, as AUROC).",
    "utility/real_macro_f1_mean": "Reference: macro-F1 of the same classifiers trained on the real training data.",
    "utility/real_auroc_mean": "Reference: AUROC when trained on the real training data.",
    "utility/real_ap_mean": "Reference: average precision when trained on the real training data.",
    "likelihood/heldout_nats_per_row": "Mean model log-likelihood of unseen rows (nats per row, encoded "
    "space; higher is better).",
    "likelihood/generalization_gap": "Train minus held-out mean log-likelihood (nats); large = the model "
    "prefers its training rows.",
    "risk/dcr_share_closer_to_train": "Share of synthetic rows nearer a training row than a holdout row "
    "(ties half); ~0.5 expected.",
    "risk/dcr_train_median": "Median distance of a synthetic row to its closest training row.",
    "risk/dcr_holdout_median": "Median distance of a synthetic row to its closest holdout row.",
    "risk/exact_match_train": "Share of synthetic rows that copy a training row exactly (compare "
    "with the holdout share).",
    "risk/exact_match_holdout": "Share of synthetic rows identical to a holdout row (the base rate for "
    "the line above).",
    "risk/mia_auroc": "Likelihood-threshold membership inference, AUROC (0.5 = no signal).",
    "risk/mia_tpr_at_1pct_fpr": "Membership inference: true-positive rate at 1% false-positive rate "
    "(0.01 = no signal).",
}


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:0;
 color:#1d2430;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:0 24px 48px}
.banner{background:#b3261e;color:#fff;padding:18px 24px;font-size:20px;font-weight:700;text-align:center;
 letter-spacing:.2px;border-bottom:4px solid #7a1912}
.banner small{display:block;font-size:13px;font-weight:400;margin-top:6px;opacity:.95}
h1{font-size:26px;margin:28px 0 4px}
h2{font-size:20px;margin:36px 0 10px;border-bottom:2px solid #d8dce3;padding-bottom:6px}
h3{font-size:16px;margin:22px 0 8px}
.meta{color:#555;font-size:14px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:12px;margin:18px 0}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:12px 14px}
.card .v{font-size:24px;font-weight:700} .card .k{font-size:12px;color:#555;margin-top:2px}
.card .r{font-size:12px;color:#333;margin-top:6px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:8px 0}
th,td{border:1px solid #dde1e7;padding:5px 9px;text-align:right} th{background:#eef1f5}
td.l,th.l{text-align:left} td.help{color:#555;text-align:left;max-width:560px}
figure{margin:14px 0;background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:13px;color:#444;margin-top:6px}
.note{background:#fff7e0;border-left:4px solid #e0a800;padding:8px 12px;margin:6px 0;font-size:14px}
.bar{display:inline-block;height:10px;background:#ff7f0e;vertical-align:middle}
"""


def _f(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def _img(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(Path(path).stem)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _help(key: str) -> str:
    if key in HELP:
        return HELP[key]
    name = key.split("/", 1)[-1]
    if key.startswith("likelihood/") and name.endswith("_nats_per_row"):
        return (
            f"Mean model log-likelihood of the '{name.removesuffix('_nats_per_row')}' rows (nats per row, finite rows)."
        )
    if key.startswith("likelihood/") and name.endswith("_nonfinite_share"):
        return (
            f"Share of '{name.removesuffix('_nonfinite_share')}' rows whose log-likelihood is not finite "
            "(left out of the mean)."
        )
    return ""


def _metrics_table(metrics: dict[str, float], prefix: str, skip: tuple[str, ...] = ()) -> str:
    rows = [
        f'<tr><td class="l"><code>{html.escape(k)}</code></td><td>{_f(v, 4)}</td>'
        f'<td class="help">{html.escape(_help(k))}</td></tr>'
        for k, v in metrics.items()
        if k.startswith(prefix) and not (skip and k.startswith(skip))
    ]
    if not rows:
        return ""
    return (
        '<table><tr><th class="l">metric</th><th>value</th><th class="l">meaning</th></tr>' + "".join(rows) + "</table>"
    )


def _card(value: str, name: str, ref: str = "") -> str:
    r = f'<div class="r">{html.escape(ref)}</div>' if ref else ""
    return (
        f'<div class="card"><div class="v">{html.escape(value)}</div><div class="k">{html.escape(name)}</div>{r}</div>'
    )


def _metric_labels(macro: bool) -> tuple[str, str, str]:
    """The utility metrics' column labels: one-vs-rest macro averages say so."""
    if macro:
        return "macro-F1", "macro AUROC (one-vs-rest)", "macro AP (one-vs-rest)"
    return "macro-F1", "AUROC", "AP"


def _macro(schema: Schema, metrics: dict[str, float]) -> bool:
    """Whether the utility figures are one-vs-rest macro averages (utility.scoring; False where
    utility was not measured, so scikit-learn is not imported for nothing)."""
    if schema.target is None or "utility/auroc_mean" not in metrics:
        return False
    from privflow.tasks.evaluation.utility import scoring

    return not scoring(schema).binary


def _classifier_table(table: pl.DataFrame, metrics: dict[str, float], macro: bool = False) -> str:
    syn = {r["classifier"]: r for r in table.filter(pl.col("train_on") == "synthetic").iter_rows(named=True)}
    real = {r["classifier"]: r for r in table.filter(pl.col("train_on") == "real").iter_rows(named=True)}
    head = (
        '<table><tr><th class="l" rowspan="2">classifier</th><th colspan="3">trained on synthetic</th>'
        '<th colspan="3">trained on real (reference)</th></tr><tr>'
        + "".join(f"<th>{html.escape(label)}</th>" for label in _metric_labels(macro)) * 2
        + "</tr>"
    )
    body = []
    for name, r in syn.items():
        cells = []
        for src in (r, real.get(name)):
            for m in ("macro_f1", "auroc", "ap"):
                if src is None:
                    cells.append("<td>—</td>")
                else:
                    sd = src[f"{m}_std"]
                    cells.append(f"<td>{_f(src[f'{m}_mean'])}" + (f" ± {_f(sd)}" if sd else "") + "</td>")
        body.append(f'<tr><td class="l">{html.escape(name)}</td>{"".join(cells)}</tr>')
    total = []
    for prefix in ("", "real_"):
        for m in ("macro_f1", "auroc", "ap"):
            mean, sd = metrics.get(f"utility/{prefix}{m}_mean"), metrics.get(f"utility/{prefix}{m}_std")
            total.append(f"<th>{_f(mean)} ± {_f(sd)}</th>" if mean is not None else "<th>—</th>")
    body.append(f'<tr><th class="l">all classifiers (mean ± std)</th>{"".join(total)}</tr>')
    return head + "".join(body) + "</table>"


def _column_table(columns: pl.DataFrame) -> str:
    rows = []
    for r in columns.sort("tv", descending=True, nulls_last=True).iter_rows(named=True):
        tv = r["tv"]
        w = 0 if tv is None or math.isnan(tv) else int(round(200 * tv))
        rows.append(
            f'<tr><td class="l">{html.escape(r["column"])}</td><td class="l">{html.escape(r["type"])}</td>'
            f'<td>{_f(tv)}</td><td class="l"><span class="bar" style="width:{w}px"></span></td></tr>'
        )
    return (
        '<table><tr><th class="l">column</th><th class="l">type</th><th>TV distance</th><th class="l"></th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _range_table(metrics: dict[str, float]) -> str:
    """Per numeric column: share outside the real range, std ratio, fine TV (worst share first)."""
    outside, ratio, fine = _PER_COLUMN
    names = [k.removeprefix(outside) for k in metrics if k.startswith(outside)]
    if not names:
        return ""
    names.sort(key=lambda n: -metrics[outside + n] if math.isfinite(metrics[outside + n]) else math.inf)
    rows = "".join(
        f'<tr><td class="l">{html.escape(n)}</td><td>{_pct(metrics[outside + n])}</td>'
        f"<td>{_f(metrics.get(ratio + n), 2)}</td><td>{_f(metrics.get(fine + n))}</td></tr>"
        for n in names
    )
    err = {k: _f(metrics.get(f"{RANGE_PREFIX}corr/{k}_error")) for k in ("pearson_max", "pearson_mean")}
    err |= {k: _f(metrics.get(f"{RANGE_PREFIX}corr/{k}_error")) for k in ("spearman_max", "spearman_mean")}
    corr = (
        "<p class='meta'>Correlation errors (|real − synthetic| over column pairs, pairwise-complete rows): "
        f"Pearson max {err['pearson_max']}, mean {err['pearson_mean']}; "
        f"Spearman max {err['spearman_max']}, mean {err['spearman_mean']}.</p>"
    )
    return (
        "<h3>Synthetic values against the real range (numeric columns, worst first)</h3>"
        "<p>Figures on the real training rows' own [min, max], which 20 bins over wide public bounds cannot "
        "resolve: the share of synthetic values outside the real range, the ratio of standard deviations "
        "(1 = same spread) and the TV distance on 100 equal bins over the real range (log1p scale where the "
        "schema says so), with one overflow bin each side for synthetic values outside it. Missing values "
        "are left out (the marginal TV above counts them).</p>"
        '<table><tr><th class="l">column</th><th>outside the real range</th><th>std ratio (synthetic / real)</th>'
        "<th>TV, 100 bins on the real range</th></tr>" + rows + "</table>" + corr
    )


def _pct(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _summary_cards(metrics: dict[str, float], macro: bool = False) -> list[str]:
    m = metrics.get
    cards: list[str] = []
    if "fidelity/tv_mean" in metrics:
        cards.append(_card(_f(m("fidelity/tv_mean")), "mean marginal TV distance (lower is better)"))
        cards.append(_card(_f(m("fidelity/kendall_rmse")), "Kendall's tau RMSE (lower is better)"))
    if f"{RANGE_PREFIX}range/outside_max" in metrics:
        cards.append(
            _card(
                _pct(m(f"{RANGE_PREFIX}range/outside_max")),
                "synthetic values outside the real range (worst column)",
                f"std ratio farthest from 1: {_f(m(f'{RANGE_PREFIX}range/std_ratio_worst'), 2)}",
            )
        )
    f1_label, auroc_label, _ = _metric_labels(macro)
    for key, label in (("auroc", auroc_label), ("macro_f1", f1_label)):
        if f"utility/{key}_mean" in metrics:
            cards.append(
                _card(
                    f"{_f(m(f'utility/{key}_mean'))} ± {_f(m(f'utility/{key}_std'))}",
                    f"{label}, trained on synthetic, tested on real",
                    f"trained on real: {_f(m(f'utility/real_{key}_mean'))} ± {_f(m(f'utility/real_{key}_std'))}",
                )
            )
    if "likelihood/heldout_nats_per_row" in metrics:
        cards.append(_card(_f(m("likelihood/heldout_nats_per_row"), 2), "held-out log-likelihood (nats/row)"))
    if "risk/dcr_share_closer_to_train" in metrics:
        cards.append(
            _card(
                _f(m("risk/dcr_share_closer_to_train")),
                "share of synthetic rows closer to train than holdout",
                "about 0.5 expected without memorisation",
            )
        )
    if "risk/mia_auroc" in metrics:
        cards.append(_card(_f(m("risk/mia_auroc")), "membership-inference AUROC", "0.5 = no membership signal"))

    return cards


def _fidelity_section(metrics: dict[str, float], columns: pl.DataFrame | None, paths: dict[str, Path]) -> list[str]:
    if not (any(k.startswith("fidelity/") for k in metrics) or "marginals" in paths):
        return []
    parts: list[str] = []
    parts.append("<h2>1. Fidelity: does the synthetic data look like the training data?</h2>")
    parts.append(_metrics_table(metrics, "fidelity/", skip=_PER_COLUMN))
    if "marginals" in paths:
        parts.append(
            _img(
                paths["marginals"],
                "Share of rows per bin: real training data (blue) and synthetic data "
                "(orange), as in DP-HFlow Figure 3. Numeric bins are 20 equal-width bins over the public "
                "schema bounds (log1p scale where the schema says so); categorical columns show the 12 most "
                "frequent categories, the rest grouped.",
            )
        )
    if columns is not None:
        parts.append("<h3>Marginal total-variation distance per column (worst first)</h3>" + _column_table(columns))
    parts.append(_range_table(metrics))
    if "kendall" in paths:
        parts.append(
            _img(
                paths["kendall"],
                "Pairwise Kendall's tau of the numeric columns: real, synthetic, and "
                "their difference. DP-HFlow Table 1 reports the RMSE/MAE of this difference.",
            )
        )
    if "cramers_v" in paths:
        parts.append(
            _img(
                paths["cramers_v"],
                "Pairwise Cramér's V (association strength, 0 to 1) of the "
                "categorical columns: real, synthetic, and their difference.",
            )
        )
    if "projection" in paths:
        parts.append(
            _img(
                paths["projection"],
                "2-D projection of rows encoded by the public schema (numerics scaled "
                "by their bounds, categoricals one-hot). The PCA is fitted on the synthetic rows only (the "
                "DP model's output); real rows are projected onto the same axes. Similar clouds = similar "
                "joint structure.",
            )
        )
    return parts


def _utility_section(schema: Schema, metrics: dict[str, float], classifiers: pl.DataFrame | None) -> list[str]:
    if classifiers is None:
        return []
    from privflow.tasks.evaluation.utility import scoring

    how = scoring(schema)
    parts: list[str] = []
    parts.append("<h2>2. Utility: do models trained on synthetic data work on real data?</h2>")
    parts.append(
        f"<p>Nine classifiers predict <code>{html.escape(how.target)}</code>, scored as "
        f"{html.escape(how.describe())}, trained on the "
        "synthetic table and, for reference, on the real training table; all are scored on the real test "
        "table (DP-HFlow Tables 2–3). Each cell is the mean over repeats (± std when repeats &gt; 1); "
        "the last row is the mean ± std over all classifiers and repeats.</p>"
    )
    parts.append(_classifier_table(classifiers, metrics, not how.binary))
    parts.append(
        "<p class='meta'>Metric names: <code>utility/&lt;macro_f1|auroc|ap&gt;_&lt;mean|std&gt;</code> "
        "(trained on synthetic) and <code>utility/real_…</code> (trained on real).</p>"
    )
    return parts


def _risk_section(metrics: dict[str, float], paths: dict[str, Path], mia: MIAResult | None) -> list[str]:
    if not (any(k.startswith(("likelihood/", "risk/")) for k in metrics)):
        return []
    parts: list[str] = []
    parts.append("<h2>3. Likelihood and privacy-risk checks</h2>")
    parts.append(
        "<p>Empirical checks for gross memorisation. They do not measure or replace the (ε, δ) "
        "guarantee reported by the privacy ledger.</p>"
    )
    parts.append(_metrics_table(metrics, "likelihood/"))
    parts.append(_metrics_table(metrics, "risk/"))
    if mia is not None:
        parts.append(
            f"<p class='meta'>Membership inference used {mia.members:,} member (training) rows and "
            f"{mia.non_members:,} non-member rows.</p>"
        )
    if "dcr" in paths:
        parts.append(
            _img(
                paths["dcr"],
                "Distance from each synthetic row to its closest real training row and "
                "closest real holdout row (equal-size samples). Overlapping histograms are expected; a "
                "spike at zero for training only would indicate copied rows.",
            )
        )
    if "loglik" in paths:
        parts.append(
            _img(
                paths["loglik"],
                "Per-row model log-likelihood on each split. Training rows scoring "
                "clearly higher than unseen rows indicate overfitting and membership leakage.",
            )
        )
    return parts


def render_html(
    schema: Schema,
    metrics: dict[str, float],
    classifiers: pl.DataFrame | None,
    columns: pl.DataFrame | None,
    paths: dict[str, Path],
    timings: dict[str, float],
    notes: list[str],
    rows: dict[str, int | None],
    mia: MIAResult | None = None,
) -> str:
    """The report page: banner, summary cards, then one section per diagnostic group."""
    cards = _summary_cards(metrics, _macro(schema, metrics))
    row_txt = ", ".join(f"{k}: {v:,}" for k, v in rows.items() if v is not None)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>privflow evaluation — {html.escape(schema.dataset.name)}</title><style>{_CSS}</style></head><body>",
        f'<div class="banner" role="alert">{html.escape(BANNER)}<small>These figures are computed on real rows '
        "(training and held-out). Do not publish them, attach them to the model, or share them with data "
        "recipients.</small></div>",
        "<main>",
        f"<h1>Evaluation report — dataset <code>{html.escape(schema.dataset.name)}</code></h1>",
        f'<p class="meta">Generated {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} · rows — {html.escape(row_txt)}'
        f" · computed in {timings.get('total', float('nan')):.1f} s</p>",
        f'<div class="cards">{"".join(cards)}</div>',
    ]
    parts += [f'<div class="note">{html.escape(n)}</div>' for n in notes]

    parts += _fidelity_section(metrics, columns, paths)
    parts += _utility_section(schema, metrics, classifiers)
    parts += _risk_section(metrics, paths, mia)
    parts.append(
        "<h2>Run details</h2><table><tr><th class='l'>section</th><th>seconds</th></tr>"
        + "".join(f"<tr><td class='l'>{html.escape(k)}</td><td>{v:.1f}</td></tr>" for k, v in timings.items())
        + "</table>"
    )
    parts.append(f"<p class='meta'>{html.escape(BANNER)}.</p></main></body></html>")
    return "\n".join(p for p in parts if p)


__all__ = ["BANNER", "HELP", "RANGE_PREFIX", "render_html"]
