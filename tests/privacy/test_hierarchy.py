"""The tree of block counts (privacy/mechanisms/hierarchy.py): its layout, the bottom-up
estimate against Hay et al.'s closed form, and the top-down estimate's properties: masses sum
to the total, noiseless counts come back exactly, a block of pure noise is found empty, rows
that noise hides block by block keep their mass together, and a block whose children are all
below the noise is spread evenly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privflow.privacy.mechanisms.hierarchy import FALSE_BLOCK, Tree, split, threshold, tree_for, twentieths_fanouts


@pytest.mark.parametrize(
    ("leaves", "sizes"),
    [(512, [8, 64, 512]), (49, [7, 49]), (8, [8]), (9, [2, 9]), (1, [1]), (4096, [8, 64, 512, 4096])],
)
def test_levels_are_added_until_one_holds_at_most_b_blocks(leaves: int, sizes: list[int]) -> None:
    tree = Tree(leaves)
    assert tree.sizes == sizes and tree.depth == len(sizes) and tree.inner == sum(sizes[:-1])


@pytest.mark.parametrize(
    ("leaves", "sizes"),
    [(640, [20, 80, 640]), (1280, [20, 160, 1280]), (100, [20, 100]), (60, [20, 60]), (512, [8, 64, 512]),
     (366, [6, 46, 366]), (20, [3, 20]), (660, [2, 11, 83, 660])],
)  # fmt: skip
def test_a_grid_that_20_divides_has_its_twentieths_on_top(leaves: int, sizes: list[int]) -> None:
    """Where 20 divides the cells into blocks whose size factors into fanouts of at most 8, the top
    level is the 20 blocks of 5% of the cells each; elsewhere 8-ary blocks (660 / 20 = 33 = 3 x 11)."""
    tree = tree_for(leaves)
    assert tree.sizes == sizes
    if sizes[0] == 20:
        width = leaves // 20
        top = tree.upper_counts(np.arange(leaves, dtype=float))[:20]  # cell k holds k
        assert np.array_equal(top, [sum(range(k * width, (k + 1) * width)) for k in range(20)])
    assert (twentieths_fanouts(leaves) is None) == (sizes[0] != 20)


@given(st.integers(1, 700), st.lists(st.integers(2, 9), max_size=4), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_mixed_fanouts_count_the_blocks_of_cells(leaves: int, fanouts: list[int], seed: int) -> None:
    """Against a count made from the cell index: a node of height h covers the cells whose index
    divided by the product of the fanouts below it is its index; the noiseless estimate returns
    the counts."""
    tree = Tree(leaves, 8, tuple(fanouts))
    cells = np.random.default_rng(seed).integers(0, leaves, 300)
    counts = np.bincount(cells, minlength=leaves).astype(float)
    upper = tree.upper_counts(counts)
    widths = np.cumprod([1] + [tree.fanout_below(k) for k in range(tree.depth - 2, -1, -1)])
    expected = [np.bincount(cells // w, minlength=-(-leaves // w)) for w in widths[1:][::-1]]
    assert np.array_equal(upper, np.concatenate(expected) if expected else np.zeros(0))
    mass, _ = tree.estimate(counts, upper, 1e-6, float(counts.sum()))
    assert np.allclose(mass, counts)


@given(st.integers(1, 700), st.integers(2, 16), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_upper_counts_are_the_blocks_of_cells(leaves: int, b: int, seed: int) -> None:
    """Against a count made from the cell index: cell k is in block k // b**h of level h."""
    tree = Tree(leaves, b)
    cells = np.random.default_rng(seed).integers(0, leaves, 300)
    upper = tree.upper_counts(np.bincount(cells, minlength=leaves).astype(float))
    expected = [np.bincount(cells // b**h, minlength=-(-leaves // b**h)) for h in range(tree.depth - 1, 0, -1)]
    assert np.array_equal(upper, np.concatenate(expected) if expected else np.zeros(0))


def test_bottom_up_variances_are_hay_et_als() -> None:
    """A full b-ary tree: the estimate at height h (leaves at 1) has variance
    sigma^2 (b^h - b^(h-1)) / (b^h - 1) (Hay et al. 2010, section 4.1)."""
    b, sigma = 8, 3.0
    tree = Tree(b**3, b)
    _, v = tree.bottom_up(np.zeros(tree.leaves), np.zeros(tree.inner), sigma)
    for level, height in zip(v, (3, 2, 1), strict=True):
        assert np.allclose(level, sigma**2 * (b**height - b ** (height - 1)) / (b**height - 1))


def test_bottom_up_is_the_minimum_variance_unbiased_combination() -> None:
    """Empirically: each level's estimate is unbiased and its spread matches the stated variance,
    below the raw noisy count's."""
    g = np.random.default_rng(1)
    tree = Tree(100, 8)
    true = g.integers(0, 50, 100).astype(float)
    upper = tree.upper_counts(true)
    sigma = 5.0
    tops = []
    for _ in range(2000):
        z, v = tree.bottom_up(true + g.normal(0, sigma, true.size), upper + g.normal(0, sigma, upper.size), sigma)
        tops.append(z[0])
    tops_arr = np.array(tops)
    top_true = upper[: tree.sizes[0]]
    assert np.allclose(tops_arr.mean(0), top_true, atol=4 * sigma / np.sqrt(2000))
    assert np.allclose(tops_arr.var(0), v[0], rtol=0.12)
    assert np.all(v[0] < sigma**2)


@given(st.integers(2, 600), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_noiseless_counts_come_back_exactly(leaves: int, seed: int) -> None:
    """Consistent counts with a tiny sigma: every occupied cell is found, masses are the counts."""
    g = np.random.default_rng(seed)
    tree = Tree(leaves)
    counts = np.where(g.random(leaves) < 0.3, g.integers(1, 1000, leaves), 0).astype(float)
    if counts.sum() == 0:
        counts[0] = 5.0
    mass, rest = tree.estimate(counts, tree.upper_counts(counts), 1e-6, float(counts.sum()), [0.0])
    assert np.allclose(mass, counts) and rest[0] == 0.0


@given(st.floats(1.0, 1e6), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_masses_are_non_negative_and_sum_to_the_total(total: float, seed: int) -> None:
    g = np.random.default_rng(seed)
    tree = Tree(int(g.integers(9, 800)))
    mass, rest = tree.estimate(
        g.normal(0, 30, tree.leaves) + g.integers(0, 100, tree.leaves),
        g.normal(0, 30, tree.inner),
        30.0,
        total,
        [float(g.normal(0, 30))],
    )
    assert np.all(mass >= 0) and np.all(rest >= 0)
    assert mass.sum() + rest.sum() == pytest.approx(total)


def test_a_block_of_pure_noise_is_found_empty() -> None:
    """Rows in cells 200..230 of 512, noise sigma 20: the rest of the domain gets no mass in at
    least 1 - FALSE_BLOCK of releases (a flat projection would leave some in most)."""
    g = np.random.default_rng(2)
    tree = Tree(512)
    counts = np.zeros(512)
    counts[200:231] = 300.0
    upper = tree.upper_counts(counts)
    trials, leaked = 200, 0
    for _ in range(trials):
        mass, _ = tree.estimate(counts + g.normal(0, 20, 512), upper + g.normal(0, 20, upper.size), 20.0, counts.sum())
        outside = np.r_[mass[:192], mass[240:]].sum()  # allowing the blocks of 8 the rows touch
        leaked += outside > 0
    assert leaked <= trials * 2 * FALSE_BLOCK


def test_without_a_unit_the_mass_is_spread_evenly_by_cells() -> None:
    out = split(90.0, np.array([1.0, -2.0, 0.5]), np.ones(3), np.array([1.0, 2.0, 6.0]), 3.0)
    assert np.allclose(out, [10.0, 20.0, 60.0])


def test_siblings_each_below_the_threshold_keep_their_share_together() -> None:
    """Siblings each below the threshold but together above it share the mass as one group,
    among themselves by Norm-Sub; below it together, they get none."""
    cut = threshold(100)
    est = np.array([500.0, 3.0, 3.5, -1.0, 3.0, 3.5, 9.0, 2.5])
    out = split(523.0, est, np.ones(8), np.ones(8), cut)
    assert out.sum() == pytest.approx(523.0) and out[0] > 490 and out[6] > 0  # 9 is above ~3.7 sd
    group = np.array([1, 2, 3, 4, 5, 7])
    assert out[group].sum() > 0 and out[3] == 0.0  # the group's share, by Norm-Sub: not to -1
    quiet = split(505.0, np.array([500.0, 0.5, -1.0, 1.0, 0.2, 9.0, -0.3, 0.4]), np.ones(8), np.ones(8), cut)
    assert quiet[[1, 2, 3, 4, 6, 7]].sum() == 0.0 and quiet.sum() == pytest.approx(505.0)


def test_what_the_units_leave_of_the_parent_goes_to_the_others() -> None:
    """One child clearly above the noise (300) in a parent of 1,000: the other seven, noisy and
    below the threshold even together, still receive the 700 the parent holds beyond it (they
    used to lose it to the one child: a column collapsed onto one value)."""
    est = np.array([300.0, 150.0, -50.0, 120.0, 90.0, 60.0, 40.0, 20.0])
    out = split(1000.0, est, np.full(8, 60.0), np.ones(8), threshold(100), mass_sd=30.0)
    assert out[0] == pytest.approx(300.0) and out[1:].sum() == pytest.approx(700.0)
    assert out[2] < out[1]
    alone = split(310.0, est, np.full(8, 60.0), np.ones(8), threshold(100), mass_sd=30.0)
    assert alone[0] == pytest.approx(310.0)  # nothing left beyond the noise: the others hold none


def test_threshold_controls_the_chance_of_a_false_block() -> None:
    """P(N(0, 1) > threshold(n)) = FALSE_BLOCK / n, so over n empty blocks at most FALSE_BLOCK."""
    from statistics import NormalDist

    for n in (10, 585, 5000):
        assert 1 - NormalDist().cdf(threshold(n)) == pytest.approx(FALSE_BLOCK / n)
