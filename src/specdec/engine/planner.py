"""One node budget per batched pass, spent where drafts are most likely to be accepted.

Why: vLLM and SGLang give every request the same fixed draft length. On a CPU a
pass's cost grows with the tokens it carries (B rows padded to width W cost
about what one sequence's B*W-node tree costs), so a pass should be as wide as
the batch's expected accepted tokens justify, and no wider: one row's long,
rarely-accepted tree must not make every row pay for padding.

How: each row learns, online, the rate at which its nodes are accepted given
their parent was (`RowRates`, keyed by depth and sibling rank; uninformative
prior, windowed). A node's acceptance probability is the product of those
rates down its path. `plan_width` scores every width W as
    sum over rows of (1 + sum of p over the row's first W - 1 nodes) / cost(B * W)
and keeps the best; each row's tree is then cut to its first W nodes.

Invariants:
- a cut tree is a prefix of the proposer's node order; since every parent comes
  before its children, a prefix is a valid tree, and verification stays lossless
  whatever is cut (the choice never looks at the draft tokens themselves);
- proposers whose tree shape is their algorithm (`prunable = False`, e.g.
  lookahead's Jacobi window) are never cut; their full width counts;
- a sampled row (temperature > 0) is cut by its own plan alone, before the
  batch's: how many random draws a step takes depends on the tree, so a seeded
  row's output must not depend on the other rows (`specdec.engine.batch.Batch._budget`);
- width 1 (no drafts) is always a candidate, so a batch whose drafts do not pay
  decodes plainly;
- a full batch rarely pays for drafts (on a CPU each extra row costs about what a
  token does), and proposing trees only to cut them cost as much as the pass's
  growth: while the last plan that saw drafts chose width 1 for as many rows or
  more, greedy rows propose nothing (`NarrowBatch`), and every `EXPLORE_EVERY`-th
  step they propose again so the plan can widen when the text or the batch allows.
  Sampled rows always propose: their draws must not depend on the other rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdec.engine.costs import AcceptanceStats
from specdec.tree import DraftTree

PRIOR = (0.5, 2.0)  # (mean, strength): Beta(1, 1), i.e. no opinion until the row has been seen
MAX_DEPTH_KEY = 8  # deeper nodes share one rate
MAX_RANK_KEY = 2  # first child, second child, any later sibling
EXPLORE_EVERY = 16  # steps of a narrow batch between two steps whose rows propose


def _key(depth: int, rank: int) -> tuple[int, int]:
    return min(depth, MAX_DEPTH_KEY), min(rank, MAX_RANK_KEY)


class RowRates:
    """One row's conditional acceptance rates per (depth, sibling rank)."""

    def __init__(self, window: float = 100.0) -> None:
        self.stats = AcceptanceStats(lambda key: PRIOR, window)

    def node_probs(self, tree: DraftTree) -> list[float]:
        """[N] probability that each node is accepted (1.0 for the root), in node order."""
        probs = [1.0] * tree.num_nodes
        for node, parent, rank, depth in _walk(tree):
            probs[node] = probs[parent] * self.stats.rate(_key(depth, rank))
        return probs

    def observe(self, tree: DraftTree, path: Sequence[int]) -> None:
        """Learn from one verified tree: every node whose parent was accepted was offered."""
        accepted = set(path)
        for node, parent, rank, depth in _walk(tree):
            if parent in accepted:
                self.stats.update(_key(depth, rank), 1.0, float(node in accepted))


def _walk(tree: DraftTree) -> list[tuple[int, int, int, int]]:
    """(node, parent, sibling rank, depth) for every node below the root, in node order."""
    depth = [0] * tree.num_nodes
    seen_children = [0] * tree.num_nodes
    out = []
    for node, parent in enumerate(tree.parent_list[1:], start=1):
        depth[node] = depth[parent] + 1
        out.append((node, parent, seen_children[parent], depth[node]))
        seen_children[parent] += 1
    return out


def plan_width(
    node_probs: Sequence[Sequence[float]], fixed: Sequence[bool], cost: Callable[[int], float]
) -> int:
    """The pass width W (nodes per row, root included) that maximises expected tokens per second.

    node_probs[b]: row b's acceptance probability per node, in node order (root first, 1.0);
    fixed[b]: the row's tree may not be cut (its whole width is the least W);
    cost(n): seconds of a pass over n tokens.
    """
    rows = len(node_probs)
    least = max([len(p) for p, keep in zip(node_probs, fixed, strict=True) if keep] or [1])
    widest = max(len(p) for p in node_probs)
    best_width, best_rate = least, -1.0
    for width in range(least, widest + 1):
        expected = sum(sum(p[:width]) for p in node_probs)
        rate = expected / cost(rows * width)
        if rate > best_rate:
            best_width, best_rate = width, rate
    return best_width


def cut(tree: DraftTree, width: int) -> DraftTree:
    """The tree's first `width` nodes (a valid tree: parents come first)."""
    if tree.num_nodes <= width:
        return tree
    probs = tree.draft_probs[:width] if tree.draft_probs is not None else None
    return DraftTree(tree.tokens[:width], tree.parents[:width], probs)


class NarrowBatch:
    """Whether a multi-row step's greedy rows propose, from what the batch's last plan chose."""

    def __init__(self) -> None:
        self.narrow_rows = 0  # the row count at which the last plan that saw drafts chose width 1; 0: none
        self.since = 0  # steps since the rows last proposed

    def propose(self, rows: int) -> bool:
        """Whether this step's rows propose (always for one row: the floor prices a row alone)."""
        if rows < 2 or not self.narrow_rows or rows < self.narrow_rows:
            return True
        self.since += 1
        return self.since >= EXPLORE_EVERY

    def planned(self, rows: int, width: int, widest: int) -> None:
        """A plan over `rows` rows that proposed trees of up to `widest` nodes chose `width` (a batch
        whose rows found nothing to draft has not learned that drafts do not pay)."""
        self.narrow_rows, self.since = (rows if width == 1 < widest and rows > 1 else 0), 0
