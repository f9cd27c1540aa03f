"""Fixed overhead of `privflow run` against its work, and the time to an error caught up front
("Fast at every size": targets fixed overhead < 10 s, early error < 5 s).

The real CLI path: ``privflow run`` on the first ``--rows`` rows of the demo table (schema
``expected_rows`` set to that number) with a tiny public configuration (1 epoch, DP-SGD always
trained, fidelity diagnostics only, ``--promote always`` so that runs stay comparable), in a
fresh subprocess per run. Each run's child is this script in ``--child`` mode: it puts timing
wrappers around module attributes the CLI and the train flow look up at call time (the
pre-flight function, ``privflow.core.env`` hooks the CLI calls just before and after it imports the
flow, the pipeline's steps in ``privflow.flows.pipeline``, each step's function and the runner's call
of it (``privflow.flows.steps``: the Prefect task run, or the plain call in process), Great
Expectations' ``get_context``), then calls ``privflow.cli.main()``. Nothing in the package is
edited; the wrappers only read the clock (``time.monotonic``: one clock for parent and child,
so the interpreter's start and the exit after ``main`` returns, with Prefect's atexit shutdown
of its temporary server and the CLI's early end of the process, are measured from the parent).

Work is what grows with the data: validation (the Great Expectations suite and the checks,
less GX's import and context), training (``prepare`` + ``fit`` less the Prefect task
overhead inside them and the privacy accounting), sampling (``FitResult.sample``) and
evaluation (the ``evaluate`` task's function). Fixed overhead is everything else, end to end.

Runs, for each of ``--modes`` (``server``: ``privflow run --engine prefect``, Prefect's temporary server,
the flow and its task runs; ``standing-server``: the default CLI with PREFECT_API_URL pointing at
a ``prefect server start`` this script starts once beforehand, as a deployment's runs meet it;
``no-server``: the default CLI with no Prefect API configured, the same pipeline in process):
the first in a new store (MLflow, and Prefect with a server, create their databases), then
``--warm`` more in the same store, then once the full run with the real console script without
the wrappers (their own cost is the difference); last, ``--errors`` times the real console
script ``privflow run`` with a missing data file (exit 2).

    .venv/bin/python -m benchmarks.bench_overhead [--rows 2000] [--warm 2] [--errors 5] \
        [--modes server,standing-server,no-server] [--out benchmarks/results/overhead.md]
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python benchmarks/x.py), not with -m: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_common as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "src" / "privflow" / "demo"
PRIVFLOW = Path(sys.executable).parent / "privflow"
TINY_CONFIG = """\
# bench_overhead.py: a tiny public configuration, so that the work is small next to the overhead
train: {epochs: 1, min_effective_batch: 0}
evaluate: {fidelity: true, utility: false, likelihood: false, privacy_risk: false, report: false}
"""
TARGET_OVERHEAD_S, TARGET_ERROR_S = 10.0, 5.0

# ---------------------------------------------------------------------------------------- child


def _now() -> tuple[float, float]:
    """(monotonic wall clock, CPU seconds of this process, all threads)."""
    return time.monotonic(), common.cpu_seconds()


class Timeline:
    """Spans [name, wall0, wall1, cpu0, cpu1], marks [wall, cpu], and per-task [wall, cpu] totals
    of the task call (Prefect engine included) and of the task's function."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[float, float]] = {"child_main": _now()}
        self.spans: list[tuple[str, float, float, float, float]] = []
        self.task_call: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.task_fn: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.extra: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        self.marks[name] = _now()

    def add(self, name: str, t0: float, c0: float) -> None:
        """Close the span `name` opened at (t0, c0)."""
        t1, c1 = _now()
        self.spans.append((name, t0, t1, c0, c1))

    def wrap(self, name: str, fn: Callable[..., Any], into: str = "span") -> Callable[..., Any]:
        """`fn` timed into a span (default), a task's call total ("call") or its function's ("fn")."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = _now()
            try:
                return fn(*args, **kwargs)
            finally:
                if into == "span":
                    self.add(name, t0, c0)
                else:
                    t1, c1 = _now()
                    total = self.task_call[name] if into == "call" else self.task_fn[name]
                    total[0] += t1 - t0
                    total[1] += c1 - c0

        return timed

    def dump(self, path: str) -> None:
        doc = {
            "marks": self.marks,
            "spans": self.spans,
            "task_call": self.task_call,
            "task_fn": self.task_fn,
            "extra": self.extra,
        }
        Path(path).write_text(json.dumps(doc))


def _time_step_calls(timeline: Timeline, names: set[str]) -> None:
    """Each runner's call of the steps `names` timed as the task call: the Prefect engine included
    under Prefect, the plain call in process (flows/steps.py). The steps' functions are timed
    wrappers (functools.wraps: the runner finds their options), which the Prefect task calls."""
    from privflow.flows import steps

    def timed_call(call: Callable[..., Any]) -> Callable[..., Any]:
        def runner_call(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            name = getattr(fn, "__name__", "")
            if name not in names:
                return call(self, fn, *args, **kwargs)
            return timeline.wrap(name, functools.partial(call, self, fn), "call")(*args, **kwargs)

        return runner_call

    for runner in (steps.LocalRunner, steps.PrefectRunner):
        runner.__call__ = timed_call(runner.__call__)  # type: ignore[method-assign]


def _instrument_flow(tl: Timeline) -> None:
    """Wrap the train pipeline's steps; called once the CLI has imported the pipeline (and, with
    a Prefect server, privflow.flows.train, the flow that runs it)."""
    import mlflow

    from privflow.data.validation import table as validation_table
    from privflow.flows import pipeline
    from privflow.tasks import fit, mlflow_store

    for name in ("_reserve", "resolve_parent", "keyed_fingerprint", "curator_dir", "_read_and_gate", "prepare"):
        setattr(pipeline, name, tl.wrap(name, getattr(pipeline, name)))
    for name in ("fit", "_account", "_release_table", "_diagnose", "_register", "_compare_with_holder"):
        setattr(pipeline, name, tl.wrap(name, getattr(pipeline, name)))
    for name in ("tracking", "experiment_for", "log_run_header", "log_synthetic"):
        setattr(mlflow_store, name, tl.wrap(f"mlflow.{name}", getattr(mlflow_store, name)))
    mlflow.start_run = tl.wrap("mlflow.start_run", mlflow.start_run)
    pipeline_steps = ("plan_privacy", "validate_data", "evaluate_run", "register_model")
    fit_steps = ("dp_marginal_codec", "encode_rows", "dp_statistics", "dp_prior", "train_flow_model")
    fit_steps += ("select_checkpoints",)
    for module, names in ((pipeline, pipeline_steps), (fit, fit_steps)):
        for name in names:
            setattr(module, name, tl.wrap(name, getattr(module, name), "fn"))
    _time_step_calls(tl, {*pipeline_steps, *fit_steps})
    fit.cumulative_epsilon = tl.wrap("cumulative_epsilon", fit.cumulative_epsilon)
    fit.FitResult.sample = tl.wrap("sample", fit.FitResult.sample)
    run_gx = validation_table.run_gx

    def gx_imported_first(*args: Any, **kwargs: Any) -> Any:
        """Great Expectations is imported where privflow imports it (here, first); its context timed."""
        t0, c0 = _now()
        import great_expectations as gx

        tl.add("gx.import", t0, c0)
        if not hasattr(gx.get_context, "__wrapped__"):
            gx.get_context = tl.wrap("gx.get_context", gx.get_context)
        return run_gx(*args, **kwargs)

    validation_table.run_gx = gx_imported_first


def child(timeline_path: str, cli_args: list[str]) -> int:
    """Run `privflow <cli_args>` in this process with the wrappers installed; write the timeline."""
    tl = Timeline()
    t0, c0 = _now()
    import privflow.cli as cli
    from privflow.core import env

    tl.add("import privflow.cli", t0, c0)
    set_verbosity, quiet_imported = env.set_verbosity, env.quiet_imported

    def after_verbosity(verbose: bool) -> None:
        # Registered once main() has armed its fast exit (privflow/core/startup.py, `FastExit`, the
        # first handler, run last) and before Prefect or MLflow register theirs: this mark is
        # taken after every handler but that last one, which ends the process.
        if not tl.extra.get("exit_mark"):
            tl.extra["exit_mark"] = True
            atexit.register(lambda: Path(timeline_path + ".exit").write_text(json.dumps(_now())))
        set_verbosity(verbose)
        from privflow import preflight as module

        inner = module.preflight

        def timed_preflight(config: Any) -> Any:
            t0, c0 = _now()
            try:
                checked = inner(config)
                tl.extra["preflight_checks"] = dict(getattr(checked, "timings", {}) or {})
                return checked
            finally:
                tl.add("preflight", t0, c0)

        module.preflight = timed_preflight

    def after_flow_import(verbose: bool) -> None:
        tl.mark("flow_imported")
        _instrument_flow(tl)
        quiet_imported(verbose)
        tl.mark("flow_called")

    env.set_verbosity, env.quiet_imported = after_verbosity, after_flow_import
    from privflow.cli import run as run_command  # the module whose `run` prints the summary

    run_command.print_summary = tl.wrap("print_summary", run_command.print_summary)
    sys.argv = ["privflow", *cli_args]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        tl.mark("main_returned")
        tl.dump(timeline_path)
    return code


# ---------------------------------------------------------------------------------------- parent


def _span(tl: dict[str, Any], name: str, k: int) -> float:
    """Total wall (k=0) or CPU (k=1) seconds of the spans called `name`."""
    return sum(sp[2] - sp[1] if k == 0 else sp[4] - sp[3] for sp in tl["spans"] if sp[0] == name)


def _first(tl: dict[str, Any], name: str) -> tuple[float, float] | None:
    """(wall, cpu) at the start of the first span called `name`."""
    starts = [(sp[1], sp[3]) for sp in tl["spans"] if sp[0] == name]
    return min(starts) if starts else None


def breakdown(
    tl: dict[str, Any], last: tuple[float, float], spawned: float, exited: float, run_cpu: float
) -> dict[str, Any]:
    """Work and fixed overhead of one wrapped run, each as [wall s, CPU s] (module docstring).

    `last` is (wall, CPU) of the child at its last atexit handler, after Prefect stopped its
    server; `run_cpu` is the CPU of the whole process tree, so the server process's CPU is
    `run_cpu` less the child's own.
    """
    m, call, fn = tl["marks"], tl["task_call"], tl["task_fn"]
    fit_tasks = ("dp_marginal_codec", "encode_rows", "dp_statistics", "dp_prior", "train_flow_model")
    fit_tasks += ("select_checkpoints",)
    out: dict[str, Any] = {"work": {}, "overhead": {}, "task_overhead": {}, "total": [0.0, 0.0], "fixed": [0, 0]}
    for k in (0, 1):

        def span(name: str, k: int = k) -> float:
            return _span(tl, name, k)

        task_overhead = {t: call[t][k] - fn.get(t, [0.0, 0.0])[k] for t in call}
        gx_setup = span("gx.import") + span("gx.get_context")
        work = {
            "validation": fn.get("validate_data", [0.0, 0.0])[k] - gx_setup,
            "training": span("prepare")
            + span("fit")
            - sum(task_overhead.get(t, 0.0) for t in fit_tasks)
            - span("cumulative_epsilon"),
            "sampling (and writing the table)": span("_release_table") - span("mlflow.log_synthetic"),
            "evaluation": fn.get("evaluate_run", [0.0, 0.0])[k],
        }
        first_pf = _first(tl, "preflight") or m["main_returned"]
        preflight_end = first_pf[k] + span("preflight")
        tracking = _first(tl, "mlflow.tracking")
        wrappers = m["flow_called"][k] - m["flow_imported"][k]  # this script's own instrumentation
        total = (exited - spawned if k == 0 else run_cpu) - wrappers
        overhead = {
            "interpreter start": m["child_main"][0] - spawned if k == 0 else m["child_main"][1],
            "import privflow.cli": span("import privflow.cli"),
            "CLI start (arguments, settings, config)": first_pf[k] - m["child_main"][k] - span("import privflow.cli"),
            "pre-flight": span("preflight"),
            "import of the flow stack (torch, MLflow, ...; Prefect and its server spawned only with a server)": m[
                "flow_imported"
            ][k]
            - preflight_end,
            "Prefect flow start (waiting for its temporary server, Great Expectations imported meanwhile; flow run)": (
                tracking[k] - m["flow_called"][k]
            )
            if tracking
            else 0,
            "MLflow setup (tracking, experiment, run, header)": sum(
                span(f"mlflow.{n}") for n in ("tracking", "experiment_for", "start_run", "log_run_header")
            ),
            "plan + ledger reservation + keyed fingerprint": span("_reserve")
            + span("keyed_fingerprint")
            - task_overhead.get("plan_privacy", 0.0),
            "Great Expectations import + context": gx_setup,
            "Prefect task overhead (all tasks)": sum(task_overhead.values()),
            "privacy accounting (epsilon curve, settle, MLflow metrics)": span("cumulative_epsilon") + span("_account"),
            "MLflow: synthetic table artifact": span("mlflow.log_synthetic"),
            "MLflow registration (model, version, alias)": span("_register") - task_overhead.get("register_model", 0),
            "summary print": span("print_summary"),
            "exit (Prefect server shutdown, atexit handlers)": last[k] - m["main_returned"][k],
            "interpreter teardown (wall) / teardown and Prefect's server process over the whole run (CPU)": (
                exited - last[0] if k == 0 else run_cpu - last[1]
            ),
        }
        overhead["other (flow bookkeeping, state changes)"] = total - sum(work.values()) - sum(overhead.values())
        for group, values in (("work", work), ("overhead", overhead), ("task_overhead", task_overhead)):
            for name, v in values.items():
                out[group].setdefault(name, [0.0, 0.0])[k] = v
        out["total"][k] = total
        out["fixed"][k] = total - sum(work.values())
    out["preflight_checks"] = tl["extra"].get("preflight_checks", {})
    return out


def _write_inputs(tmp: Path, rows: int) -> tuple[Path, Path, Path]:
    """The demo table's first `rows` rows, its schema with expected_rows = rows, the tiny config."""
    import yaml

    lines = (DEMO / "adult_train.csv").read_text().splitlines(keepends=True)
    data = tmp / f"adult-{rows}.csv"
    data.write_text("".join(lines[: rows + 1]))
    doc = yaml.safe_load((DEMO / "adult.yaml").read_text())
    doc["dataset"]["expected_rows"] = rows
    schema = tmp / "adult-slice.yaml"
    schema.write_text(yaml.safe_dump(doc, sort_keys=False))
    config = tmp / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    return data, schema, config


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed_process(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float, int, str]:
    """(spawned, exited) on the monotonic clock, the CPU seconds of the process tree, the exit
    status and the output's tail. Output goes to a file, not a pipe, so `exited` is when the
    process ends (what a shell waits for), not when the last holder of a pipe closes it."""
    log = cwd / "process-output.txt"
    with log.open("w") as out:
        c0, spawned = _children_cpu(), time.monotonic()
        code = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).wait()
        exited, cpu = time.monotonic(), _children_cpu() - c0
    return spawned, exited, cpu, code, log.read_text().strip()[-600:]


def _env_for(store: Path) -> dict[str, str]:
    """A clean environment for a child: the store's own Prefect home, nothing inherited from ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PRIVFLOW_", "MLFLOW_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # Python's default: compiled modules cached (render's note)
    env["PRIVFLOW_HOME"] = str(store)
    # the store's own accounting cache (privacy/accounting/composed_cache.py), empty before its first run
    env["PRIVFLOW_ACCOUNTING_CACHE"] = str(store.parent / f"{store.name}-composed-epsilons.sqlite")
    return env


MODES = {
    "server": "`--engine prefect` (a temporary Prefect server, the flow and its task runs)",
    "standing-server": "the default with PREFECT_API_URL set to a `prefect server start` already running (started "
    "once before the runs, as the server a deployment's runs report to; its CPU is not counted in the runs')",
    "no-server": "the default with no Prefect API configured (the same pipeline in process, no Prefect engine or "
    "server; `--engine local` forces it when PREFECT_API_URL is set)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_standing_server(tmp: Path, timeout: float = 180.0) -> tuple[subprocess.Popen[bytes], str]:
    """`prefect server start` on loopback with its own PREFECT_HOME, offline and quiet; returns the
    process and its API URL once /api/health answers."""
    port = _free_port()
    env = _env_for(tmp / "prefect-standing")
    env.update(
        PREFECT_HOME=str(tmp / "prefect-standing"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        DO_NOT_TRACK="1",
    )
    cmd = [str(PRIVFLOW.parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with (tmp / "prefect-server.txt").open("w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (tmp / "prefect-server.txt").read_text()[-600:]
            raise SystemExit(f"prefect server start exited {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:  # noqa: S310 - loopback
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"prefect server start did not answer at {url} within {timeout:g} s")


def _mode_runs(tmp: Path, mode: str, run_args: list[str], warm: int) -> dict[str, Any]:
    """One mode's wrapped runs (a new store, then `warm` more in it) and one unwrapped run."""
    if mode != "standing-server":
        return _runs_in(tmp, mode, run_args, warm, {})
    proc, url = _start_standing_server(tmp)
    try:
        return _runs_in(tmp, mode, run_args, warm, {"PREFECT_API_URL": url})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _runs_in(tmp: Path, mode: str, run_args: list[str], warm: int, extra_env: dict[str, str]) -> dict[str, Any]:
    store = tmp / f"store-{mode}"
    args = [*run_args, "--store", str(store)] + (["--engine", "prefect"] if mode == "server" else [])
    env = {**_env_for(store), **extra_env}
    runs = []
    for k in range(1 + warm):
        timeline = tmp / f"timeline-{mode}-{k}.json"
        cmd = [sys.executable, __file__, "--child", str(timeline), *args]
        spawned, exited, cpu, code, tail = _timed_process(cmd, tmp, env)
        if code != 0:
            raise SystemExit(f"{mode} run {k} exited {code}: {tail}")
        last = tuple(json.loads(Path(str(timeline) + ".exit").read_text()))
        runs.append(breakdown(json.loads(timeline.read_text()), last, spawned, exited, cpu))
        print(json.dumps({"mode": mode, **runs[-1]}), file=sys.stderr, flush=True)
    spawned, exited, cpu, code, tail = _timed_process([str(PRIVFLOW), *args], tmp, env)
    if code != 0:
        raise SystemExit(f"unwrapped {mode} run exited {code}: {tail}")
    return {"runs": runs, "unwrapped": (exited - spawned, cpu)}


def main(argv: list[str] | None = None) -> int:
    """Parent: the wrapped runs and the unwrapped run of each mode, the early errors; writes the
    Markdown file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=2, help="wrapped runs after the first, in the same store")
    ap.add_argument("--errors", type=int, default=5, help="early-error runs (missing data file)")
    ap.add_argument("--modes", default="server,standing-server,no-server", help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "overhead.md")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child[0], args.child[1:])
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes takes {', '.join(MODES)}")
    started, load_before, commit = datetime.now(UTC), common.load_average(), common.git_commit()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        data, schema, config = _write_inputs(tmp, args.rows)
        run_args = ["run", "--data", str(data), "--schema", str(schema), "--config", str(config)]
        run_args += ["--epsilon", "1", "--delta", "1e-5", "--promote", "always", "--quiet"]
        results = {mode: _mode_runs(tmp, mode, run_args, args.warm) for mode in modes}
        missing = ["run", "--data", str(tmp / "missing.csv"), "--schema", str(DEMO / "adult.yaml")]
        missing += ["--store", str(tmp / "store-error"), "--quiet"]
        env = _env_for(tmp / "store-error")
        errors: list[tuple[float, float, int]] = []
        messages: set[str] = set()
        for _ in range(args.errors):
            spawned, exited, cpu, code, tail = _timed_process([str(PRIVFLOW), *missing], tmp, env)
            errors.append((exited - spawned, cpu, code))
            messages.add(" ".join(tail.split())[:240])
        baseline = []
        for _ in range(3):
            spawned, exited, _, _, _ = _timed_process([sys.executable, "-c", "pass"], tmp, env)
            baseline.append(exited - spawned)
    text = render(args, results, errors, sorted(messages), statistics.median(baseline), (started, load_before, commit))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


def _pair(v: list[float], bold: bool = False) -> str:
    text = f"{v[0]:.2f} | {v[1]:.2f}"
    return " | ".join(f"**{x}**" for x in text.split(" | ")) if bold else text


def _table(runs: list[dict[str, Any]]) -> list[str]:
    """One mode's runs: wall and CPU seconds per item."""
    heads = " | ".join(f"run {k + 1}{' (new store)' if k == 0 else ''} wall | CPU" for k in range(len(runs)))
    lines = [f"| seconds | {heads} |", "| --- | " + " | ".join("---: | ---:" for _ in runs) + " |"]
    lines.append("| **end to end** | " + " | ".join(_pair(r["total"], True) for r in runs) + " |")
    lines.append(
        "| **work** | "
        + " | ".join(_pair([sum(v[i] for v in r["work"].values()) for i in (0, 1)], True) for r in runs)
        + " |"
    )
    for key in runs[0]["work"]:
        lines.append(f"| - {key} | " + " | ".join(_pair(r["work"][key]) for r in runs) + " |")
    lines.append("| **fixed overhead** | " + " | ".join(_pair(r["fixed"], True) for r in runs) + " |")
    for key in runs[0]["overhead"]:
        lines.append(f"| - {key} | " + " | ".join(_pair(r["overhead"][key]) for r in runs) + " |")
    return lines


def render(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    errors: list[tuple[float, float, int]],
    messages: list[str],
    python_start: float,
    when: tuple[datetime, str, str],
) -> str:
    """The results file: wall and CPU seconds per item for every run of every mode, and the verdicts."""
    notes = [
        f"`privflow run` on the first {args.rows:,} rows of src/privflow/demo/adult_train.csv (schema expected_rows "
        f"{args.rows:,}), epsilon 1, delta 1e-5, `--promote always`, `--quiet`, config `"
        + TINY_CONFIG.splitlines()[1]
        + "`, `"
        + TINY_CONFIG.splitlines()[2]
        + "`.",
        "Modes: " + "; ".join(f"**{m}**: {MODES[m]}" for m in results) + ".",
        "In each mode run 1 uses a new store (MLflow, and Prefect with a server, create their databases) and an "
        "empty accounting cache (privacy/accounting/composed_cache.py: its plan is composed, as a first run's is); "
        "later "
        "runs reuse both (the same plan is looked up). Every run is a fresh process, as a CLI call is, with "
        "Python's default of caching "
        "compiled modules (this machine's shell sets PYTHONDONTWRITEBYTECODE=1, which the runs do not inherit: "
        "compiling privflow's own modules has a cost per run, paid by the first run only).",
        "Wall: seconds on the clock. CPU: seconds of CPU used by the run's process (all threads); the last row's "
        "CPU adds Prefect's temporary server process over the whole run (it runs beside the CLI; a standing "
        "server's CPU is not counted). On a busy "
        "machine wall exceeds CPU by the time spent waiting for a core; CPU is the better guide to what an idle "
        "machine would show. Interpreter teardown is the wall time after the last atexit handler but the CLI's "
        "own (Prefect's server already stopped) until the process ends: the CLI ends the process there "
        "(privflow/core/startup.py, `FastExit`) instead of freeing the imported modules one by one.",
        f"`python -c pass` takes {python_start:.2f} s wall here (median of 3).",
    ]
    lines = common.header("Fixed overhead of privflow run, and the time to an early error", *when[:2], notes, when[2])
    for mode, result in results.items():
        runs = result["runs"]
        lines += ["", f"### {mode}: {MODES[mode]}", ""]
        lines += _table(runs)
        task_names = sorted(runs[0]["task_overhead"])
        if task_names:
            lines += [
                "",
                "Prefect overhead per task (task call less its function), wall seconds per run: "
                + "; ".join(
                    f"{t} " + "/".join(f"{r['task_overhead'].get(t, [0, 0])[0]:.2f}" for r in runs) for t in task_names
                )
                + ".",
            ]
        unwrapped = result["unwrapped"]
        lines += [
            "",
            "Pre-flight's own checks (its timings, run 1), wall seconds: "
            + ", ".join(f"{k} {v:.2f}" for k, v in runs[0]["preflight_checks"].items())
            + ".",
            "",
            f"The same run through the real console script `privflow` without the wrappers (store already used): "
            f"{unwrapped[0]:.1f} s wall, {unwrapped[1]:.1f} s CPU end to end (wrapped runs on the same store: "
            + ", ".join(f"{r['total'][0]:.1f} s wall" for r in runs[1:])
            + ").",
        ]
    times = [t for t, _, _ in errors]
    cpus = [c for _, c, _ in errors]
    codes = sorted({c for _, _, c in errors})
    lines += [
        "",
        f"Early error: `privflow run --data <missing file> --schema src/privflow/demo/adult.yaml` x{len(errors)} "
        f"through the console script: exit status {', '.join(map(str, codes))}; wall {statistics.median(times):.2f} s "
        f"median ({min(times):.2f}-{max(times):.2f}), CPU {statistics.median(cpus):.2f} s median. "
        f'Message: "{messages[0] if messages else ""}"',
        "",
        "## Verdict",
        "",
    ]
    for mode, result in results.items():
        runs = result["runs"]
        walls = [r["fixed"][0] for r in runs]
        cpu = [r["fixed"][1] for r in runs]
        warm_walls, warm_cpu = walls[1:] or walls, cpu[1:] or cpu
        lines.append(
            f"- Fixed overhead < {TARGET_OVERHEAD_S:g} s, {mode}: "
            f"**{'met' if max(warm_walls) < TARGET_OVERHEAD_S else 'not met'}** with the store reused "
            f"({', '.join(f'{w:.1f} s wall / {c:.1f} s CPU' for w, c in zip(warm_walls, warm_cpu, strict=True))}; "
            f"by CPU seconds, closer to an idle machine: {'met' if max(warm_cpu) < TARGET_OVERHEAD_S else 'not met'}); "
            f"{walls[0]:.1f} s wall / {cpu[0]:.1f} s CPU with a new store."
        )
    lines.append(
        f"- Early error < {TARGET_ERROR_S:g} s: **{'met' if max(times) < TARGET_ERROR_S else 'not met'}** "
        f"(wall median {statistics.median(times):.2f} s, worst {max(times):.2f} s; exit {', '.join(map(str, codes))})."
    )
    for mode, result in results.items():
        big = sorted(result["runs"][-1]["overhead"].items(), key=lambda kv: -kv[1][1])[:5]
        lines.append(
            f"- Largest overhead items by CPU, {mode} (run {len(result['runs'])}): "
            + "; ".join(f"{k} {v[1]:.1f} s CPU ({v[0]:.1f} s wall)" for k, v in big)
            + "."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
