"""EAGLE trees drawn from the head's own distribution, for the multi-draft rule at temperature > 0.

Why: a tree of the head's top-k guesses is verified at temperature > 0 by the
deterministic rule, which accepts a child only when the target's own draw is
that child's token: where the target spreads its mass, few draws hit the
guesses. Children *drawn* from the head's distribution q and verified by
recursive rejection sampling (`specdec.engine.accept.accept_multi_draft`) are
accepted with probability min(1, p / q) each, about 1 - TV(p, q) for the first:
a good head is accepted often even where p is flat.

The head's distribution is its logits over its draft vocabulary put through
the target's own transform (`logits_to_probs`: temperature, top-k, top-p), as
`draft.py` does for a draft model; draft ids map to target ids through
`head.draft_ids`, and every drawn node's `draft_probs` row is its parent's
distribution scattered into the target's vocabulary ([N, V] float32 on the
target's device, built once per step; row 0, the root's, is zeros).

Losslessness: the multi-draft rule is exact when, at every node, the children
kept are i.i.d. draws from that node's row and how many are kept does not
depend on their own values. So each level is grown in three moves, in order:
1. how many children each parent gets is decided from what is known before
   they are drawn: the parents' scores, their rows, the cost curve and budget
   (`SampledPlan.counts`);
2. the children are drawn, with replacement, each from its parent's row, from
   the proposer's own generator (independent of the verifier's);
3. which of them are expanded at the next level may depend on their drawn
   tokens (the likeliest, duplicates skipped): that only shapes their
   descendants, which are drawn fresh from rows that follow their paths.
No drawn node is ever dropped. Nodes are ordered level by level, each parent's
children contiguous in draw order. The tree is not cut after it is drawn: the
engine's node budget looks at the whole tree's shape, which depends on drawn
values, so a sampled tree is not `prunable` (see `EagleProposer.prunable`);
the invariant engine's `verifiable` cut looks only at the nodes placed before a
node, which level order makes independent of the node's own level's values.

A duplicate sibling is never accepted (once x is rejected the residual has no
mass at x), so duplicates are not expanded; their rejection still shrinks the
residual, so they are kept where drawn. The number of children per parent uses
EAGLE-2's proxy (the target samples as the head does): the j-th draw adds the
mass it is expected to cover that the first j - 1 draws did not, so a peaked
row gets few children and duplicates are rarely paid for.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from specdec.proposers.eagle.head import Eagle3Head
from specdec.proposers.eagle.retrieval import Node
from specdec.sampling import SamplingParams, logits_to_probs

_SEED_MIX = 0x9E3779B97F4A7C15  # as draft.py: the proposer's stream must differ from the verifier's
_STREAM = 2  # draft.py uses 1


class HeadSteps:
    """The head's drafted steps over one tree's nodes: their attention entries and states.

    Both trees (top-k and sampled) expand nodes level by level through `run`; an expanded node's
    entry and state stay for its descendants. Entries of committed positions are `keys` / `values`
    (the proposer's), tree entries live only while the tree is drafted.
    """

    def __init__(
        self, head: Eagle3Head, keys: torch.Tensor, values: torch.Tensor, state: torch.Tensor, root_pos: int
    ) -> None:
        self.head, self.keys, self.values, self.root_pos = head, keys, values, root_pos
        self.fed = keys.shape[2]
        self.tree_keys: list[torch.Tensor] = []  # entries of expanded nodes, [1, kv, 1, d] each, by run order
        self.tree_values: list[torch.Tensor] = []
        self.run_index: dict[int, int] = {}  # node index -> its entry's index in tree_keys
        self.states: dict[int, torch.Tensor] = {-1: state}

    def run(self, nodes: list[Node], chosen: list[int], level_depth: int) -> torch.Tensor:
        """One head step at each chosen node (all of depth `level_depth`): their logits [c, V_d]."""
        head = self.head
        hidden = torch.stack([self.states[nodes[i].parent] for i in chosen])[None]  # [1, c, H]
        tokens = torch.tensor([nodes[i].token for i in chosen], device=hidden.device)[None]
        positions = torch.full_like(tokens, self.root_pos + level_depth - 1)
        q, kk, vv = head.qkv(hidden, tokens, positions)
        for j, i in enumerate(chosen):
            self.run_index[i] = len(self.tree_keys)
            self.tree_keys.append(kk[:, :, j : j + 1])
            self.tree_values.append(vv[:, :, j : j + 1])
        keys = torch.cat([self.keys, *self.tree_keys], dim=2)
        values = torch.cat([self.values, *self.tree_values], dim=2)
        mask = torch.zeros(len(chosen), keys.shape[2], dtype=torch.bool, device=hidden.device)
        mask[:, : self.fed] = True
        for j, i in enumerate(chosen):
            a = i
            while a >= 0:  # own entry and its ancestors' (all expanded earlier)
                mask[j, self.fed + self.run_index[a]] = True
                a = nodes[a].parent
        out, new_states = head.finish(hidden, q, keys, values, mask[None, None])
        for j, i in enumerate(chosen):
            self.states[i] = new_states[0, j]
        return out[0]


def draft_generator(sampling: SamplingParams, device: torch.device) -> torch.Generator:
    """The proposer's own generator, seeded from the request's seed through a fixed mix (as draft.py's)."""
    seed = sampling.seed
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), dtype=torch.int64))
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * _SEED_MIX + _STREAM) % 2**63)
    return generator


def slot_gains(probs: torch.Tensor, scores: list[float], k: int) -> torch.Tensor:
    """[c, k] float64: what the j-th i.i.d. draw below each parent adds to the expected accepted tokens.

    probs: [c, V_d] the parents' rows; scores: their log chances of being reached. Under EAGLE-2's
    proxy (the target draws as the head does) the j-th draw covers sum_x q(x)^2 (1 - q(x))^(j-1) new
    mass; decreasing in j, so the slots a parent gets are always its first ones.
    """
    q = probs.double()
    term = q * q  # [c, V_d]
    gains = torch.empty(q.shape[0], k, dtype=torch.float64, device=q.device)
    for j in range(k):
        gains[:, j] = term.sum(-1)
        term = term * (1 - q)
    reach = torch.tensor(scores, dtype=torch.float64, device=q.device).exp()[:, None]  # [c, 1]
    return gains * reach


@dataclass
class Level:
    """One drawn level: the parents' rows and how many children each got (contiguous, parent order)."""

    probs: torch.Tensor  # [c, V_d] float32, the distribution each parent's children were drawn from
    counts: list[int]
    start: int  # index in the node list of the level's first child


@dataclass
class SampledPlan:
    """How many nodes to draw per level, decided before each level is drawn (see module docstring).

    topk: most parents expanded per level, and most children drawn per level; budget: most nodes,
    root included; costs: the cost table (`CostModel.table`), [] for none (then the budget alone).
    """

    topk: int
    min_score: float
    budget: int
    costs: list[float]
    num_nodes: int = 1  # drawn so far, root included
    expected: float = 1.0  # expected tokens per step of what is drawn (the proxy)

    def counts(self, probs: torch.Tensor, scores: list[float]) -> list[int]:
        """Children per parent for the next level: the highest-gain slots, as many as pay."""
        gains = slot_gains(probs, scores, self.topk).tolist()
        room = max(0, min(self.topk, self.budget - self.num_nodes))
        slots = sorted(((g, p) for p, row in enumerate(gains) for g in row if g > 0), key=lambda s: -s[0])
        slots = slots[:room]  # stable sort: a parent's slots stay in order
        taken = self._pays([g for g, _ in slots])
        out = [0] * len(gains)
        for _, p in slots[:taken]:
            out[p] += 1
        self.num_nodes += taken
        self.expected += sum(g for g, _ in slots[:taken])
        return out

    def _pays(self, gains: list[float]) -> int:
        """How many of `gains` (largest first) maximise expected tokens per second (all without costs)."""
        if not self.costs:
            return len(gains)
        best, best_rate, expected = 0, self.expected / self.costs[self.num_nodes], self.expected
        for m, gain in enumerate(gains, start=1):
            expected += gain
            rate = expected / self.costs[min(self.num_nodes + m, len(self.costs) - 1)]
            if rate > best_rate:
                best, best_rate = m, rate
        return best

    def expand(self, nodes: list[Node], level: Level) -> list[int]:
        """The level's likeliest children to expand next (may look at their tokens): duplicates and
        nodes below `min_score` never."""
        first: dict[tuple[int, int], int] = {}
        for i in range(level.start, len(nodes)):
            first.setdefault((nodes[i].parent, nodes[i].token), i)
        likely = (i for i in first.values() if nodes[i].score >= self.min_score)
        return sorted(heapq.nlargest(self.topk, likely, key=lambda i: nodes[i].score))  # in node order


def draw_level(
    level: Level, parents: list[int], scores: list[float], depth: int, nodes: list[Node],
    generator: torch.Generator, draft_ids: torch.Tensor,
) -> None:  # fmt: skip
    """Append each parent's children, drawn i.i.d. (with replacement) from its row, to `nodes`."""
    most = max(level.counts)
    drawn = torch.multinomial(level.probs, most, replacement=True, generator=generator)  # [c, most]
    logq = level.probs.gather(1, drawn).log().tolist()
    targets = draft_ids[drawn].tolist()
    for row, (parent, count) in enumerate(zip(parents, level.counts, strict=True)):
        for j in range(count):  # the first `count` draws: how many was fixed before drawing
            nodes.append(Node(targets[row][j], parent, scores[row] + logq[row][j], depth))


def grow_sampled(
    steps: HeadSteps, logits: torch.Tensor, plan: SampledPlan, depth: int, sampling: SamplingParams,
    generator: torch.Generator, draft_ids: torch.Tensor,
) -> tuple[list[Node], list[Level]]:  # fmt: skip
    """Draw the tree level by level (count, draw, choose what to expand); nodes in level order."""
    nodes: list[Node] = []
    levels: list[Level] = []
    parents, scores, out = [-1], [0.0], logits[None]
    for level_depth in range(1, depth + 1):
        probs = logits_to_probs(out, sampling)  # [c, V_d] float32
        counts = plan.counts(probs, scores)
        if not any(counts):
            break
        levels.append(Level(probs, counts, len(nodes)))
        draw_level(levels[-1], parents, scores, level_depth, nodes, generator, draft_ids)
        chosen = plan.expand(nodes, levels[-1]) if level_depth < depth else []
        if not chosen:
            break
        out = steps.run(nodes, chosen, level_depth)
        parents, scores = chosen, [nodes[i].score for i in chosen]
    return nodes, levels


def draft_rows(
    levels: list[Level], num_nodes: int, draft_ids: torch.Tensor, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[num_nodes, V] float32 on `device`: row i is node i's parent's distribution (row 0 zeros).

    One block copy per level (each level's children are contiguous): no loop over nodes or V.
    """
    rows = torch.zeros(num_nodes, vocab_size, dtype=torch.float32, device=device)
    columns = draft_ids.to(device)
    for level in levels:
        owner = torch.repeat_interleave(torch.arange(len(level.counts)), torch.tensor(level.counts))
        block = level.probs.to(device)[owner.to(device)]  # [m, V_d]
        start = 1 + level.start
        rows[start : start + block.shape[0]].index_copy_(1, columns, block)
    return rows
