"""The target head on its own: the shipped softmax regression against richer or longer-trained
variants, under the same DP-SGD, and non-private references (why AP stays below AIM's).

Each DP variant is trained by the project's trainer (``privacy.dp_sgd.train``: Poisson
sampling, flat clipping C = 1, noise, Adam, EMA 0.95) on the training split's public features
(``privflow.data.target_head.head_widths``: numerics through the 5-knot hat basis, one-hot
categoricals), at a noise multiplier calibrated for each epsilon of `--head-epsilon` (default 0.2:
the head's default share of a run at epsilon 1; larger ones show how much of the gap to the
non-private references is noise and how much the model's form or its training) and delta 1e-5 on
its own, and scored by AUROC and AP of its P(positive class) on the real test split. Variants,
declared before the run:

- `linear` (the shipped head: 200 steps, expected batch expected_rows / 64, lr 0.02);
- `linear, 400 steps` and `linear, batch x4, 100 steps` (Li et al.'s larger-batch advice);
- `mlp-16`, `mlp-32`: the linear head plus a tanh hidden layer of 16 / 32 units (public random
  initialisation), i.e. interactions between columns.

References without noise on the same features: logistic regression (scikit-learn, C = 1), a
one-hidden-layer network of 16 units (scikit-learn's MLPClassifier: interactions, fitted
smoothly) and histogram gradient boosting (interactions, non-private). Diagnostics on real rows:
not DP.

    .venv/bin/python -m benchmarks.bench_head [--dataset adult] [--seeds 0 1 2] [--head-epsilon 0.2 [1 ...]]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "head.md"
VARIANTS = {  # name: (hidden units, steps, batch multiplier)
    "linear (shipped)": (0, 200, 1),
    "linear, 400 steps": (0, 400, 1),
    "linear, batch x4, 100 steps": (0, 100, 4),
    "mlp-16": (16, 200, 1),
    "mlp-32": (32, 200, 1),
}


class MLPHead(nn.Module):
    """The shipped head's logits plus a tanh hidden layer's: log p(class | features)."""

    def __init__(self, widths: list[int], classes: int, hidden: int, seed: int) -> None:
        from privflow.models.softmax_head import SoftmaxHead

        super().__init__()
        self.base = SoftmaxHead(widths, classes)
        g = torch.Generator().manual_seed(seed)
        self.hidden = nn.Linear(self.base.features, hidden)
        with torch.no_grad():
            self.hidden.weight.copy_(torch.randn(hidden, self.base.features, generator=g) / self.base.features**0.5)
            self.hidden.bias.zero_()
        self.out = nn.Linear(hidden, classes)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def scores(self, x: Tensor) -> Tensor:
        e = self.base.expand(x[:, : len(self.base.widths)])
        return torch.log_softmax(self.base.linear(e) + self.out(torch.tanh(self.hidden(e))), dim=1)

    def log_prob(self, x: Tensor) -> Tensor:
        return self.scores(x).gather(1, x[:, len(self.base.widths) :].long())[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        return self.log_prob(x)


def _rows(schema: Any, df: Any, knots: int) -> np.ndarray:
    from privflow.tasks.head_stage import head_rows

    return head_rows(schema, df, knots)


def run(dataset: str, seeds: list[int], head_epsilons: list[float]) -> dict[str, list[tuple[float, float]]]:
    """(AUROC, AP) per seed of every DP variant at every epsilon ('DP: name' with ', epsilon e' added
    when there are several), then of the non-private references."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score, roc_auc_score
    from sklearn.neural_network import MLPClassifier

    from benchmarks import datasets
    from privflow.core.config import HeadConfig
    from privflow.data.features import expand_features
    from privflow.data.target_head import head_widths
    from privflow.models.softmax_head import SoftmaxHead
    from privflow.privacy.dpsgd.dp_sgd import train
    from privflow.privacy.mechanisms.dp_head import head_settings, head_shape, noise_for_epsilon

    data = datasets.load(dataset)
    schema, cfg = data.schema, HeadConfig()
    widths = head_widths(schema, cfg.numeric_knots)
    train_rows, test_rows = _rows(schema, data.train, cfg.numeric_knots), _rows(schema, data.test, cfg.numeric_knots)
    y_test = test_rows[:, -1] == test_rows[:, -1].max()
    n = int(schema.dataset.expected_rows)
    base_batch = head_shape(n, 1).sample_rate * n
    out: dict[str, list[tuple[float, float]]] = {}
    cells = [(e, name, v) for e in head_epsilons for name, v in VARIANTS.items()]
    for head_epsilon, name, (hidden, steps, mult) in cells:
        label = f"DP: {name}" + (f", epsilon {head_epsilon:g}" if len(head_epsilons) > 1 else "")
        shape = head_shape(n, steps, int(round(base_batch * mult)))
        sigma = noise_for_epsilon(head_epsilon, 1e-5, shape)
        for seed in seeds:
            model: Any = SoftmaxHead(widths, 2) if hidden == 0 else MLPHead(widths, 2, hidden, seed)
            settings = head_settings(shape, n, sigma, cfg.lr, cfg.max_grad_norm, cfg.ema_decay, noise_seed=1000 + seed)
            model.load_state_dict(train(model, torch.from_numpy(train_rows), settings).checkpoints[-1][1])
            with torch.no_grad():
                x = torch.from_numpy(test_rows)
                logp = model.scores(x) if hidden else torch.log_softmax(model.linear(model.expand(x[:, :-1])), 1)
            p = logp[:, 1].numpy()
            out.setdefault(label, []).append((roc_auc_score(y_test, p), average_precision_score(y_test, p)))
    f_train = expand_features(train_rows[:, :-1], widths)
    f_test = expand_features(test_rows[:, :-1], widths)
    for name, clf in (
        ("non-private: logistic regression", LogisticRegression(max_iter=2000)),
        ("non-private: network, 16 hidden units", MLPClassifier((16,), alpha=1e-3, max_iter=300, random_state=0)),
        ("non-private: gradient boosting", HistGradientBoostingClassifier(random_state=0)),
    ):
        p = clf.fit(f_train, train_rows[:, -1]).predict_proba(f_test)[:, 1]
        out[name] = [(roc_auc_score(y_test, p), average_precision_score(y_test, p))]
    return out


def _cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--head-epsilon", type=float, nargs="+", default=[0.2], help="one or more epsilons")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    torch.set_num_threads(1)
    results = run(args.dataset, args.seeds, args.head_epsilon)
    notes = [
        f"{args.dataset}, training split -> real test split; DP variants at epsilon "
        f"{', '.join(f'{e:g}' for e in args.head_epsilon)} (delta 1e-5) "
        f"on their own, seeds {', '.join(map(str, args.seeds))} (mean ± sample std); non-private references once.",
        "The head's own P(positive class | other columns), scored on real rows: not differentially private.",
    ]
    lines = common.header("The target head on its own: variants and references", started, load, notes, commit)
    lines += ["| head | AUROC | AP |", "| --- | ---: | ---: |"]
    for name, scores in results.items():
        lines.append(f"| {name} | {_cell([a for a, _ in scores])} | {_cell([p for _, p in scores])} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
