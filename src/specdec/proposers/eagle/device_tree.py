"""EAGLE's whole top-k tree grown on the device at fixed shapes: one CUDA graph and one wait a tree.

Why: a level of EAGLE-2's tree is one head step over the expanded nodes (the head's
attention, MLP and draft-vocabulary head, then a top-k), about forty small kernels,
and choosing the next level's nodes read the step's top-k back to the host: on a GPU
a tree of depth 6 cost five waits and two hundred launches beside a verification pass
that replays as one graph. Here every level, and the choice of what it expands, is
tensor work at shapes fixed by (depth, committed capacity), so `GraphedCall` replays
the whole tree as one graph, and its likeliest nodes come back in one transfer
(`read_back`). The host then keeps as many as pay, as before (`tree_budget`).

How: level 0 is the root's children, the top-k of the head's logits at the root's
parent. Each later level expands the `topk` likeliest nodes of the level before
whose cumulative score is at least `min_score` (`torch.topk`, where the host used a
heap), always `topk` rows: a row with nothing to expand gets score -inf, and so do
its children, which therefore never rank among the kept nodes. The committed
entries sit in a power-of-two buffer; level L's rows write tree slots
(L - 1) * topk .. L * topk - 1 after it, and a row's mask opens the committed
entries, its ancestors' slots (its parent row's mask) and its own. Scores add in
float64, as the host's Python floats did. Nodes are numbered as the host numbered
them: level by level, each expanded row's children in a row.

Invariants: a real row's logits are `HeadSteps.run`'s (up to the summation order of
the wider attention), so the tree is the host's up to ties of equal scores
(tests/test_eagle.py compares them over a real generation on the CPU, where this
runs eagerly); a node with score -inf is never returned; the returned nodes are the
likeliest `budget - 1` by score, best first; the proposer uses this only where
graphs run (a CPU pays for every padded row and is better served by `HeadSteps`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdec.backends.registry import GraphedCall, bucket
from specdec.engine.read_back import read_back
from specdec.proposers.eagle.head import Eagle3Head
from specdec.proposers.eagle.retrieval import Node
from specdec.proposers.tree_budget import top_log_probs


def grow(call: GraphedCall, logits: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
         root_pos: int, depth: int) -> list[Node]:
    """The tree's likeliest nodes (each `Node.parent` an index into the list, -1 below the root), grown by
    `call` (a `GraphedCall` of `tree_step`): logits [V_d] and state [H] at the root's parent, keys and values
    [1, kv, E, d] the head's committed entries. In the order the host made them (level by level)."""
    fed = keys.shape[2]
    capacity = bucket(fed)
    pad = (0, 0, 0, capacity - fed)
    where = torch.tensor([fed, root_pos]).to(logits.device, non_blocking=True)
    inputs = (logits, state, F.pad(keys, pad), F.pad(values, pad), where)
    scores, tokens, parents, levels, numbers = read_back(*call(*inputs, key=(depth, capacity)))  # one wait
    nodes: list[Node] = []
    local = {-1: -1}
    for j in sorted(range(len(numbers)), key=numbers.__getitem__):  # parents before children
        if scores[j] != -math.inf and parents[j] in local:  # a parent left out only on a tie of scores
            local[numbers[j]] = len(nodes)
            nodes.append(Node(tokens[j], local[parents[j]], scores[j], levels[j]))
    return nodes


def tree_step(head: Eagle3Head, draft_ids: torch.Tensor, topk: int, min_score: float, budget: int,
              key: tuple[int, int], logits: torch.Tensor, state: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tree at fixed shapes. key: (depth, committed capacity); keys and values [1, kv, capacity, d];
    where: [entries fed, root position]. Returns the likeliest `budget - 1` nodes, best first: (scores
    float64, target ids, their parents' numbers (-1: the root), levels (1: the root's children), numbers)."""
    depth, capacity = key
    device, k = logits.device, topk
    top, ids = top_log_probs(logits[None].float(), k)
    level = Level(top[0].double(), draft_ids[ids[0]], torch.full((k,), -1, device=device), torch.arange(k, device=device))
    made = [level]
    slots = capacity + (depth - 1) * k
    keys, values = (F.pad(t, (0, 0, 0, slots - capacity)) for t in (keys, values))
    masks = (torch.arange(slots, device=device) < where[0]).expand(k, slots)  # the rows': committed entries only
    states, parent_row = state.expand(k, -1), torch.zeros(k, dtype=torch.long, device=device)
    for depth_now in range(1, depth):
        chosen_score, chosen = torch.where(level.scores >= min_score, level.scores, -math.inf).topk(k)
        rows = parent_row[chosen]  # the rows of the step before whose states and masks the chosen extend
        first = capacity + (depth_now - 1) * k
        masks = masks[rows] | (torch.arange(slots, device=device) == first + torch.arange(k, device=device)[:, None])
        positions = (where[1] + depth_now - 1).expand(1, k)
        q, kk, vv = head.qkv(states[rows][None], level.tokens[chosen][None], positions)
        keys[:, :, first : first + k] = kk
        values[:, :, first : first + k] = vv
        out, new_states = head.finish(states[rows][None], q, keys, values, masks[None, None])
        top, ids = top_log_probs(out[0], k)  # [k, k]: each chosen row's children, best first
        numbers = k + (depth_now - 1) * k * k + torch.arange(k * k, device=device)
        level = Level((chosen_score[:, None] + top.double()).reshape(-1), draft_ids[ids].reshape(-1),
                      level.numbers[chosen].repeat_interleave(k), numbers)
        made.append(level)
        states, parent_row = new_states[0], torch.arange(k, device=device).repeat_interleave(k)
    scores = torch.cat([m.scores for m in made])
    levels = torch.cat([torch.full_like(m.numbers, d + 1) for d, m in enumerate(made)])
    best = scores.topk(min(budget - 1, scores.numel())).indices
    return (scores[best], torch.cat([m.tokens for m in made])[best], torch.cat([m.parents for m in made])[best],
            levels[best], torch.cat([m.numbers for m in made])[best])


class Level(NamedTuple):
    """One level's nodes on the device: cumulative scores (float64), target ids, parents' numbers, numbers."""

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor
    numbers: torch.Tensor


def tree_call(head: Eagle3Head, topk: int, min_score: float, budget: int) -> GraphedCall:
    """The head's whole top-k tree (`tree_step`) as one CUDA graph per (depth, capacity) on a GPU."""
    return GraphedCall(functools.partial(tree_step, head, head.draft_ids, topk, min_score, budget))
