"""Write benchmarks/RESULTS.md: the headline tables of every result file, side by side.

Each file under benchmarks/results/ is written by one benchmark command and records that
command, its commit, the machine and its load. This script copies, for every file, those
provenance lines and the sections that hold its figures (the per-dataset tables and targets
of the peers and stability presets, each benchmark's verdict or main table), so that one page
shows where privflow stands and how to rerun each figure. It computes nothing itself:
rerunning it after a benchmark refreshes the page; a figure here is only as new as its file.

    .venv/bin/python -m benchmarks.collect_results
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Source:
    """One result file and what of it the summary shows."""

    file: str
    title: str
    sections: tuple[str, ...]  # "## " headings copied whole; "" = the tables before the first heading


SOURCES = (
    Source("peers.md", "privflow beside MST and AIM, with its ablations", ("adult", "german", "Targets")),
    Source("tables.md", "privflow beside MST and AIM over six public tables", ("", "Targets per table")),
    Source("split_check.md", "The default run after the selection split by occurrence rank", ("adult", "german")),
    Source("label_ceiling.md", "Classifier utility: the flow's features against the head's labels", ("", "Reading")),
    Source("head.md", "The target head on its own: DP variants and non-private references", ("",)),
    Source("stability.md", "Spread of the default run over 5 seeds", ("adult", "pinwheel", "Targets")),
    Source("ceiling.md", "The default pipeline with and without DP: what the noise costs", ("adult", "Targets")),
    Source("sampling.md", "Sampling rate and memory", ("", "Verdict")),
    Source("overhead.md", "Fixed overhead of a run, time to an early error", ("Verdict",)),
    Source("test_tiers.md", "CI and the test tiers on a fresh clone", ("",)),
    Source("dp_step.md", "DP step against the non-private step", ("",)),
    Source("sparsify_tau.md", "Sparsification: the exact threshold against the sampled one", ("",)),
    Source("scaling.md", "Training time and memory against rows", ("", "Verdict")),
    Source("stream.md", "privflow run on tables up to 3.2M rows: read whole against streamed", ("", "Verdict")),
    Source("stream_32m.md", "privflow run streamed on 32M rows", ("", "Verdict")),
    Source("stream_select_cap.md", "privflow run streamed on 3.2M rows, selection split capped", ("", "Verdict")),
    Source(
        "stream_current.md",
        "privflow run streamed at 32k, 320k and 3.2M rows, selection split capped",
        ("", "Verdict"),
    ),
    Source("poisson.md", "DP-SGD's Poisson sample: batch-sized draw against n coins", ("",)),
    Source("gpu.md", "privflow run on Adult on a GPU", ("", "Verdict")),
    Source("dp_step_cuda.md", "DP step against the non-private step on a GPU, batch 512", ("",)),
    Source("dp_step_cuda_4096.md", "DP step against the non-private step on a GPU, batch 4096", ("",)),
    Source("profile_dp_step_cuda.md", "Where the DP step's time goes on a GPU", ("",)),
    Source("sampling_cuda.md", "Sampling with the flow on a GPU", ("", "Verdict")),
    Source("workers.md", "Two data-parallel workers against one", ("2 processes against 1",)),
    Source("warm_start.md", "Warm starts from public pretraining", ("",)),
    Source("audit.md", "Empirical privacy audit", ("",)),
    Source("anomaly.md", "DP anomaly detection", ("adult-numeric", "half-moons")),
    Source("sweep.md", "Flows against the DP-NF and DP-HFlow papers", ("adult", "german", "pinwheel", "Targets")),
)

_PROVENANCE = re.compile(r"^- (command|commit|date|machine)\b", re.IGNORECASE)


def split_sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The lines before the first '## ' heading, and each '## ' section's lines by heading text
    (a heading is matched by its start, so 'Targets' finds 'Targets (peers), at epsilon = 1')."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] = head
    in_details = False
    for line in text.splitlines():
        if line.startswith("<details"):
            in_details = True
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
            in_details = False
            continue
        if not in_details:
            current.append(line)
        if line.startswith("</details"):
            in_details = False
    return head, sections


def provenance(head: list[str]) -> list[str]:
    """The command (a bash block or a '- Command' line), commit, date and machine lines."""
    out: list[str] = []
    in_block = False
    for line in head:
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block and line.strip():
            out.append(f"- Command: `{line.strip()}`")
        elif _PROVENANCE.match(line):
            out.append(line)
    return out


def tables(lines: list[str]) -> list[str]:
    """The markdown tables of a block, each with the one-line caption above it (if any)."""
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        if i > 0 and not lines[i - 1].startswith("|"):
            above = [x.strip() for x in lines[max(0, i - 2) : i] if x.strip()]
            caption = above[-1] if above and above[-1].endswith(":") else ""
            out += ["", caption, ""] if caption else [""]
        out.append(line)
    return out


def section(source: Source, results: Path) -> list[str]:
    path = results / source.file
    out = [f"## {source.title}", ""]
    if not path.exists():
        return out + [f"Not measured yet: `{source.file}` is missing.", ""]
    head, sections = split_sections(path.read_text())
    out += provenance(head) + [f"- Full file: [`results/{source.file}`](results/{source.file})"]
    for name in source.sections:
        if name == "":
            out += tables(head)
            continue
        match = next((k for k in sections if k.startswith(name)), None)
        if match is None:
            continue
        body = sections[match]
        out += ["", f"### {match}"]
        out += tables(body) if any(line.startswith("|") for line in body) else [""] + _trimmed(body)
    return out + [""]


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def collect(results: Path) -> str:
    lines = [
        "# privflow benchmark results",
        "",
        "Written by `python -m benchmarks.collect_results` from the files under `benchmarks/results/`;",
        "each section names the command and commit that produced its figures (see `benchmarks/README.md`).",
        "Diagnostics are computed on real rows: NOT differentially private. Speed figures are ratios or",
        "rates measured within one run on a shared 2-core CPU machine, except the GPU sections (their",
        "machine line names the GPU machine, lent for minutes; privflow's dependencies carried to it).",
        "",
    ]
    for source in SOURCES:
        lines += section(source, results)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(HERE / "results"))
    p.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = p.parse_args()
    Path(args.out).write_text(collect(Path(args.results)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
