"""EAGLE's top-k tree levels at fixed shapes, so each level's head step replays as one CUDA graph on a GPU.

Why: a level of EAGLE's tree is one head step over the expanded nodes: the
head's attention, MLP and draft-vocabulary head, then a top-k, about forty small
kernels. On a GPU those cost their launches, not their work, beside a
verification pass that replays as one graph. `HeadSteps` (`sampled`) sizes each
level's step by what it expands and by every entry the head holds, so no two
steps share a shape; here they do, and `GraphedCall` replays them.

How: a level always runs `topk` rows (the chosen nodes, then copies of the last
one, whose outputs are never read). The committed entries are copied into a
buffer of a power-of-two capacity, and the tree's entries get fixed slots: level
L's rows write slots (L - 1) * topk .. L * topk - 1 of a buffer of `depth` *
`topk`. The boolean mask [topk, capacity + slots] lets a row see the committed
entries and its own line's tree slots only, as `HeadSteps` does; unused slots and
padding are masked out, so they add exact zeros to the attention. One graph a
(level, capacity) pair.

Invariants: a real row's logits are `HeadSteps.run`'s (up to the summation order
of the wider attention), so the tree is the same up to ties (tests/test_eagle.py
compares them on the CPU, where the same padded steps run eagerly); padded rows'
entries sit in slots no real row's mask opens; the proposer uses this class only
where graphs run, and `HeadSteps` elsewhere (a CPU pays for every padded row).
"""

from __future__ import annotations

import torch

from specdec.backends.registry import GraphedCall, bucket
from specdec.engine.read_back import read_back
from specdec.proposers.eagle.head import Eagle3Head
from specdec.proposers.eagle.retrieval import Node
from specdec.proposers.tree_budget import top_log_probs


class PaddedSteps:
    """The head's top-k tree levels over one propose's nodes, each level `topk` rows wide (`GraphedCall`)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, state: torch.Tensor, root_pos: int, topk: int,
                 depth: int, call: GraphedCall) -> None:
        """keys, values [1, kv, E, d]: the committed entries; state [H]: the root's parent's; depth: the most
        levels a tree has; call: the proposer's `GraphedCall` of `level_step` (its graphs outlive a propose)."""
        self.topk, self.root_pos, self.call = topk, root_pos, call
        self.fed = keys.shape[2]
        self.capacity = bucket(self.fed)
        self.keys = keys.new_zeros(*keys.shape[:2], self.capacity + depth * topk, keys.shape[3])
        self.values = torch.zeros_like(self.keys)
        self.keys[:, :, : self.fed] = keys
        self.values[:, :, : self.fed] = values
        self.slot: dict[int, int] = {}  # expanded node -> its entry's slot in the buffers
        self.states: dict[int, torch.Tensor] = {-1: state}

    def run(self, nodes: list[Node], chosen: list[int], level_depth: int) -> tuple[list[list[float]], list[list[int]]]:
        """One head step at each chosen node (all of depth `level_depth`, at most `topk`): per chosen node its
        children's (log-probabilities, target token ids), best first."""
        k, device = self.topk, self.keys.device
        rows = chosen + chosen[-1:] * (k - len(chosen))
        first = self.capacity + (level_depth - 1) * k  # this level's first slot
        hidden = torch.stack([self.states[nodes[i].parent] for i in rows])[None]  # [1, k, H]
        tokens = torch.tensor([[nodes[i].token for i in rows]])
        positions = torch.full_like(tokens, self.root_pos + level_depth - 1)
        mask = torch.zeros(k, self.keys.shape[2], dtype=torch.bool)
        mask[:, : self.fed] = True
        for j in range(k):
            self.slot.setdefault(rows[j], first + j)
            mask[j, first + j] = True  # its own entry (a padded row's: never in a real row's line)
            a = nodes[rows[j]].parent
            while a >= 0:  # its ancestors' (all expanded earlier)
                mask[j, self.slot[a]] = True
                a = nodes[a].parent
        inputs = (tokens, positions, mask)
        top, ids, states, self.keys, self.values = self.call(
            hidden, *(t.to(device, non_blocking=True) for t in inputs), self.keys, self.values,
            key=(level_depth, self.capacity),
        )
        for j, i in enumerate(chosen):
            self.states[i] = states[0, j]
        real = len(chosen)
        top, ids = read_back(top, ids)  # one wait, not one a tensor
        return top[:real], ids[:real]


def level_step(head: Eagle3Head, draft_ids: torch.Tensor, topk: int, key: tuple[int, int], hidden: torch.Tensor,
               tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A level's step at fixed shapes: (top-k log-probabilities [k, topk], their target ids, the rows' states
    [1, k, H], keys and values with this level's entries in their slots). key: (level, committed capacity)."""
    level_depth, capacity = key
    k = hidden.shape[1]
    first = capacity + (level_depth - 1) * k
    q, kk, vv = head.qkv(hidden, tokens, positions)
    keys, values = keys.clone(), values.clone()
    keys[:, :, first : first + k] = kk
    values[:, :, first : first + k] = vv
    out, states = head.finish(hidden, q, keys, values, mask[None, None])
    top, ids = top_log_probs(out[0], topk)
    return top, draft_ids[ids], states, keys, values
