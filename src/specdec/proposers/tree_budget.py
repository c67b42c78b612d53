"""Choosing a draft tree from scored candidates: the likeliest nodes, as many as pay.

Why one module: every drafter that scores its candidates with an estimated
acceptance chance (EAGLE's head, Medusa's heads) builds its tree the same way:
take the likeliest candidates (each after its parent), then keep the count that
maximises expected tokens per second on this machine's measured cost curve
(`budget.CostModel.table`), so a tree is only as large as it pays.

Invariants: the kept order is likeliest first with every node after its parent,
so any prefix is a tree (the batch's node budget cuts prefixes); a candidate's
`score` is the log of its estimated acceptance chance, its `parent` an index
into the same candidate list (-1: a child of the root).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specdec.backends.registry import top_tokens
from specdec.proposers.eagle.retrieval import Node
from specdec.tree import DraftTree


def min_score(min_prob: float) -> float:
    """The least cumulative log-probability a node is expanded at (a head's `min_prob` option)."""
    return math.log(min_prob) if min_prob > 0 else -math.inf


def likeliest(nodes: Sequence[Node], budget: int) -> list[int]:
    """Indices of the likeliest candidates whose parent is kept, at most `budget - 1` (the root is one)."""
    order = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth))
    kept: list[int] = []
    inside: set[int] = set()
    for i in order:
        if len(kept) + 1 >= budget:
            break
        if nodes[i].parent == -1 or nodes[i].parent in inside:
            kept.append(i)
            inside.add(i)
    return kept


def paying_count(kept: Sequence[int], nodes: Sequence[Node], costs: Sequence[float]) -> int:
    """How many of `kept` (likeliest first) to verify: all without a cost curve, else the count that
    maximises expected tokens per second of verification (costs[n] = one pass over n nodes)."""
    if not costs:
        return len(kept)
    expected, best, best_rate = 1.0, 0, 1.0 / costs[1]
    for n, i in enumerate(kept, start=1):
        expected += math.exp(nodes[i].score)
        rate = expected / costs[min(n + 1, len(costs) - 1)]
        if rate > best_rate:
            best, best_rate = n, rate
    return best


def as_tree(root: int, nodes: Sequence[Node], kept: Sequence[int]) -> DraftTree:
    """The tree of `root` and the `kept` candidates, in that order."""
    slot = {i: s + 1 for s, i in enumerate(kept)}
    tokens = [root, *(nodes[i].token for i in kept)]
    parents = [-1, *(0 if nodes[i].parent == -1 else slot[nodes[i].parent] for i in kept)]
    return DraftTree.of_lists(tokens, parents)


def top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (log-probabilities [N, k] fp32, ids [N, k]) of each row's k likeliest tokens, best first.

    The log-softmax at those ids only (x - logsumexp x), the ids from one pass over each row (`top_tokens`),
    instead of torch's log-softmax and topk over the whole vocabulary at every level of a head's tree
    (docs/benchmarks.md, design choices). Equal scores may come in another order than torch.topk's (the tree's
    shape only, never the output).
    """
    k = min(k, logits.shape[-1])
    ids = top_tokens(logits, k)
    wide = logits.float()
    # -1 marks a row with fewer than k scores that are not NaN (the CPU kernel only: no host sync elsewhere)
    if ids.device.type == "cpu" and bool((ids < 0).any()):
        return torch.log_softmax(wide, dim=-1).topk(k, dim=-1)
    return wide.gather(-1, ids) - torch.logsumexp(wide, dim=-1, keepdim=True), ids
