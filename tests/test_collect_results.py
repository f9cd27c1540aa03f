"""benchmarks/collect_results.py: the summary page copies provenance and figures, never invents."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("collect_results", REPO / "benchmarks" / "collect_results.py")
assert _spec is not None and _spec.loader is not None
collect_results = importlib.util.module_from_spec(_spec)
sys.modules["collect_results"] = collect_results  # dataclasses look their module up
_spec.loader.exec_module(collect_results)

PEERS = """# privflow benchmark results

- Command: `python -m privflow.flows.benchmark --preset peers`
- Commit: `abc123`
- Seeds: 0, 1, 2

## How to read this

- prose that must not be copied

## adult

Mean ± sample std over seeds:

| model | AUROC |
|---|---|
| dphflow | 0.859 |

## Targets (issue 13), at epsilon = 1

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
.venv/bin/python benchmarks/bench_dp_step.py --rounds 61
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
    assert "- Command: `python -m privflow.flows.benchmark --preset peers`" in peers
    assert "- Commit: `abc123`" in peers
    assert "Mean ± sample std over seeds:" in peers and "| dphflow | 0.859 |" in peers
    assert "### Targets (issue 13), at epsilon = 1" in peers and "| adult | auroc | **met** |" in peers
    assert "prose that must not be copied" not in page and "secret-looking" not in page  # folded raw cells stay out
    step = page.split("## DP step against the non-private step")[1].split("\n## ")[0]
    assert "- Command: `.venv/bin/python benchmarks/bench_dp_step.py --rounds 61`" in step
    assert "| DP flat | 1.18 |" in step and "def456" in step


def test_a_missing_result_file_is_said_not_invented(tmp_path: Path) -> None:
    page = collect_results.collect(tmp_path)
    assert "Not measured yet: `sampling.md` is missing." in page
    assert "|" not in page  # no table without a file behind it
