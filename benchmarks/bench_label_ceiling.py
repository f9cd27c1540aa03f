"""Where privflow's classifier utility is lost: the flow's features or the head's labels.

The default release samples the other columns from the flow and the target from the DP target
head given them. For each seed this fits the default run at (epsilon, 1e-5) on the benchmark's
split (benchmarks/cells.py: same data, configuration and evaluation as the peers preset), then
scores, with the nine classifiers of the DP-HFlow protocol tested on the real test table:

- `released`: the synthetic table privflow releases (flow features, head labels);
- `real features + head labels`: the REAL training rows with their target replaced by draws
  from the released head (calibrated as the sampler calibrates it): what a perfect flow could
  reach with this head, so the ceiling of any improvement to the flow alone;
- `real training table`: the real rows as they are (the ceiling of any synthesizer);
- `real features + head labels sharpened`: the same with the head's logits doubled and shifted
  back to the DP class rates: labels less noisy than the head's estimate, to see how much of a
  peer's lead above the real table's own scores such labels explain (a diagnostic; never released);
- `real features + logistic-regression labels` / `+ gradient-boosting labels`: the real rows with
  their target drawn from a NON-private model fitted on them over the head's own features (the
  same expansion): what a perfect head of the released form (a softmax regression) could give,
  and what a non-linear one could.

`head alone` is the head's own P(target | other columns) scored on the real test rows (one
classifier, not the nine). All of these read real rows: curator diagnostics, NOT differentially
private, never released.

    .venv/bin/python -m benchmarks.bench_label_ceiling [--dataset adult] [--seeds 0 1 2] [--epsilon 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LR_ROW = "real features + logistic-regression labels (non-private)"
GB_ROW = "real features + gradient-boosting labels (non-private)"
HEAD_ROW = "real features + head labels"
SHARP_ROW = "real features + head labels sharpened (logits x2, recalibrated)"
ROWS = ("released", HEAD_ROW, SHARP_ROW, LR_ROW, GB_ROW, "real training table")
METRICS = (("macro_f1", "macro-F1"), ("auroc", "AUROC"), ("ap", "AP"))


def _nine(data: Any, table: Any, seed: int) -> dict[str, float]:
    from privflow.tasks.evaluation.utility import utility

    u = utility(data.schema, table, None, data.test, repeats=1, seed=seed).metrics()
    return {"macro_f1": u["utility/macro_f1_mean"], "auroc": u["utility/auroc_mean"], "ap": u["utility/ap_mean"]}


def run_seed(bench: Any, data: Any, epsilon: float, seed: int) -> dict[str, dict[str, float]]:
    """The three tables' scores and the head's own, for one seed."""
    import polars as pl
    from sklearn.metrics import average_precision_score, roc_auc_score

    from privflow.data.target_head import TargetCodec, calibration_shift, class_labels, draw_classes

    cell = bench.Cell(data.name, "dphflow", epsilon, seed)
    model, codec, _, facts = bench.fit_model(data, cell, bench.run_config(data, cell, False))
    if not isinstance(codec, TargetCodec):
        raise SystemExit(
            f"the default run on {data.name} released no target head ({facts['release']}): nothing to split"
        )
    schema, target = data.schema, data.schema.target
    out = {"released": _nine(data, bench.sample_rows([model], codec, data.train.height, seed=seed), seed)}
    raw = codec.head_log_probs(data.train)
    for row, sharpness in ((HEAD_ROW, 1.0), (SHARP_ROW, 2.0)):
        log_probs = sharpness * raw  # x2: the head's odds squared, a less noisy label than it estimates
        if codec.rates is not None:
            log_probs = log_probs + calibration_shift(log_probs, codec.rates)
        draws = draw_classes(log_probs, np.random.default_rng(seed).random(len(log_probs)))
        relabelled = data.train.with_columns(class_labels(schema.column(target), draws).alias(target))
        out[row] = _nine(data, relabelled, seed)
    out.update(reference_labels(data, codec.head.knots, seed))
    out["real training table"] = _nine(data, data.train, seed)
    test_lp = codec.head_log_probs(data.test)
    positive = schema.column(target).categories[-1]
    y = data.test.get_column(target).cast(pl.String).to_numpy() == positive
    out["head alone"] = {
        "auroc": float(roc_auc_score(y, test_lp[:, -1])),
        "ap": float(average_precision_score(y, test_lp[:, -1])),
    }
    return out


def reference_labels(data: Any, knots: int, seed: int) -> dict[str, dict[str, float]]:
    """The nine classifiers on the real training rows relabelled by a non-private logistic
    regression and a gradient-boosting model fitted on them, over the head's features."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    from privflow.data.features import expand_features
    from privflow.data.target_head import class_count, class_labels, draw_classes, head_widths
    from privflow.tasks.head_stage import head_rows

    schema, target = data.schema, data.schema.target
    rows = head_rows(schema, data.train, knots)
    x, y = expand_features(rows[:, :-1], head_widths(schema, knots)), rows[:, -1].astype(int)
    out = {}
    for row, clf in (
        (LR_ROW, LogisticRegression(max_iter=3000)),
        (GB_ROW, HistGradientBoostingClassifier(random_state=seed)),
    ):
        p = clf.fit(x, y).predict_proba(x)
        log_probs = np.full((len(y), class_count(schema.column(target))), -np.inf)
        with np.errstate(divide="ignore"):
            log_probs[:, clf.classes_.astype(int)] = np.log(p)
        draws = draw_classes(log_probs, np.random.default_rng(seed).random(len(y)))
        relabelled = data.train.with_columns(class_labels(schema.column(target), draws).alias(target))
        out[row] = _nine(data, relabelled, seed)
    return out


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f} (min {min(values):.3f})"


def render(
    dataset: str, epsilon: float, seeds: list[int], runs: list[dict], started: datetime, load: str, commit: str
) -> str:
    notes = [
        f"Dataset {dataset}, epsilon {epsilon:g}, delta 1e-05, the default configuration (benchmarks/cells.py "
        f"`run_config`), seeds {', '.join(map(str, seeds))}; cells: mean ± sample std over seeds (min: worst seed).",
        "Nine classifiers trained on the row set, tested on the real test table (mean over the nine); `head "
        "alone`: the released head's P(positive class | other columns) on the real test rows.",
        "Curator diagnostics on real rows: NOT differentially private.",
    ]
    lines = common.header(
        "Classifier utility: the flow's features against the head's labels", started, load, notes, commit
    )
    lines += ["| rows the classifiers train on | " + " | ".join(label for _, label in METRICS) + " |"]
    lines += ["| --- |" + " ---: |" * len(METRICS)]
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(_cell([r[row][k] for r in runs]) for k, _ in METRICS) + " |")
    head = [r["head alone"] for r in runs]
    lines.append(
        "| head alone (one classifier) | — | " + " | ".join(_cell([h[k] for h in head]) for k in ("auroc", "ap")) + " |"
    )
    mean = {row: {k: statistics.mean(r[row][k] for r in runs) for k, _ in METRICS} for row in ROWS}
    gap = {k: mean[HEAD_ROW][k] - mean["released"][k] for k, _ in METRICS}
    lines += [
        "",
        "## Reading",
        "",
        "- Lost to the flow's features (real features + head labels minus released): "
        + ", ".join(f"{label} {gap[k]:+.3f}" for k, label in METRICS)
        + ". A perfect flow with this head would reach the second row, no more.",
        "- A perfect head of the released form (non-private logistic regression labels) against this one: "
        + ", ".join(f"{label} {mean[LR_ROW][k] - mean[HEAD_ROW][k]:+.3f}" for k, label in METRICS)
        + "; a non-linear label model (gradient boosting): "
        + ", ".join(f"{label} {mean[GB_ROW][k] - mean[HEAD_ROW][k]:+.3f}" for k, label in METRICS)
        + ".",
        "- Labels less noisy than the head's estimate of P(target | other columns) (its logits doubled, then "
        "shifted back to the DP class rates) against the head's own: "
        + ", ".join(f"{label} {mean[SHARP_ROW][k] - mean[HEAD_ROW][k]:+.3f}" for k, label in METRICS)
        + ". privflow releases the head's estimate as it is: a sharper label would trade the fidelity of "
        "P(target | other columns) for these scores.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "label_ceiling.md")
    args = parser.parse_args(argv)

    from privflow.core import env

    env.configure(Path(tempfile.gettempdir()) / "privflow-bench-label-ceiling", verbose=False)
    import torch

    from benchmarks import cells as bench

    torch.set_num_threads(1)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    data = bench.load_dataset(args.dataset, False, str(bench.WORK_DIR))
    runs = []
    for seed in args.seeds:
        runs.append(run_seed(bench, data, args.epsilon, seed))
        print(f"seed {seed}: " + "; ".join(f"{k}: {v}" for k, v in runs[-1].items()), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(args.dataset, args.epsilon, args.seeds, runs, started, load, commit))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
