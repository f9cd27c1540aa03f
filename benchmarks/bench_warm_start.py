"""The payoff of warm starts on Adult: public pretraining, then DP fine-tuning,
against DP training from scratch at the same epsilon, seeds and settings.

    .venv/bin/python -m benchmarks.bench_warm_start [--epsilons 0.5,1] [--seeds 0,1,2] [--workers 2]

Protocol (every choice is fixed before any figure is seen):

- public proxy: the published Adult TEST split (16,281 rows), pretrained on non-privately
  with `flows/pretrain.py`'s `pretrain_fit` (what `privflow pretrain` runs), one pretraining
  per seed; the training rows are never part of it;
- private table: the Adult TRAINING split minus a held-out evaluation part (20%, drawn once
  with a fixed seed, `HOLDOUT_SEED`) that no run trains or selects on; the test split cannot
  serve as the evaluation table since it is the public pretraining data;
- from scratch: `fit` (tasks/fit.py) with the configuration's plan, as `privflow run` trains;
- warm start: the same `fit` with `init_from` set and the pretrained weights
  (`privflow run --init-from`): its plan is the scratch plan minus the DP statistics stage,
  with the same DP-SGD noise, so it spends slightly less (the table shows the PLD epsilon
  spent);
- evaluation, NOT differentially private: a synthetic table of the private split's size
  (public) sampled with the seed, the project's nine classifiers trained on it and tested
  on the held-out real rows (mean macro-F1, AUROC, AP; tasks/evaluation/utility.py), and
  the mean per-column marginal total-variation distance to the held-out rows
  (tasks/evaluation/fidelity.py). References: the classifiers trained on the private rows
  themselves, and the pretrained model alone (no private row touched).

Writes benchmarks/results/warm_start.md with the command, commit and machine. CPU, one
torch thread per cell, `--workers` cells in parallel.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "warm_start.md"
HOLDOUT_SEED = 20261123  # the one split of the training table into private rows and held-out rows
HOLDOUT_FRACTION = 0.2
DELTA = 1e-5


@cache
def tables(work: str) -> dict[str, Any]:
    """Public (test split), private and held-out parts of Adult, and the schema of the private part."""
    import numpy as np

    from benchmarks import datasets
    from privflow.flows.pretrain import public_schema

    data = datasets.load("adult", Path(work))
    order = np.random.default_rng(HOLDOUT_SEED).permutation(data.train.height)
    cut = int(round(HOLDOUT_FRACTION * data.train.height))
    held_out, private = data.train[order[:cut].tolist()], data.train[order[cut:].tolist()]
    return {
        "public": data.test,
        "private": private,
        "held_out": held_out,
        "schema": public_schema(data.schema, private.height),  # the public size of the private split
    }


def run_config(
    seed: int, epsilon: float, config: dict[str, Any], init_from: str | None = None, lr_factor: float = 1.0
) -> Any:
    """The project's defaults (or --config's sections) with the cell's seed and epsilon."""
    from privflow.core.config import RunConfig, TrainConfig

    sections = {k: dict(v) for k, v in config.items()}
    lr = lr_factor * float(sections.get("train", {}).get("lr", TrainConfig.model_fields["lr"].default))
    sections.setdefault("train", {}).update(seed=seed, device="cpu", threads=1, lr=lr)
    sections.setdefault("privacy", {}).update(epsilon=epsilon, delta=DELTA)
    return RunConfig.build(
        data=Path("benchmark:adult"), schema_path=Path("benchmark:adult"), init_from=init_from, **sections
    )


def evaluate(synthetic: Any, t: dict[str, Any], seed: int) -> dict[str, float]:
    """Nine classifiers trained on `synthetic`, tested on the held-out rows; mean marginal TVD
    to the held-out rows. Not DP: diagnostics."""
    import numpy as np

    from privflow.tasks.evaluation.fidelity import marginal_tv
    from privflow.tasks.evaluation.utility import utility

    util = utility(t["schema"], synthetic, None, t["held_out"], repeats=1, seed=seed).metrics()
    tv = marginal_tv(t["schema"], t["held_out"], synthetic)
    return {
        "macro_f1": util["utility/macro_f1_mean"],
        "auroc": util["utility/auroc_mean"],
        "ap": util["utility/ap_mean"],
        "tvd": float(np.nanmean(list(tv.values()))),
    }


def pretrain_cell(seed: int, config: dict[str, Any], work: str) -> dict[str, Any]:
    """Non-private pretraining on the public split; returns its weights and its own scores."""
    import torch

    from privflow.flows.pretrain import pretrain_fit

    torch.set_num_threads(1)
    t = tables(work)
    started = time.perf_counter()
    fitted, _ = pretrain_fit(run_config(seed, 1.0, config), t["schema"], t["public"])
    seconds = time.perf_counter() - started
    record = {"model": "public pretraining only", "epsilon": None, "seed": seed, "eps_spent": 0.0}
    record.update(
        seconds=seconds,
        chosen_step=fitted.chosen_steps[0],
        **evaluate(fitted.sample(t["private"].height, seed=seed), t, seed),
    )
    state = {k: v.detach().clone() for k, v in fitted.states[0].items()}
    return {"record": record, "state": state}


def dp_cell(
    seed: int, epsilon: float, state: dict | None, lr_factor: float, config: dict[str, Any], work: str
) -> list[dict[str, Any]]:
    """One DP fit on the private split, from scratch (`state` None) or warm-started from `state`:
    the release Report-Noisy-Max selects, and (to see what DP training itself produced, e.g.
    when selection falls back to the start) the last checkpoint, a DP output too."""
    import torch

    from privflow.privacy.accounting.accountant import PLDAccountant
    from privflow.serving.sampler import sample_rows
    from privflow.tasks.fit import Spend, fit, model_factory, prepare
    from privflow.tasks.run_plan import run_plan

    torch.set_num_threads(1)
    t = tables(work)
    cfg = run_config(seed, epsilon, config, None if state is None else "public-pretraining", lr_factor)
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        plan, spend = run_plan(cfg, t["schema"]), Spend()
        codec, x_train, x_val = prepare(cfg, t["schema"], t["private"], plan, spend)
        fitted = fit(cfg, t["schema"], codec, x_train, x_val, plan=plan, spend=spend, init_state=state)
    seconds = time.perf_counter() - started
    model = "from scratch" if state is None else "warm start" + (f", lr x {lr_factor:g}" if lr_factor != 1 else "")
    record = {
        "model": model,
        "epsilon": epsilon,
        "seed": seed,
        "eps_spent": PLDAccountant().epsilon(fitted.events, DELTA),
        "noise_multiplier": fitted.settings.noise_multiplier,
        "lr": cfg.train.lr,
        "steps": fitted.train.steps,
        "seconds": seconds,
    }
    n = t["private"].height  # the synthetic table's size: the private split's (public) size
    last_step, last_state = fitted.train.checkpoints[-1]
    last = sample_rows([model_factory(cfg, codec)(last_state)], codec, n, seed=seed)
    return [
        {
            **record,
            "release": "selected",
            "chosen_step": fitted.chosen_steps[0],
            **evaluate(fitted.sample(n, seed), t, seed),
        },
        {**record, "release": "last checkpoint", "chosen_step": last_step, **evaluate(last, t, seed)},
    ]


def real_cell(seed: int, work: str) -> dict[str, Any]:
    """The ceiling: classifiers trained on the private rows themselves."""
    t = tables(work)
    started = time.perf_counter()
    scores = evaluate(t["private"], t, seed)
    return {
        "model": "real private rows",
        "epsilon": None,
        "seed": seed,
        "seconds": time.perf_counter() - started,
        **scores,
    }


# ---------------------------------------------------------------------------- the report

METRICS = (("macro_f1", "macro-F1"), ("auroc", "AUROC"), ("ap", "AP"), ("tvd", "marginal TVD"))


def _stats(values: list[float]) -> str:
    import numpy as np

    a = np.array([v for v in values if v is not None], dtype=np.float64)
    if a.size == 0:
        return "—"
    return f"{a.mean():.3f} ± {a.std(ddof=1):.3f}" if a.size > 1 else f"{a.mean():.3f}"


def _git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        code = ("benchmarks/bench_warm_start.py", "benchmarks/datasets.py", "src/privflow")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *code)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" (with uncommitted changes to the code it runs)" if dirty else "")


def _group(records: list[dict[str, Any]], model: str, eps: float | None, release: str | None) -> list[dict]:
    return [r for r in records if r["model"] == model and r["epsilon"] == eps and r.get("release") == release]


def report(
    records: list[dict[str, Any]],
    command: str,
    commit: str,
    wall: float,
    workers: int,
    t: dict[str, Any],
    config: dict[str, Any],
) -> str:
    head = ["model", "epsilon", "release"] + [label for _, label in METRICS] + ["eps spent (PLD)", "seconds"]
    dp_models = sorted(
        {r["model"] for r in records if r["epsilon"] is not None}, key=lambda m: (m != "from scratch", m)
    )
    warm_models = [m for m in dp_models if m != "from scratch"]
    epsilons = sorted({r["epsilon"] for r in records if r["epsilon"] is not None})
    order: list[tuple[str, float | None, str | None]] = [
        ("real private rows", None, None),
        ("public pretraining only", None, None),
    ]
    order += [(m, e, rel) for e in epsilons for m in dp_models for rel in ("selected", "last checkpoint")]
    lines = [
        "# Warm starts on Adult: public pretraining, then DP fine-tuning",
        "",
        "Generated by `benchmarks/bench_warm_start.py`.",
        "",
        f"- Command: `{command}`",
        f"- Commit: `{commit}` (when the run started)",
        f"- Date (UTC): {datetime.now(UTC):%Y-%m-%d %H:%M}; machine: {platform.machine()}, {os.cpu_count()} CPU "
        f"cores (shared), torch on CPU with 1 thread per cell, {workers} cells in parallel; wall time "
        f"{wall / 60:.1f} min.",
        f"- Rows: public proxy = the published Adult test split ({t['public'].height} rows, pretraining only); "
        f"private = the training split minus a held-out part ({t['private'].height} rows); held-out evaluation "
        f"rows = {t['held_out'].height} ({HOLDOUT_FRACTION:.0%} of the training split, seed {HOLDOUT_SEED}), never "
        "trained or selected on by any run. The test split cannot be the evaluation table here: it is the "
        "public pretraining data.",
        f"- Seeds: {', '.join(str(s) for s in sorted({r['seed'] for r in records}))} (model initialisation, "
        "selection split, sampling and classifiers; the pretraining of seed s warm-starts the runs of seed s). "
        f"delta = {DELTA:g}. Cells: mean ± sample std over seeds.",
        "- Settings: the project's defaults (DP-HFlow, 4 blocks, 64 hidden, batch 512, 8 epochs, DP-Adam lr 3e-3, "
        "per-layer clipping C = 1, Report-Noisy-Max over the checkpoints with the start competing)"
        + (f", with these sections overridden by --config: `{config}`" if config else "")
        + ", the same for every run; `warm start, lr x f` is the warm start with the learning rate times f "
        "(a fine-tuning variant declared before the run, not tuned). The pretraining runs the same model, batch "
        "size and epochs without clipping or noise, selecting its checkpoint by argmax (`privflow pretrain`).",
        "- Release: `selected` is what `privflow run` releases (the checkpoint Report-Noisy-Max picks; step 0 is "
        "the starting weights: for a warm start, the public model itself); `last checkpoint` is the DP-SGD "
        "iterate average at the last step, also a DP output, shown to tell what DP training itself produced.",
        "- Budget: a warm start's plan is the from-scratch plan minus the DP statistics stage (the parent's "
        "actnorm is kept; tasks/run_plan.py), so DP-SGD has exactly the same noise and the run spends a little "
        "less (`eps spent`). The public pretraining costs nothing.",
        "- Utility: the nine classifiers of the DP-HFlow protocol trained on a synthetic table of the private "
        "split's size and tested on the held-out real rows (mean over the nine). Marginal TVD: mean over columns "
        "of the total-variation distance between synthetic and held-out marginals (lower is better). "
        "Diagnostics on real rows: not differentially private.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for model, eps, release in order:
        cell = _group(records, model, eps, release)
        if not cell:
            continue
        spent = "—" if model == "real private rows" else _stats([r.get("eps_spent") for r in cell])
        values = [_stats([r[k] for r in cell]) for k, _ in METRICS]
        seconds = f"{sum(r['seconds'] for r in cell) / len(cell):.0f}"
        label = "—" if eps is None else f"{eps:g}"
        lines.append("| " + " | ".join([model, label, release or "—", *values, spent, seconds]) + " |")
    lines += [
        "",
        "Paired by seed, released models (`selected`): warm start minus from scratch; positive is better for "
        "F1/AUROC/AP, negative for TVD.",
        "",
        "| warm start | epsilon | " + " | ".join(label for _, label in METRICS) + " | picks of step 0 |",
        "|" + "---|" * (len(METRICS) + 3),
    ]
    for model in warm_models:
        for eps in epsilons:
            warm = {r["seed"]: r for r in _group(records, model, eps, "selected")}
            scratch = {r["seed"]: r for r in _group(records, "from scratch", eps, "selected")}
            seeds = sorted(set(warm) & set(scratch))
            diffs = [_stats([warm[s][k] - scratch[s][k] for s in seeds]) for k, _ in METRICS]
            fallbacks = f"{sum(warm[s]['chosen_step'] == 0 for s in seeds)} of {len(seeds)}"
            lines.append(f"| {model} | {eps:g} | " + " | ".join(diffs) + f" | {fallbacks} |")
    detail = ["model", "epsilon", "release", "seed", "macro_f1", "auroc", "ap", "tvd", "eps_spent"]
    detail += ["noise_multiplier", "lr", "steps", "chosen_step", "seconds"]
    lines += [
        "",
        "<details><summary>Every cell</summary>",
        "",
        "| " + " | ".join(detail) + " |",
        "|" + "---|" * len(detail),
    ]
    key = lambda r: (r["model"], r["epsilon"] or 0, r.get("release") or "", r["seed"])  # noqa: E731
    for r in sorted(records, key=key):
        cells = ["" if r.get(k) is None else f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in detail]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="0.5,1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warm-lr-factors", default="1,0.1", help="warm starts with the learning rate times each")
    parser.add_argument("--config", type=Path, default=None, help="RunConfig sections (YAML) for every run")
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "privflow-benchmark"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    import yaml

    from privflow.core import env

    env.configure(verbose=False)  # offline, quiet settings before prefect and mlflow are imported (by the workers too)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    factors = [float(f) for f in args.warm_lr_factors.split(",")]
    config = yaml.safe_load(args.config.read_text()) if args.config else {}
    command = "python -m benchmarks.bench_warm_start " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    commit, started = _git_commit(), time.perf_counter()  # the code the run imports, read at its start
    records: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        pretrained = {s: pool.submit(pretrain_cell, s, config, args.work_dir) for s in seeds}
        jobs = [pool.submit(real_cell, s, args.work_dir) for s in seeds]
        jobs += [pool.submit(dp_cell, s, e, None, 1.0, config, args.work_dir) for s in seeds for e in epsilons]
        for s in seeds:
            done = pretrained[s].result()
            records.append(done["record"])
            print(f"pretrained seed {s}: {done['record']}", flush=True)
            jobs += [
                pool.submit(dp_cell, s, e, done["state"], f, config, args.work_dir) for e in epsilons for f in factors
            ]
        for job in jobs:
            done = job.result()
            records.extend(done if isinstance(done, list) else [done])
            print(done, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        report(
            records, command.strip(), commit, time.perf_counter() - started, args.workers, tables(args.work_dir), config
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
