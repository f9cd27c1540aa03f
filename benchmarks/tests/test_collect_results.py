"""benchmarks/collect_results.py: the summary page copies provenance and figures, never invents."""

from __future__ import annotations

from pathlib import Path

from benchmarks import collect_results

PEERS = """# privflow benchmark results

- Command: `python -m benchmarks.sweep --preset peers`
- Commit: `abc123`
- Seeds: 0, 1, 2

## How to read this

- prose that must not be copied

## adult

Mean ± sample std over seeds:

| model | AUROC |
|---|---|
| dphflow | 0.859 |

## Targets (peers), at epsilon = 1

| dataset | metric | met |
|---|---|---|
| adult | auroc | **met** |

<details><summary>Every cell</summary>

| raw | cell |
|---|---|
| secret-looking | 1 |

</details>
"""

STEP = """# DP step

```bash
.venv/bin/python -m benchmarks.bench_dp_step --rounds 61
```

- Commit (when the run started): `def456`
- Machine: x86_64

| step | ratio |
| --- | ---: |
| DP flat | 1.18 |
"""


def test_summary_copies_provenance_tables_and_targets(tmp_path: Path) -> None:
    (tmp_path / "peers.md").write_text(PEERS)
    (tmp_path / "dp_step.md").write_text(STEP)
    page = collect_results.collect(tmp_path)
    peers = page.split("## privflow beside MST and AIM")[1].split("\n## ")[0]
    assert "- Command: `python -m benchmarks.sweep --preset peers`" in peers
    assert "- Commit: `abc123`" in peers
    assert "Mean ± sample std over seeds:" in peers and "| dphflow | 0.859 |" in peers
    assert "### Targets (peers), at epsilon = 1" in peers and "| adult | auroc | **met** |" in peers
    assert "prose that must not be copied" not in page and "secret-looking" not in page  # folded raw cells stay out
    step = page.split("## DP step against the non-private step")[1].split("\n## ")[0]
    assert "- Command: `.venv/bin/python -m benchmarks.bench_dp_step --rounds 61`" in step
    assert "| DP flat | 1.18 |" in step and "def456" in step


def test_a_missing_result_file_is_said_not_invented(tmp_path: Path) -> None:
    page = collect_results.collect(tmp_path)
    assert "Not measured yet: `sampling.md` is missing." in page
    assert "|" not in page  # no table without a file behind it
