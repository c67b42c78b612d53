"""Retrieved continuations as extra branches of an EAGLE tree, under the same node budget.

Why (LogitSpec's open question 3): a head guesses well on text it has learned,
retrieval guesses well where the output copies its context; one tree can hold
both. Two kinds of branch are added to the head's candidates: prompt lookup's
chain below the root (the continuation of the context's last n-gram), and,
LogitSpec's move, a continuation below each of the head's likeliest first
tokens (the context's n-gram ending in root + that token, looked up in the same
index). A retrieved node's score is its parent's plus the log of retrieval's
acceptance rate at its depth in the branch, learned online, so retrieved and
drafted nodes compete for the same budget on one scale (log-probability of
being accepted).

Invariants: a retrieved token equal to a candidate already under the same
parent is merged into it (one node, the higher score); a node never scores
above its parent, so the likeliest-first order keeps every node after its
parent.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from specdec.engine.costs import AcceptanceStats
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import synced_index

MAX_NGRAM = 3
NEXT_NEXT_BRANCHES = 3  # the head's likeliest first tokens that get a retrieved continuation
BRANCH_LENGTH = 10
PRIOR = (0.4, 4.0)  # retrieval's acceptance rate before any observation: mean, strength


@dataclass
class Node:
    token: int  # target id
    parent: int  # index in the candidate list; -1 for the root's children
    score: float  # log of the estimated chance the node is accepted (the head's cumulative probability)
    depth: int
    source: str = "eagle"  # "eagle", "retrieval", or "both" (merged)
    branch_depth: int = 0  # depth inside its retrieved branch (retrieved nodes)


class Retrieval:
    """An n-gram index over the context, and retrieval's acceptance rates by depth."""

    def __init__(self) -> None:
        self.index = NGramIndex(MAX_NGRAM, "latest")
        self.rates = AcceptanceStats(lambda _: PRIOR)

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = NGramIndex(MAX_NGRAM, "latest")
        self.index.extend(prompt_ids)

    def add_branches(self, nodes: list[Node], token_ids: list[int], max_depth: int) -> None:
        """Add the retrieved branches (below the root and the head's likeliest first tokens) to `nodes`."""
        self.index = synced_index(self.index, token_ids)
        length = min(BRANCH_LENGTH, max_depth)
        if length <= 0:
            return
        children = {(n.parent, n.token): i for i, n in enumerate(nodes)}
        firsts = heapq.nlargest(NEXT_NEXT_BRANCHES, (i for i, n in enumerate(nodes) if n.parent == -1),
                                key=lambda i: nodes[i].score)  # fmt: skip
        branches = [(-1, self.index.lookup(token_ids, length, min_ngram=1))]
        for i in firsts:
            if length > 1:
                branches.append((i, self.index.lookup([*token_ids, nodes[i].token], length - 1, min_ngram=2)))
        for parent, chain in branches:
            self._merge(nodes, children, parent, chain)

    def _merge(self, nodes: list[Node], children: dict, parent: int, chain: list[int]) -> None:
        score = nodes[parent].score if parent >= 0 else 0.0
        depth = nodes[parent].depth if parent >= 0 else 0
        for step, token in enumerate(chain, start=1):
            score += math.log(max(self.rates.rate(step), 1e-6))
            depth += 1
            at = children.get((parent, token))
            if at is None:
                nodes.append(Node(token, parent, score, depth, "retrieval", step))
                at = children[(parent, token)] = len(nodes) - 1
            else:
                node = nodes[at]
                node.score = max(node.score, score)
                node.branch_depth = node.branch_depth or step
                node.source = "both" if node.source == "eagle" else node.source
            parent, score = at, nodes[at].score

    def observe(self, kept: list[Node], parents: list[int], path: list[int]) -> None:
        """Learn from one verified tree: kept[j] is tree node j + 1, parents the tree's parent array, path
        the accepted node ids. A rate is conditional on the parent's acceptance, as the scores use it."""
        accepted = set(path)
        for j, node in enumerate(kept, start=1):
            if node.branch_depth and parents[j] in accepted:
                self.rates.update(node.branch_depth, 1.0, float(j in accepted))
