"""A b-ary tree of counts over a column's ordered cells, and the estimate of the cells from a
noisy count at every level of it.

Why a tree. One noisy count per cell of a fine grid spread over wide public bounds puts noise
into every empty cell, and no post-processing of those counts alone can tell a thin tail from
noise or find where a small table's rows sit (benchmarks/results/tails.md). A tree releases,
for every level, the counts of blocks of b^k consecutive cells: a block over an empty part of
the domain is one count of pure noise however many cells it holds, so it is recognised as
empty once, high up, and every cell under it set to zero; and where the cells are too few to
resolve, their block still is, so the resolution follows the rows (Hay et al. 2010, "Boosting
the accuracy of differentially private histograms through consistency", PVLDB 3(1), sections
3-4; Qardaji et al. 2013, "Understanding hierarchical methods for differentially private
histograms", PVLDB 6(14), on a branching factor near 16 rather than 2).

Layout (public: fixed by the number of cells, `BRANCHING` and `TWENTIETHS`; `tree_for`): the
leaves are the cells; each level above holds the blocks of f consecutive nodes of the level
below, f its fanout. Where 20 divides the cells into blocks that factor into fanouts of at most
b = `BRANCHING` (the default grid of 640 cells: blocks of 8 cells, then of 32), the top level is
the cells' twentieths: the 20 blocks of 5% of the public bounds each, so a summary over 20 (or
10, or 5) equal bins of the bounds reads one well-estimated count per bin instead of summing
blocks that straddle nothing in particular (640 cells in 8-ary blocks had levels of 2, 10 and 80
blocks). Otherwise every fanout is b and levels are added until one holds at most b blocks. The
column's total is not a level: the release estimates it from every column.
Measured (benchmarks/results/marginal_tree.md, the marginals alone at one noise): against 8-ary
blocks, the twentieths on top cut the 20-bin error by 11-25% on tables of 6,000-43,000 rows and
the fine error a little, one level fewer (a smaller sensitivity); about even on 1,176 rows. A row adds 1
to one node per level, so a column of depth L (levels, leaves included) adds L to the squared
L2 sensitivity of the whole release (`privacy/mechanisms/dp_marginals.py`).

Estimate (post-processing, from the noisy counts and public constants only; every noisy count
has the same variance sigma^2):

1. Bottom up, each node's count is combined with the sum of its children's estimates by
   inverse variance, as in Hay et al.'s z; the variance of every estimate is known exactly.
2. Top down, a node's mass m is split among its children. The children whose estimate
   exceeds `threshold` standard deviations (chosen so that noise alone lifts any empty block
   of the tree there with chance at most `FALSE_BLOCK`) are units; the other children are one
   more unit when they hold rows: their summed estimate, or what the units leave of m, exceeds
   the threshold (rows spread thin over many blocks: a tail, or a dense part that noise hides
   cell by cell). The units share m by the Euclidean projection onto {c >= 0, sum c = m}
   (Norm-Sub), the group's share again by Norm-Sub among its members; the other children get
   0. With no child above the threshold, m is spread over the node's cells evenly: the data
   say where the block is, not where inside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

BRANCHING = 8  # children per node: 512 cells are 3 levels (8, 64, 512), 640 are 4 (2, 10, 80, 640)
# per column: the chance that noise alone makes any empty block of its tree look occupied (a
# block far out in the bounds that does so puts a lump of synthetic values where no row is)
FALSE_BLOCK = 0.05
TWENTIETHS = 20  # a grid this divides gets a level of blocks that are each 1/20 of its cells: the top


def project_to_total(y: np.ndarray, total: float) -> np.ndarray:
    """Euclidean projection of y onto {c >= 0, sum c = total} (Norm-Sub; Duchi et al. 2008, fig. 1)."""
    y = np.asarray(y, dtype=np.float64)
    if not total > 0:
        raise ValueError(f"total must be positive, got {total}")
    s = np.sort(y)[::-1]
    cs = np.cumsum(s) - total
    j = np.arange(1, s.size + 1)
    rho = int(np.nonzero(s - cs / j > 0)[0][-1])
    tau = cs[rho] / (rho + 1)
    return np.maximum(y - tau, 0.0)


def threshold(nodes: int) -> float:
    """Standard deviations above which a block counts as holding rows, in a tree of `nodes`
    counts: at most `FALSE_BLOCK` chance that noise alone lifts any empty block of it there."""
    return NormalDist().inv_cdf(1.0 - FALSE_BLOCK / max(nodes, 1))


def split(
    mass: float, estimate: np.ndarray, sd: np.ndarray, cells: np.ndarray, z: float, mass_sd: float = 0.0
) -> np.ndarray:
    """`mass` (known to `mass_sd`) shared among siblings with these estimates, standard
    deviations and cell counts (step 2 of the module docstring): the siblings above `z` standard
    deviations, and the others as one group when they hold rows (their summed estimate, or what
    the others leave of `mass`, above `z` standard deviations), share `mass` by Norm-Sub, the
    group's share again by Norm-Sub among its members; with no sibling above, `mass` is spread
    over the cells evenly."""
    out = np.zeros(estimate.size)
    if not mass > 0:
        return out
    keep = estimate > z * sd
    if not keep.any():
        return mass * cells / cells.sum()
    rest = ~keep
    group = float(estimate[rest].sum())
    left = mass - float(estimate[keep].sum())
    grouped = bool(rest.any()) and (
        group > z * math.sqrt(float(np.sum(sd[rest] ** 2)))
        or left > z * math.sqrt(float(np.sum(sd[keep] ** 2)) + mass_sd**2)
    )
    share = project_to_total(np.append(estimate[keep], max(group, left) if grouped else []), mass)
    out[keep] = share[: int(keep.sum())]
    if grouped and share[-1] > 0:
        out[rest] = project_to_total(estimate[rest], float(share[-1]))
    return out


@dataclass(frozen=True)
class Tree:
    """The tree over `leaves` ordered cells (module docstring, "Layout"): a node has `fanouts[k]`
    children at the k-th level above the leaves, `branching` past the list, and levels are added
    until one holds at most `top` blocks (`branching` when None)."""

    leaves: int
    branching: int = BRANCHING
    fanouts: tuple[int, ...] = ()
    top: int | None = None

    def __post_init__(self) -> None:
        if self.leaves < 1 or self.branching < 2 or any(f < 2 for f in self.fanouts):
            raise ValueError(
                f"need leaves >= 1 and every fanout >= 2, got {self.leaves}, {self.branching}, {self.fanouts}"
            )
        if self.top is not None and self.top < 1:
            raise ValueError(f"need top >= 1, got {self.top}")

    @property
    def sizes(self) -> list[int]:
        """Nodes per level, the top first and the leaves last."""
        sizes = [self.leaves]
        limit = self.branching if self.top is None else self.top
        while sizes[0] > limit:
            sizes.insert(0, math.ceil(sizes[0] / self._fanout(len(sizes) - 1)))
        return sizes

    def _fanout(self, k: int) -> int:
        """Children per node at the k-th level above the leaves (k = 0: the leaves' parents)."""
        return self.fanouts[k] if k < len(self.fanouts) else self.branching

    def fanout_below(self, level: int) -> int:
        """Children per node of `level` (0: the top level)."""
        return self._fanout(self.depth - 2 - level)

    @property
    def widths(self) -> list[int]:
        """Cells per block, level by level, the top first and the leaves (1) last: the node of a
        level that holds cell k is k // its width."""
        out = [1]
        for k in range(len(self.sizes) - 1):
            out.insert(0, out[0] * self._fanout(k))
        return out

    @property
    def depth(self) -> int:
        """Levels released, leaves included: a row's share of the squared L2 sensitivity."""
        return len(self.sizes)

    @property
    def inner(self) -> int:
        """How many counts the levels above the leaves hold."""
        return sum(self.sizes[:-1])

    def upper_counts(self, leaf_counts: np.ndarray) -> np.ndarray:
        """The counts of the levels above the leaves, the top level first, concatenated: each
        node the sum of its children."""
        levels: list[np.ndarray] = []
        below = np.asarray(leaf_counts, dtype=np.float64)
        if below.size != self.leaves:
            raise ValueError(f"expected {self.leaves} leaf counts, got {below.size}")
        for k in range(self.depth - 1):
            below = np.add.reduceat(below, np.arange(0, below.size, self._fanout(k)))
            levels.insert(0, below)
        return np.concatenate(levels) if levels else np.zeros(0)

    def _levels(self, noisy_leaves: np.ndarray, noisy_upper: np.ndarray) -> list[np.ndarray]:
        bounds = np.cumsum([0, *self.sizes[:-1]])
        if noisy_upper.size != self.inner or noisy_leaves.size != self.leaves:
            raise ValueError(f"expected {self.leaves} + {self.inner} noisy counts")
        return [noisy_upper[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)] + [noisy_leaves]

    def bottom_up(self, noisy_leaves: np.ndarray, noisy_upper: np.ndarray, sigma: float) -> tuple[list, list]:
        """Every node's inverse-variance estimate and its variance, level by level, top first."""
        y = self._levels(np.asarray(noisy_leaves, float), np.asarray(noisy_upper, float))
        z, v = [y[-1]], [np.full(self.leaves, sigma**2)]
        for k, level in enumerate(reversed(y[:-1])):
            starts = np.arange(0, z[0].size, self._fanout(k))
            s = np.add.reduceat(z[0], starts)
            vs = np.add.reduceat(v[0], starts)
            precision = 1.0 / sigma**2 + 1.0 / vs
            z.insert(0, (level / sigma**2 + s / vs) / precision)
            v.insert(0, 1.0 / precision)
        return z, v

    def cells_under(self) -> list[np.ndarray]:
        """How many leaves each node covers, level by level, top first: the tree's counts of one
        row per leaf."""
        ones = np.ones(self.leaves)
        return self._levels(ones, self.upper_counts(ones))

    def occupied_top(self, leaf_mass: np.ndarray) -> np.ndarray:
        """Which leaves lie under a block holding mass (bool per leaf), at the tree's top level, or
        at the level below a top of fewer than `branching` blocks (640 cells in 8-ary blocks: 10
        blocks of 64, not 2 of 512) where that level is not the leaves."""
        widths = self.widths
        level = 0
        while level < self.depth - 2 and self.sizes[level] < self.branching:
            level += 1
        width = widths[level]
        top = np.add.reduceat(np.asarray(leaf_mass, dtype=np.float64), np.arange(0, self.leaves, width)) > 0
        return np.repeat(top, width)[: self.leaves]

    def estimate(
        self,
        noisy_leaves: np.ndarray,
        noisy_upper: np.ndarray,
        sigma: float,
        total: float,
        others: Sequence[float] | np.ndarray = (),
        total_sd: float = 0.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The leaves' masses, summing with `others`' to `total` (an estimate with standard
        deviation `total_sd`): `others` are cells released beside the tree at the same noise (a
        null cell), competing with the top level (module docstring, "Estimate"). Returns (leaf
        masses, the others' masses)."""
        z, v = self.bottom_up(noisy_leaves, noisy_upper, sigma)
        w = self.cells_under()
        cut = threshold(self.inner + self.leaves + len(others))
        extra = np.asarray(others, dtype=np.float64)
        top = split(
            total,
            np.concatenate([z[0], extra]),
            np.sqrt(np.concatenate([v[0], np.full(extra.size, sigma**2)])),
            np.concatenate([w[0], np.ones(extra.size)]),
            cut,
            total_sd,
        )
        mass = top[: z[0].size]
        for k in range(1, self.depth):
            below = np.zeros(z[k].size)
            b = self.fanout_below(k - 1)
            for i in np.nonzero(mass)[0]:
                lo, hi = i * b, min((i + 1) * b, z[k].size)
                below[lo:hi] = split(
                    float(mass[i]), z[k][lo:hi], np.sqrt(v[k][lo:hi]), w[k][lo:hi], cut, math.sqrt(v[k - 1][i])
                )
            mass = below
        return mass, top[z[0].size :]


def twentieths_fanouts(leaves: int, branching: int = BRANCHING) -> tuple[int, ...] | None:
    """Fanouts (from the leaves up) that make one level the twentieths of the cells, each at most
    `branching` children, or None where 20 does not divide the cells into such blocks."""
    if leaves % TWENTIETHS or leaves == TWENTIETHS:
        return None
    m, out = leaves // TWENTIETHS, []
    while m > 1:
        f = next((f for f in range(branching, 1, -1) if m % f == 0), None)
        if f is None:
            return None
        out.append(f)
        m //= f
    return tuple(out)


def tree_for(leaves: int) -> Tree:
    """The tree over an ordered column's `leaves` value cells (module docstring, "Layout"): where
    20 divides them into blocks of at most `BRANCHING`-ary factors, the top level is their
    twentieths; else `BRANCHING`-ary blocks up to a top of at most `BRANCHING` blocks."""
    fanouts = twentieths_fanouts(leaves)
    if fanouts is None:
        return Tree(leaves)
    return Tree(leaves, fanouts=fanouts, top=TWENTIETHS)


__all__ = [
    "BRANCHING",
    "FALSE_BLOCK",
    "TWENTIETHS",
    "Tree",
    "tree_for",
    "twentieths_fanouts",
    "project_to_total",
    "split",
    "threshold",
]
