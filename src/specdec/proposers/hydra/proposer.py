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

import heapq
from pathlib import Path

import torch

from specdec.backends.registry import GraphedCall
from specdec.drafters.shipped import find_shipped_head
from specdec.engine.costs import load_or_measure
from specdec.engine.read_back import read_back
from specdec.models import LoadedModel
from specdec.proposers.eagle.retrieval import Node
from specdec.proposers.hydra.head import ARCHITECTURE, HydraHeads
from specdec.proposers.medusa import load_medusa
from specdec.proposers.medusa.proposer import MedusaConfig, MedusaProposer
from specdec.proposers.schema import method_config
from specdec.proposers.tree_budget import top_log_probs


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
        step = loaded.state.shared(("hydra-step", heads, self.topk), lambda: HydraProposer.graphed_step(heads, self.topk))
        return HydraProposer(self, heads, costs, loaded.eos_token_ids, step)


class HydraProposer(MedusaProposer):
    name = "hydra"
    heads: HydraHeads
    pad_levels: bool | None = None  # every level's rows padded to topk: None where its step replays as graphs

    def _nodes(self, root: int, state: torch.Tensor, depth: int) -> list[Node]:
        """Level d: head d's top-k below each of the `topk` likeliest nodes of level d - 1, for its branch."""
        k = self.config.topk
        pad = self.pad_levels if self.pad_levels is not None else self.step.graphs_for(state)
        nodes: list[Node] = []
        parents, branches = [-1], [[root]]
        for d in range(depth):
            # a graph a level: every level's rows padded to k (copies of the last branch, their guesses unread)
            rows = branches + branches[-1:] * (k - len(branches)) if pad else branches
            branch = torch.tensor(rows, device=state.device)  # [c, d + 1]
            top, tokens = self.step(state.expand(len(rows), -1), branch, key=d)
            level = []
            real = len(parents)
            top, tokens = read_back(top, tokens)  # one wait, not one a tensor
            for parent, lps, row_tokens in zip(parents, top[:real], tokens[:real], strict=True):
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
    def graphed_step(heads: HydraHeads, topk: int) -> GraphedCall:
        """step(state, branch, key=d): head d's top-k for each row's branch, (log-probabilities [c, k], target
        token ids [c, k]), one graph a level (and row count) on a GPU."""

        def top(d: int, state: torch.Tensor, branch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values, ids = top_log_probs(heads.head_logits(d, state, branch), topk)
            return values, heads.token_map[ids]

        return GraphedCall(top)


def branch_of(root: int, nodes: list[Node], index: int) -> list[int]:
    """The root, then the tokens from the top of the tree down to node `index` (included)."""
    tokens = []
    while index >= 0:
        tokens.append(nodes[index].token)
        index = nodes[index].parent
    return [root, *reversed(tokens)]
