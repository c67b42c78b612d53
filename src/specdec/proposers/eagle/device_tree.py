"""EAGLE's whole top-k tree grown on the device at fixed shapes: one CUDA graph and one wait a tree.

(And the catch-up before it, the head fed the newly committed positions, as one graph at fixed shapes:
`catch_up`. Eager, it was some forty launches a step.)

Why: a level of EAGLE-2's tree is one head step over the expanded nodes (the head's
attention, MLP and draft-vocabulary head, then a top-k), about forty small kernels,
and choosing the next level's nodes read the step's top-k back to the host: on a GPU
a tree of depth 6 cost five waits and two hundred launches beside a verification pass
that replays as one graph. Here every level, and the choice of what it expands, is
tensor work at shapes fixed by (depth, committed capacity), so `GraphedCall` replays
the whole tree as one graph, and its likeliest nodes come back in one transfer
(`device_levels.nodes_from`). The host then keeps as many as pay, as before (`tree_budget`).

How: level 0 is the root's children, the top-k of the head's logits at the root's
parent. Each later level expands the `topk` likeliest nodes of the level before
(`device_levels`: `torch.topk` where the host used a heap, always `topk` rows). The
committed entries sit in a power-of-two buffer; level L's rows write tree slots
(L - 1) * topk .. L * topk - 1 after it, and a row's mask opens the committed
entries, its ancestors' slots (its parent row's mask) and its own.

Invariants: a real row's logits are `HeadSteps.run`'s (up to the summation order of
the wider attention), so the tree is the host's up to ties of equal scores
(tests/test_eagle.py compares them over a real generation on the CPU, where this
runs eagerly); the proposer uses this only where graphs run (a CPU pays for every
padded row and is better served by `HeadSteps`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdec.backends.registry import GraphedCall, bucket
from specdec.proposers.device_levels import choose, likeliest_made, next_level, nodes_from, root_level
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
    found = call(logits, state, F.pad(keys, pad), F.pad(values, pad), where, key=(depth, capacity))
    return nodes_from(found, "eagle")  # one wait


def tree_step(head: Eagle3Head, draft_ids: torch.Tensor, k: int, min_score: float, budget: int,
              key: tuple[int, int], logits: torch.Tensor, state: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tree at fixed shapes (`device_levels.likeliest_made`'s tensors). key: (depth, committed capacity);
    keys and values [1, kv, capacity, d]; where: [entries fed, root position]; k: the top-k."""
    depth, capacity = key
    device = logits.device
    top, ids = top_log_probs(logits[None], k)  # as the host's `_top` reads it
    levels = [root_level(top[0], draft_ids[ids[0]])]
    slots = capacity + (depth - 1) * k
    keys, values = (F.pad(t, (0, 0, 0, slots - capacity)) for t in (keys, values))
    masks = (torch.arange(slots, device=device) < where[0]).expand(k, slots)  # the rows': committed entries only
    states, parent_row = state.expand(k, -1), torch.zeros(k, dtype=torch.long, device=device)
    for level in range(1, depth):
        chosen = choose(levels[-1], k, min_score)
        rows = parent_row[chosen[1]]  # the rows of the step before whose states and masks the chosen extend
        first = capacity + (level - 1) * k
        masks = masks[rows] | (torch.arange(slots, device=device) == first + torch.arange(k, device=device)[:, None])
        positions = (where[1] + level - 1).expand(1, k)
        q, kk, vv = head.qkv(states[rows][None], levels[-1].tokens[chosen[1]][None], positions)
        keys[:, :, first : first + k] = kk
        values[:, :, first : first + k] = vv
        out, new_states = head.finish(states[rows][None], q, keys, values, masks[None, None])
        top, ids = top_log_probs(out[0], k)  # [k, k]: each chosen row's children, best first
        levels.append(next_level(levels[-1], chosen, top, draft_ids[ids], k + (level - 1) * k * k))
        states, parent_row = new_states[0], torch.arange(k, device=device).repeat_interleave(k)
    return likeliest_made(levels, budget)


def tree_call(head: Eagle3Head, topk: int, min_score: float, budget: int) -> GraphedCall:
    """The head's whole top-k tree (`tree_step`) as one CUDA graph per (depth, capacity) on a GPU."""
    return GraphedCall(functools.partial(tree_step, head, head.draft_ids, topk, min_score, budget))


MAX_CATCH_UP = 16  # newly committed positions a graphed catch-up takes; more (a prompt's) run eagerly


def catch_up(call: GraphedCall, keys: torch.Tensor, values: torch.Tensor, features: torch.Tensor,
             tokens: list[int], positions: list[int]) -> tuple[torch.Tensor, ...]:
    """The head fed `features` [m, F] of committed `positions` (each with the token after it), by `call` (a
    `GraphedCall` of `catch_up_step`): its logits [V_d] and state [H] at the last, and the committed entries
    with the new ones after them (keys, values [1, kv, E + m, d])."""
    m, fed = features.shape[0], keys.shape[2]
    rows = bucket(m)
    capacity = bucket(fed + rows)
    spare = rows - m  # padded rows: their entries land past the real ones, where no mask opens
    ints = torch.tensor([*tokens, *[0] * spare, *positions, *positions[-1:] * spare, fed, m])
    inputs = (F.pad(features, (0, 0, 0, spare)), ints.to(features.device, non_blocking=True),
              F.pad(keys, (0, 0, 0, capacity - fed)), F.pad(values, (0, 0, 0, capacity - fed)))
    logits, state, new_keys, new_values = call(*inputs, key=(rows, capacity))
    # the graph's outputs are its own buffers, rewritten at the next replay: the entries are copied out
    return (logits, state, torch.cat([keys, new_keys[:, :, :m]], dim=2),
            torch.cat([values, new_values[:, :, :m]], dim=2))


def catch_up_step(head: Eagle3Head, key: tuple[int, int], features: torch.Tensor, ints: torch.Tensor,
                  keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The catch-up at fixed shapes. key: (rows, capacity); ints: the rows' tokens, their positions, then
    [entries fed, real rows]; keys and values [1, kv, capacity, d], the committed entries first. Returns
    (logits [V_d], state [H] at the last real row, the rows' keys and values [1, kv, rows, d])."""
    rows, capacity = key
    device = features.device
    tokens, positions, fed, real = ints[:rows], ints[rows : 2 * rows], ints[2 * rows], ints[2 * rows + 1]
    hidden = head.fuse(features)[None]  # [1, rows, H]
    q, k, v = head.qkv(hidden, tokens[None], positions[None])
    slots = fed + torch.arange(rows, device=device)
    keys, values = keys.index_copy(2, slots, k), values.index_copy(2, slots, v)
    last = (real - 1).reshape(1)
    # every real entry: the committed positions increase, so all are at or before the last (`_feed` checks)
    mask = torch.arange(capacity, device=device) < fed + real
    out, state = head.finish(hidden.index_select(1, last), q.index_select(2, last), keys, values, mask[None, None, None])
    return out[0, -1], state[0, -1], k, v


def catch_up_call(head: Eagle3Head) -> GraphedCall:
    """The head's catch-up (`catch_up_step`) as one CUDA graph per (rows, capacity) on a GPU."""
    return GraphedCall(functools.partial(catch_up_step, head))
