"""Tasks that read private rows never touch the global torch RNG (its state would depend on
private row counts) and draw dequantization noise from secret generators; selection runs
with zero validation rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privflow.core.config import SelectConfig
from privflow.privacy.accounting.events import GaussianEvent, PureDPEvent, RepeatedEvent
from privflow.privacy.accounting.plan import StagePlan
from tests.stats_checks import FALSE_ALARM

CARDS = [None, 3, None, 4]


def _model(prior: str = "normal") -> torch.nn.Module:
    from privflow.models import build_flow

    torch.manual_seed(0)
    return build_flow("dphflow", CARDS, blocks=1, hidden=8, prior=prior)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    cols = [g.uniform(0.05, 0.95, n) if c is None else g.integers(0, c, n).astype(float) for c in CARDS]
    return np.column_stack(cols).astype(np.float32)


def _unchanged_global_rng(fn) -> None:  # noqa: ANN001
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    fn()
    assert torch.equal(torch.get_rng_state(), before), "the task advanced the global torch RNG"


def test_dp_statistics_sum_their_moments_over_chunks_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clipped moments of a large table are summed over chunks (bounded memory): for
    continuous features (no dequantization draw) they equal one pass over every row."""
    from privflow.models import build_flow
    from privflow.privacy.mechanisms import dp_stats as mechanism
    from privflow.tasks import stats_stage as dp_stats

    model = build_flow("dphflow", [None, None, None], blocks=1, hidden=8)
    x = np.random.default_rng(5).uniform(0.01, 0.99, (1000, 3)).astype(np.float32)
    with torch.no_grad():
        whole = mechanism.mean_std_statistics(model.preprocess(torch.as_tensor(x)).numpy(), dp_stats.STATS_CLIP)
    monkeypatch.setattr(dp_stats, "STATS_CHUNK_ROWS", 64)
    chunked = dp_stats.preprocessed_statistics(model, x)
    assert chunked[0] == 1000
    np.testing.assert_allclose(chunked, whole, rtol=1e-9)


def test_dp_statistics_leaves_the_global_rng_alone() -> None:
    from privflow.tasks.stats_stage import dp_statistics

    model = _model()
    stage = StagePlan("dp_stats", 0.1, 1.0, GaussianEvent(2.0))
    _unchanged_global_rng(lambda: dp_statistics(model, _rows(300), stage))


def test_dp_prior_leaves_the_global_rng_alone() -> None:
    from privflow.tasks.prior_stage import dp_prior

    model = _model("mog")
    d = len(CARDS)
    stage = StagePlan("dp_prior", 0.1, 1.0, RepeatedEvent(GaussianEvent(5.0), 3))
    _unchanged_global_rng(lambda: dp_prior(model, _rows(300), np.zeros(d), np.ones(d), stage, 2))


def test_row_loglik_uses_its_generator_not_the_global_rng() -> None:
    from privflow.tasks.select import row_loglik

    model = _model().eval()
    x = _rows(50)
    _unchanged_global_rng(lambda: row_loglik(model, x))
    a = row_loglik(model, x, generator=torch.Generator().manual_seed(3))
    b = row_loglik(model, x, generator=torch.Generator().manual_seed(3))
    c = row_loglik(model, x, generator=torch.Generator().manual_seed(4))
    assert np.array_equal(a, b) and not np.array_equal(a, c)  # the noise follows the given generator
    assert row_loglik(model, x[:0]).shape == (0,)


def _checkpoints(model: torch.nn.Module, count: int) -> list[tuple[int, dict]]:
    out = []
    for i in range(count):
        state = {k: v.clone() for k, v in model.state_dict().items()}
        out.append((i + 1, state))
    return out


def _make(state: dict) -> torch.nn.Module:
    with torch.random.fork_rng():  # building a model is public; keep its seeding out of the check
        m = _model()
    m.load_state_dict(state)
    return m.eval()


@pytest.mark.parametrize("rows", [0, 40])
def test_select_runs_with_and_without_validation_rows(rows: int) -> None:
    from privflow.tasks.select import loglik_matrix, select_checkpoints

    model = _model()
    checkpoints = _checkpoints(model, 4)
    stage = StagePlan("select", 0.1, 1.0, RepeatedEvent(PureDPEvent(0.5), 2))
    x = _rows(rows)
    assert loglik_matrix(_make, [s for _, s in checkpoints], x).shape == (4, rows)
    holder: dict[str, list[int]] = {}
    _unchanged_global_rng(
        lambda: holder.update(p=select_checkpoints(_make, checkpoints, x, stage, SelectConfig(top_k=2)))
    )
    picks = holder["p"]
    assert len(picks) == 2 == len(set(picks)) and all(0 <= i < 4 for i in picks)


def test_select_with_zero_rows_is_uniform() -> None:
    """All scores are 0 without rows, so every checkpoint is equally likely."""
    from scipy import stats

    from privflow.tasks.select import select_checkpoints

    model = _model()
    checkpoints = _checkpoints(model, 3)
    stage = StagePlan("select", 0.1, 1.0, PureDPEvent(1.0))
    picks = [select_checkpoints(_make, checkpoints, _rows(0), stage, SelectConfig())[0] for _ in range(600)]
    assert stats.chisquare(np.bincount(picks, minlength=3)).pvalue > FALSE_ALARM


@pytest.mark.parametrize("score", ["relative", "absolute"])
def test_selection_scores_by_chunks_of_rows_equal_the_whole_matrix(monkeypatch: pytest.MonkeyPatch, score: str) -> None:
    """Report-Noisy-Max's scores are sums over rows: summed a chunk of selection rows at a time
    (the split may be millions of rows on disk) they equal the scores of the whole matrix."""
    import privflow.tasks.select as select
    from privflow.privacy.mechanisms import report_noisy_max

    model = _model()
    states = [s for _, s in _checkpoints(model, 4)]
    x = _rows(50)
    weights = {id(s): 0.3 * i for i, s in enumerate(states)}

    def loglik(m, rows):  # noqa: ANN001, ANN202 - deterministic stand-in: no dequantization noise
        shift = m.tag
        return (-np.abs(np.asarray(rows, dtype=np.float64)).sum(1) * (1 + shift) + np.sin(shift * 7)).astype(np.float32)

    def make(state):  # noqa: ANN001, ANN202
        m = _make(state)
        m.tag = weights[id(state)]
        return m

    monkeypatch.setattr(select, "row_loglik", loglik)
    cfg = SelectConfig(score=score)
    whole = np.stack([loglik(make(s), x).astype(np.float64) for s in states])
    expected = (
        report_noisy_max.relative_loglik_scores(whole, cfg.relative_clip)
        if score == "relative"
        else report_noisy_max.clipped_loglik_scores(whole, cfg.score_low, cfg.score_high)
    )
    for chunk in (1, 7, 64):
        monkeypatch.setattr(select, "SCORE_CHUNK_ROWS", chunk)
        scores, sensitivity = select.checkpoint_scores(make, states, x, cfg)
        np.testing.assert_allclose(scores, expected[0], rtol=1e-12, atol=1e-9)
        assert sensitivity == expected[1]
