"""LogitSpec's candidate nodes as one trie, and the cost-aware choice of which of them to verify.

Why: LogitSpec's drafts come from several places at once (prompt lookup's chain,
the root's own retrieval, next-next candidates with their continuations,
third-level candidates below them, ...). They overlap: two sources often guess
the same first tokens. Planning per branch would count a shared node twice and
could pick a child without its parent; a trie of all candidate nodes, each with
its estimated probability of being accepted and the source that offered it,
avoids both. The planner then takes a *floor* (nodes kept whatever the gain,
e.g. prompt lookup's chain) plus the best-paying prefix of the other nodes in
order of probability (`best_prefix`): the size that maximises expected tokens
per second, (1 + sum of probabilities) / cost(size), on this machine's cost
curve (`budget.CostModel`).

Invariants:
- a node's probability never exceeds its parent's (clamped when added), and a
  node's id is larger than its parent's, so ordering nodes by (-probability, id)
  always puts a parent before its children: every prefix of that order is a
  tree (no orphan is ever verified);
- identical siblings are one node (a trie); a node offered again keeps its first
  source and the larger of the two probability estimates;
- the pool never holds more than `max_nodes` nodes (root included) nor nodes
  deeper than `max_depth`; a plan never picks more than its `budget`;
- the tree handed to verification lists nodes in id order, so parents come
  before children, and `sources[i]` names who offered tree node i ("" for the root);
- `plan_tree` returns per-branch prefixes only, and `best_prefix` keeps the root
  alone unless a tree beats it by `min_gain` (without a floor). Per step the
  choice costs one sort of at most a few hundred floats: no tensors, no
  vocabulary loops.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.tree import DraftTree

ROOT = 0  # the pool's node id of the root


class NodePool:
    """Candidate nodes below the root: tokens, parents, depths, probabilities and sources."""

    __slots__ = ("tokens", "parents", "depths", "probs", "sources", "max_depth", "max_nodes", "_child")

    def __init__(self, root: int, max_depth: int, max_nodes: int) -> None:
        self.tokens = [root]
        self.parents = [-1]
        self.depths = [0]
        self.probs = [1.0]
        self.sources = [""]
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self._child: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, anchor: int, branch: Sequence[int], probs: Sequence[float] | None, source: str) -> list[int]:
        """Walk (and extend) the trie from node `anchor` along `branch`; the node ids reached.

        probs[i] is the chance that branch[i] is accepted (None: 1.0, i.e. "keep",
        for trees sized by rule rather than by gain). The walk stops where `probs`
        ends, below `max_depth`, or where a new node would exceed `max_nodes`.
        """
        ids: list[int] = []
        node = anchor
        limit = len(branch) if probs is None else min(len(branch), len(probs))
        child_of, node_probs = self._child, self.probs
        for i in range(limit):
            p = min(1.0 if probs is None else probs[i], node_probs[node])
            key = (node, int(branch[i]))
            found = child_of.get(key)
            if found is None:
                if self.depths[node] >= self.max_depth or len(self.tokens) >= self.max_nodes:
                    break
                found = child_of[key] = len(self.tokens)
                self.tokens.append(key[1])
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                node_probs.append(p)
                self.sources.append(source)
            elif p > node_probs[found]:
                node_probs[found] = p
            ids.append(found)
            node = found
        return ids

    def child(self, node: int, token: int) -> int:
        """The id of `token` below `node`, or -1."""
        return self._child.get((node, token), -1)

    def plan(
        self, costs: Sequence[float], budget: int, floor: Sequence[int], min_prob: float, min_gain: float
    ) -> list[int]:
        """The node ids to verify: `floor` (kept whatever the gain) plus the best-paying others.

        costs[n]: seconds for an n-node pass (`CostModel.table`), n <= budget; the
        tree holds at most `budget` nodes, root included. Nodes below
        `min_prob` are never worth a slot. Without a floor a tree must beat the
        root alone by (1 + min_gain); with one, others join only where they raise
        the expected tokens per second.
        """
        kept = set(floor)
        probs = self.exclusive_probs()
        others = [i for i in range(1, len(probs)) if i not in kept and probs[i] >= min_prob]
        others.sort(key=lambda i: -probs[i])  # stable: ids ascending on ties, parents first
        fixed_expected = sum(probs[i] for i in kept)
        num, _ = best_prefix(
            [probs[i] for i in others], costs, budget, min_gain, len(kept), fixed_expected
        )
        return sorted([*kept, *others[:num]])

    def exclusive_probs(self) -> list[float]:
        """Node probabilities with each node's children made exclusive: they are different tokens at one
        position, so at most one of them is accepted, and their chances given the parent sum to at most 1.
        Each source's rates are learned alone, so where sources disagree below a node their sum can pass 1
        (the largest trees then expected far more tokens than they got: docs/benchmarks.md); such children
        are scaled down together, their subtrees with them. A node never rises above its parent nor its own
        estimate, so parents keep coming before children in (-probability, id)."""
        probs, parents = self.probs, self.parents
        total = [0.0] * len(probs)
        for node in range(1, len(probs)):
            total[parents[node]] += probs[node]
        out = [1.0] * len(probs)
        for node in range(1, len(probs)):
            parent = parents[node]
            given = probs[node] / probs[parent] if probs[parent] > 0.0 else 0.0
            out[node] = out[parent] * given * min(1.0, probs[parent] / total[parent])
        return out

    def tree(self, chosen: Sequence[int]) -> tuple[DraftTree, list[str]]:
        """The draft tree of the root and `chosen` node ids (each with its parent chosen), and its node sources."""
        ids = [ROOT, *sorted(set(chosen) - {ROOT})]
        where = {node: i for i, node in enumerate(ids)}
        tokens = [self.tokens[node] for node in ids]
        parents = [-1, *(where[self.parents[node]] for node in ids[1:])]
        tree = DraftTree.of_lists(tokens, parents)
        return tree, [self.sources[node] for node in ids]

    def whole(self) -> tuple[DraftTree, list[str]]:
        """Every node in the pool (trees sized by rule: the paper's)."""
        return self.tree(range(len(self.tokens)))


def plan_tree(
    branch_probs: Sequence[Sequence[float]], costs: Sequence[float], max_nodes: int, min_gain: float = 0.0
) -> tuple[list[int], float]:
    """Per-branch lengths that maximise expected tokens per second, and that expected rate.

    branch_probs[b][d]: probability that node d (0-based depth below the root) of
    branch b is accepted, non-increasing in d. costs[n]: seconds for an n-node
    forward pass (index 0 unused), for n up to at least max_nodes. Nodes are taken
    in order of probability (ties: earlier branch, shallower node first, so a node
    always comes after its parent); see `best_prefix` for the choice of how many.
    """
    items = [(p, b) for b, probs in enumerate(branch_probs) for p in probs if p > 0.0]
    items.sort(key=lambda item: -item[0])  # stable: keeps branch and depth order on ties
    best_n, rate = best_prefix([p for p, _ in items], costs, max_nodes, min_gain)
    lengths = [0] * len(branch_probs)
    for _, b in items[:best_n]:
        lengths[b] += 1
    return lengths, rate


def best_prefix(
    probs: Sequence[float],
    costs: Sequence[float],
    max_nodes: int,
    min_gain: float = 0.0,
    fixed_nodes: int = 0,
    fixed_expected: float = 0.0,
) -> tuple[int, float]:
    """How many of `probs` (sorted, largest first) to verify beside a fixed part, and the expected rate.

    The tree is the root, `fixed_nodes` nodes kept whatever the gain (accepted
    `fixed_expected` tokens in expectation) and the first n of `probs`. Every n is
    scored as expected tokens per second, (1 + fixed_expected + sum(probs[:n])) /
    costs[1 + fixed_nodes + n]; the best n wins. With no fixed part, n > 0 must
    beat the root alone by a factor (1 + min_gain).
    """
    used = 1 + fixed_nodes
    limit = max(0, min(len(probs), max_nodes - used, len(costs) - 1 - used))
    expected = 1.0 + fixed_expected
    base = expected / costs[min(used, len(costs) - 1)]
    best_n, best_rate = 0, base * (1.0 + (min_gain if not fixed_nodes else 0.0))
    for n in range(1, limit + 1):
        expected += probs[n - 1]
        rate = expected / costs[used + n]
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n, (best_rate if best_n else base)


def chain_pays(probs: Sequence[float], costs: Sequence[float]) -> bool:
    """Whether verifying a whole chain whose nodes are accepted with `probs` beats the root alone.

    The test a fixed-length drafter such as prompt lookup faces on this machine:
    (1 + sum(probs)) / costs[1 + len(probs)] > 1 / costs[1]. A chain longer than
    the cost table is judged at its largest size.
    """
    size = min(1 + len(probs), len(costs) - 1)
    return (1.0 + sum(probs)) / costs[size] > 1.0 / costs[1]
