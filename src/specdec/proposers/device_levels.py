"""A head's top-k tree chosen level by level on the device, for heads whose tree grows at fixed shapes.

Why: EAGLE-2's and Hydra's trees expand, level after level, the `topk` likeliest
nodes of the level before (`tree_budget`). Chosen on the host, every level read the
head's top-k back first: on a GPU a tree of depth d waited d times. Here each level
is a few tensors (`Level`), the choice is `torch.topk` over the level's cumulative
scores, and the tree's likeliest nodes come back in one transfer at the end
(`likeliest_made`, then `nodes_from` on the host). A head's whole tree then replays
as one CUDA graph (`GraphedCall`): its shapes depend on (depth, topk) only.

How: a level always has `topk` rows. A row with nothing left to expand (fewer than
`topk` nodes at least `min_score`) is chosen with score -inf, and its children score
-inf, so they never rank among the kept nodes. Scores add in float64, as the host's
Python floats did. Nodes are numbered as the host's list made them: level by level,
each chosen row's children in a row.

Invariants: the nodes returned are the host's choice up to ties of equal scores
(each head's tests compare whole trees on the CPU); a node of score -inf never comes
back; every node's parent comes before it in `nodes_from`'s list.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from specdec.engine.read_back import read_back
from specdec.proposers.eagle.retrieval import Node


class Level(NamedTuple):
    """One level's nodes on the device: cumulative scores (float64), target ids, parents' numbers (-1: the
    root), numbers (creation order), all [n]."""

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor
    numbers: torch.Tensor


def root_level(top: torch.Tensor, tokens: torch.Tensor) -> Level:
    """The root's children from its row's top-k: log-probabilities [k] and target ids [k]."""
    numbers = torch.arange(top.numel(), device=top.device)
    return Level(top.double(), tokens, torch.full_like(numbers, -1), numbers)


def choose(level: Level, k: int, min_score: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` likeliest nodes of `level` at least `min_score`: (their scores, -inf where none is left; their
    indices in the level)."""
    return torch.where(level.scores >= min_score, level.scores, -math.inf).topk(k)


def next_level(level: Level, chosen: tuple[torch.Tensor, torch.Tensor], top: torch.Tensor, tokens: torch.Tensor,
               made: int) -> Level:
    """The chosen rows' children: top and tokens [k, k] (each row's top-k); made: the nodes numbered so far."""
    scores, rows = chosen
    numbers = made + torch.arange(top.numel(), device=top.device)
    return Level((scores[:, None] + top.double()).reshape(-1), tokens.reshape(-1),
                 level.numbers[rows].repeat_interleave(top.shape[1]), numbers)


def likeliest_made(levels: list[Level], budget: int) -> tuple[torch.Tensor, ...]:
    """The likeliest `budget - 1` nodes of every level, best first: (scores, target ids, parents' numbers,
    depths (1: the root's children), numbers)."""
    scores = torch.cat([level.scores for level in levels])
    depths = torch.cat([torch.full_like(level.numbers, d) for d, level in enumerate(levels, start=1)])
    best = scores.topk(min(budget - 1, scores.numel())).indices
    return (scores[best], torch.cat([level.tokens for level in levels])[best],
            torch.cat([level.parents for level in levels])[best], depths[best],
            torch.cat([level.numbers for level in levels])[best])


def nodes_from(found: tuple[torch.Tensor, ...], source: str) -> list[Node]:
    """`likeliest_made`'s tensors, read back in one transfer, as the host's candidate list: in creation order,
    each `Node.parent` an index into it. A node whose parent was left out (only on a tie of scores) is dropped."""
    scores, tokens, parents, depths, numbers = read_back(*found)
    nodes: list[Node] = []
    local = {-1: -1}
    for j in sorted(range(len(numbers)), key=numbers.__getitem__):  # parents before children
        if scores[j] != -math.inf and parents[j] in local:
            local[numbers[j]] = len(nodes)
            nodes.append(Node(tokens[j], local[parents[j]], scores[j], depths[j], source))
    return nodes
