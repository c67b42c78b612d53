"""Hydra: Medusa's tree, each level guessed for its parent's own prefix (sequentially dependent heads).

Why: Medusa's heads guess every level from the target's state alone, so every
branch below a node gets the same children; Hydra's head d also reads the branch
so far (`specdec.proposers.hydra.head`, Ankner et al. 2024, arXiv 2402.05109), so a
node's children are guessed for that node. The tree is grown as Medusa's is
(level by level below the `topk` likeliest nodes, scored by cumulative
probability) and cut to the size that pays on this machine's cost curve
(`tree_budget`); only the children differ, computed per expanded parent with one
batched product per level.

Invariants: lossless whatever the heads guess (verification decides); drafts are
deterministic guesses (`draft_probs` None), as Medusa's; the state is the one the
verification pass captured (no extra pass of the target); head d reads exactly
the root and the d tokens above the node it expands.
"""

from __future__ import annotations

import functools
import heapq
from pathlib import Path

import torch

from specdec.backends.registry import GraphedCall
from specdec.drafters.shipped import find_shipped_head
from specdec.engine.costs import load_or_measure
from specdec.engine.read_back import read_back
from specdec.models import LoadedModel
from specdec.proposers.device_levels import choose, likeliest_made, next_level, nodes_from, root_level
from specdec.proposers.eagle.retrieval import Node
from specdec.proposers.hydra.head import ARCHITECTURE, HydraHeads
from specdec.proposers.medusa import load_medusa
from specdec.proposers.medusa.proposer import MedusaConfig, MedusaProposer
from specdec.proposers.schema import method_config
from specdec.proposers.tree_budget import min_score, top_log_probs


@method_config("hydra")
class HydraConfig(MedusaConfig):
    """Hydra heads drafting Medusa's cost-sized tree, each level guessed for its parent's prefix.

    head: the heads' folder (Medusa's layout, `HydraModel`); "" = the heads shipped for the loaded model;
    the other options are Medusa's (topk, min_prob, budget, adaptive, blocks, costs_dir), with its bounds.
    """

    def load(self, loaded: LoadedModel) -> HydraHeads:
        folder = Path(self.head).expanduser() if self.head else find_shipped_head(loaded, ARCHITECTURE)
        key = ("hydra-heads", str(folder.resolve()), self.blocks)
        return loaded.state.shared(key, lambda: self.drafting(load_medusa(folder, loaded.model, kind=HydraHeads)))

    def build(self, loaded: LoadedModel) -> HydraProposer:
        costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
        heads = self.load(loaded)
        key = ("hydra-tree", heads, self.topk, self.min_prob, self.budget)
        step = loaded.state.shared(key, lambda: HydraProposer.graphed_step(heads, self))
        return HydraProposer(self, heads, costs, loaded.eos_token_ids, step)


class HydraProposer(MedusaProposer):
    name = "hydra"
    heads: HydraHeads
    device_tree: bool | None = None  # the tree grown on the device (`tree_step`): None where graphs run

    def _nodes(self, root: int, state: torch.Tensor, depth: int) -> list[Node]:
        """Level d: head d's top-k below each of the `topk` likeliest nodes of level d - 1, for its branch."""
        if self.device_tree if self.device_tree is not None else self.step.graphs_for(state):
            found = self.step(state, torch.tensor([root]).to(state.device, non_blocking=True), key=depth)
            return nodes_from(found, "hydra")  # one wait a tree
        k = self.config.topk
        nodes: list[Node] = []
        parents, branches = [-1], [[root]]
        for d in range(depth):
            branch = torch.tensor(branches, device=state.device)  # [c, d + 1]
            values, ids = top_log_probs(self.heads.head_logits(d, state.expand(len(branches), -1), branch), k)
            top, tokens = read_back(values, self.heads.token_map[ids])  # one wait, not one a tensor
            level = []
            for parent, lps, row_tokens in zip(parents, top, tokens, strict=True):
                base = nodes[parent].score if parent >= 0 else 0.0
                for lp, token in zip(lps, row_tokens, strict=True):
                    nodes.append(Node(token, parent, base + lp, d + 1, "hydra"))
                    level.append(len(nodes) - 1)
            likely = (i for i in level if nodes[i].score >= self._min_score)
            parents = heapq.nlargest(k, likely, key=lambda i: nodes[i].score)
            if not parents:
                break
            branches = [branch_of(root, nodes, i) for i in parents]
        return nodes

    @staticmethod
    def graphed_step(heads: HydraHeads, config: MedusaConfig) -> GraphedCall:
        """step(state, root, key=depth): the whole tree (`tree_step`), one graph a depth on a GPU."""
        return GraphedCall(functools.partial(tree_step, heads, config.topk, min_score(config.min_prob), config.budget))


def tree_step(heads: HydraHeads, k: int, min_score: float, budget: int, depth: int, state: torch.Tensor,
              root: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tree at fixed shapes (`device_levels.likeliest_made`'s tensors): state [H] whose logits gave the
    root, root [1]. Every level after the first runs `k` rows, each with its branch (the root, then the tokens
    down to the node it expands)."""
    top, ids = top_log_probs(heads.head_logits(0, state[None], root[None]), k)
    levels = [root_level(top[0], heads.token_map[ids[0]])]
    branches, parent_row = root.expand(k, 1), torch.zeros(k, dtype=torch.long, device=state.device)
    for d in range(1, depth):
        chosen = choose(levels[-1], k, min_score)
        branches = torch.cat([branches[parent_row[chosen[1]]], levels[-1].tokens[chosen[1]][:, None]], dim=1)
        top, ids = top_log_probs(heads.head_logits(d, state.expand(k, -1), branches), k)  # [k, k]
        levels.append(next_level(levels[-1], chosen, top, heads.token_map[ids], k + (d - 1) * k * k))
        parent_row = torch.arange(k, device=state.device).repeat_interleave(k)
    return likeliest_made(levels, budget)


def branch_of(root: int, nodes: list[Node], index: int) -> list[int]:
    """The root, then the tokens from the top of the tree down to node `index` (included)."""
    tokens = []
    while index >= 0:
        tokens.append(nodes[index].token)
        index = nodes[index].parent
    return [root, *reversed(tokens)]
