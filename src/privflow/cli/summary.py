"""The table and lines `privflow run` and `privflow demo` print when the run is done."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from rich.console import Console

from privflow.cli._common import paragraph

if TYPE_CHECKING:
    from privflow.flows.pipeline import RunSummary


def print_summary(summary: RunSummary, prefect: bool = False) -> None:
    """The run's figures as a table, then the registry decision and every path in full; with
    `prefect` (the run went through Prefect's engine), where to see its flow run."""
    from rich.table import Table

    s = summary
    get = lambda name, default=None: getattr(s, name, default)  # noqa: E731 - fields other engineers add
    out = Console(soft_wrap=True)
    table = Table(title="privflow run", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    # the version's epsilon (privacy rule 9): a warm start from a private parent composes the whole chain
    lineage, runs = get("lineage"), get("lineage_runs") or ()
    headline = "epsilon (PLD, reported" + (f", lineage of {len(runs)} runs)" if len(runs) > 1 else ")")
    table.add_row(headline, f"{s.epsilon:.4f} at delta={s.delta:g}")
    if len(runs) > 1:
        table.add_row("  lineage", str(lineage))
    if get("epsilon_run") is not None and get("delta_run"):
        table.add_row("epsilon (this run alone, PLD)", f"{s.epsilon_run:.4f} at delta={s.delta_run:g}")
    # RDP is a looser upper bound on the same events (it can exceed the requested epsilon); PLD is the spend
    table.add_row(
        "RDP bound (this run alone)", f"{s.epsilon_rdp:.4f} (looser cross-check; the PLD figure is the spend)"
    )
    for stage, eps in s.stages.items():
        table.add_row(f"  stage {stage}", f"{eps:.4f} alone")
    # the ledger composes every run of the dataset at its budget's delta, which may differ from this run's
    table.add_row("dataset cumulative epsilon", f"{s.dataset_epsilon:.4f} at delta={get('dataset_delta', 0.0):g}")
    metrics = get("metrics") or {}
    for key in (
        "utility/macro_f1_mean",
        "utility/auroc_mean",
        "utility/ap_mean",
        "likelihood/test_nats_per_row",
        "fidelity/tv_mean",
    ):
        if key in metrics:
            table.add_row(f"{key} (not DP)", f"{metrics[key]:.4f}")
    worst = _most_outside(metrics)
    if worst is not None:  # on the real rows' range, which 20 bins over the public bounds hide
        table.add_row("synthetic outside the real range (not DP)", f"max {worst[1]:.1%} ({worst[0]})")
    # The gate's released DP count; exact counts are in the curator-only validation report.
    table.add_row("rows failing validation (DP count)", f"about {get('failing_rows_dp', 0.0):.0f}")
    table.add_row("wall time", f"{get('wall_seconds', 0.0):.1f} s")
    out.print(table)
    alias = get("alias") or "champion"
    alias_version = get("alias_version", None)
    promotion = get("promotion", None)
    lines = [f"registered model {s.model_name} v{s.model_version}"]
    if get("init_from"):
        lines.append(
            f"warm-started from {get('init_from')} (lineage {get('lineage') or '?'}: in the version's "
            "privflow.lineage tag, the MLflow params and the ledger entry)"
        )
    if alias_version is None and promotion is None:
        alias_line = f"alias @{alias} -> v{s.model_version}"  # before RunSummary gained the fields
    elif alias_version is None:
        alias_line = f"alias @{alias} -> (no version)"
    else:
        alias_line = f"alias @{alias} -> v{alias_version}"
    if promotion:
        alias_line += f" ({paragraph(promotion)})"
    lines.append(alias_line)
    lines.append(f"synthetic table: {s.synthetic_path}")
    if get("release_note"):
        lines.append(f"note: {get('release_note')}")
    if get("report_path"):
        lines.append(f"diagnostics report (not DP, curator only): {s.report_path}")
    if get("diagnostics_note"):
        lines.append(f"diagnostics note (not DP, curator only): {get('diagnostics_note')}")
    if get("curator_dir"):
        lines.append(f"curator-only diagnostics folder (not DP): {get('curator_dir')}")
    if get("mlflow_run_id"):
        lines.append(f"MLflow run: {s.mlflow_run_id}")
    if get("run_id"):
        lines.append(f"ledger run: {s.run_id}")
    if prefect:
        lines.append(prefect_note())
    for line in lines:
        out.print(line, highlight=False, soft_wrap=True, markup=False)


def _most_outside(metrics: dict[str, float]) -> tuple[str, float] | None:
    """(column, share) of the numeric column with the largest share of synthetic values outside
    the real rows' [min, max] (curator-only `fidelity/range/outside/<column>`), None without one."""
    prefix = "fidelity/range/outside/"
    shares = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix) and not math.isnan(v)}
    if not shares:
        return None
    name = max(shares, key=lambda n: shares[n])
    return name, shares[name]


def print_stage_times(seconds: dict[str, float], total: float | None = None) -> None:
    """Each stage's wall time (`--verbose`), in the order the stages ran; a stage 'parent/part'
    is shown indented under the stage before it. `total`: the process's age now (the command's
    wall time so far), with the machine's load average beside it, since timings of a shared
    machine mean little without it. Wall clock only: nothing here is released."""
    from rich.table import Table

    table = Table(title="stage times (wall clock)", show_header=True)
    table.add_column("stage", no_wrap=True)
    table.add_column("seconds", justify="right")
    for name, value in seconds.items():
        label = f"  {name.split('/', 1)[1]}" if "/" in name else name
        table.add_row(label, f"{value:.2f}")
    if total is not None:
        table.add_row("total (process)", f"{total:.2f}", style="bold")
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        table.caption = f"load average (1, 5, 15 min): {load}; {os.cpu_count()} CPUs"
    except OSError:
        pass
    Console(soft_wrap=True).print(table)


def prefect_ui_url(api_url: str) -> str:
    """The Prefect UI address behind an API address: Prefect Cloud's app for its API, else the
    API's URL without its trailing /api (how `prefect server start` serves both)."""
    url = api_url.rstrip("/")
    cloud = "https://api.prefect.cloud/api/accounts/"
    if url.startswith(cloud):
        account, _, workspace = url[len(cloud) :].partition("/workspaces/")
        return f"https://app.prefect.cloud/account/{account}/workspace/{workspace.split('/')[0]}"
    return url[: -len("/api")] if url.endswith("/api") else url


def prefect_note() -> str:
    """Where a run under Prefect's engine can be seen: a configured server's UI, or (with no
    PREFECT_API_URL) that the server was temporary and how to keep the next runs."""
    api = os.environ.get("PREFECT_API_URL", "").strip()
    if api:
        ui = os.environ.get("PREFECT_UI_URL", "").strip() or prefect_ui_url(api)
        return (
            f"Prefect flow run: recorded by the Prefect server at PREFECT_API_URL={api}; "
            f"see it in the UI at {ui} (Runs)."
        )
    home = os.environ.get("PREFECT_HOME", "~/.prefect")
    return (
        "Prefect flow run: recorded by a temporary local Prefect server that stops when this command exits (its "
        f"records stay in the Prefect database under {home}). To keep runs browsable, start a server "
        "(`prefect server start`, its UI at http://127.0.0.1:4200) and set "
        "PREFECT_API_URL=http://127.0.0.1:4200/api before the next run."
    )
