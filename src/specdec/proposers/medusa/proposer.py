"""Medusa: heads on the target's last hidden state guess the next few tokens at once.

Why: the cheapest drafter that reads the target's own state (Medusa-1, arXiv
2401.10774): per step one small product per head on one row, no draft loop.
Head i, reading the state the target's head turned into this step's root,
guesses the token i + 1 places after the root. The heads' guesses are
independent, so the tree is the Cartesian product of their top-k, grown level
by level from the likeliest nodes (cumulative probability, the heads taken as
independent) and cut to the size that pays on this machine's cost curve
(`tree_budget`), like EAGLE's.

The state comes from the verification pass itself (`ProposalContext.features`,
captured at the target's last hidden state): no extra pass of the target. Where
the engine's floor runs plain steps, their passes capture nothing unless a try
comes next (`features_optional`); a step that finds no state drafts nothing, never
from an older one.

On a GPU the heads' step replays as a CUDA graph, one per depth (`GraphedCall`): eager,
its few small kernels cost their launches, not their work. The graphed step is kept with the
heads in the loaded model's state (`MedusaConfig.build`), so every proposer built on them (one a
request through the API, one a pooled proposer in the server) replays the same graphs:
they are captured once a process, not once a request. Its calls come from one thread at
a time (the engine's decode loop), as the heads' other work does.

Invariants: lossless whatever the heads guess (verification decides); drafts
are deterministic guesses (`draft_probs` None), so at temperature > 0 the
acceptance rule treats them as such and the output keeps the target's
distribution (Medusa's typical acceptance, which is not lossless, is not used).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import torch

from specdec.backends.registry import GraphedCall
from specdec.drafters.shipped import find_shipped_head
from specdec.engine.costs import CostModel, load_or_measure
from specdec.engine.generation import ProposalContext
from specdec.engine.node_price import PricedCosts
from specdec.engine.read_back import read_back
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.eagle.retrieval import Node
from specdec.proposers.medusa.head import ARCHITECTURE, MedusaHeads, load_medusa
from specdec.proposers.plain_lookup import PlainLookup
from specdec.proposers.schema import method_config, option
from specdec.proposers.tree_budget import as_tree, likeliest, min_score, paying_count, top_log_probs
from specdec.tree import DraftTree


@method_config("medusa")
class MedusaConfig:
    """Medusa-1 heads drafting the Cartesian top-k tree of their guesses, sized by this machine's cost curve.

    head: the heads' folder (vLLM's Medusa layout); "" = the heads shipped for the loaded model;
    topk: children per expanded node (each head's top-k), and nodes expanded per level;
    min_prob: a node is expanded only if its cumulative probability is at least this;
    budget: most nodes in the tree, root included;
    adaptive: keep the node count that maximises expected tokens per second (else always `budget`);
    blocks: the heads' products on 8-bit blocks where the backend's kernel runs (a CPU): cheaper drafts,
    a little different, the same output; false: in the heads' own dtype;
    costs_dir: cache folder of measured cost curves ("" = ~/.cache/specdec/costs).
    """

    head: str = ""
    topk: Annotated[int, option(ge=1, le=32, request_max=10)] = 4
    min_prob: Annotated[float, option(ge=0.0, le=1.0)] = 0.02  # server-side: 0 would expand every node
    budget: Annotated[int, option(ge=2, le=256, request_max=64)] = 32
    adaptive: Annotated[bool, option(request=True)] = True
    blocks: bool = True
    costs_dir: str = ""

    def load(self, loaded: LoadedModel) -> MedusaHeads:
        folder = Path(self.head).expanduser() if self.head else find_shipped_head(loaded, ARCHITECTURE)
        key = ("medusa-heads", str(folder.resolve()), self.blocks)
        return loaded.state.shared(key, lambda: self.drafting(load_medusa(folder, loaded.model)))

    def drafting(self, heads: MedusaHeads) -> MedusaHeads:
        """The heads as they draft: on 8-bit blocks when `blocks` asks for it."""
        return heads.on_blocks() if self.blocks else heads

    def build(self, loaded: LoadedModel) -> MedusaProposer:
        costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
        heads = self.load(loaded)
        # kept beside the heads: every proposer on them replays the same graphs, captured once
        step = loaded.state.shared(("medusa-step", heads, self.topk), lambda: MedusaProposer.graphed_step(heads, self))
        return MedusaProposer(self, heads, costs, loaded.eos_token_ids, step)


class MedusaProposer(ProposerBase):
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    draft_source = "head"
    prunable = True  # a batch may cut the tree to its budget (the kept order is likeliest first)
    name = "medusa"
    features_optional = True  # the floor's plain steps may capture nothing: the step after one drafts nothing

    def __init__(
        self,
        config: MedusaConfig,
        heads: MedusaHeads,
        costs: CostModel | None = None,
        eos_token_ids: Sequence[int] = (),
        step: GraphedCall | None = None,
    ) -> None:
        """step: the heads' graphed step (`graphed_step`), shared by the proposers on them; None: its own."""
        self.config = config
        self.heads = heads
        self.feature_layers = (heads.layer_id,)
        self.costs = costs.table(config.budget) if costs is not None else []
        self.priced = PricedCosts(self.costs)  # at the node price the engine's steps paid (`node_price`)
        self.lookup = PlainLookup(self.costs, eos_token_ids)  # what the floor's plain steps verify
        self._min_score = min_score(config.min_prob)
        # the heads' step (Hydra's: its whole tree) as one CUDA graph a depth on a GPU: eager, it is launch-bound
        self.step = step if step is not None else self.graphed_step(heads, config)

    @property
    def sized_by_costs(self) -> bool:
        """Adaptive: its trees hold only the nodes this machine's pass costs pay for."""
        return bool(self.costs)

    def begin(self, prompt_ids: list[int]) -> None:
        self.lookup.begin(prompt_ids)

    def node_sources(self) -> list[str] | None:
        """"lookup" for a plain step's looked-up chain; else None (`draft_source` for every node)."""
        return self.lookup.node_sources()

    @torch.inference_mode()
    def propose(self, ctx: ProposalContext) -> DraftTree:
        if ctx.max_depth <= 0:  # the floor's plain step: a looked-up chain at most (`plain_lookup`)
            return self.lookup.propose(ctx)
        root = ctx.token_ids[-1]
        depth = min(self.heads.num_heads, ctx.max_depth)
        # no state where the pass before captured nothing (`features_optional`): then nothing is drafted
        if depth <= 0 or ctx.features is None or not ctx.features.shape[0]:
            return DraftTree.chain(root)
        nodes = self._nodes(root, ctx.features[-1], depth)  # the state whose logits gave the root
        kept = likeliest(nodes, self.config.budget)
        return as_tree(root, nodes, kept[: paying_count(kept, nodes, self.priced.at(ctx.node_price))])

    def _nodes(self, root: int, state: torch.Tensor, depth: int) -> list[Node]:
        """The candidate nodes below `root`, each scored by its cumulative log probability."""
        top, tokens = self.step(state, key=depth)
        return self._grow(*read_back(top, tokens))  # one wait, not one a tensor

    @staticmethod
    def graphed_step(heads: MedusaHeads, config: MedusaConfig) -> GraphedCall:
        """step(state, key=depth): the first `depth` heads' top-k, (log-probabilities [depth, k], target
        token ids [depth, k]), one graph a depth on a GPU."""

        def top(depth: int, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values, ids = top_log_probs(heads.draft_logits(state)[:depth], config.topk)
            return values, heads.token_map[ids]

        return GraphedCall(top)

    def _grow(self, top: list[list[float]], tokens: list[list[int]]) -> list[Node]:
        """Level d holds head d's top-k below each of the `topk` likeliest nodes of level d - 1."""
        nodes = [Node(t, -1, lp, 1, "medusa") for lp, t in zip(top[0], tokens[0], strict=True)]
        level = list(range(len(nodes)))
        for d in range(1, len(top)):
            likely = (i for i in level if nodes[i].score >= self._min_score)
            parents = heapq.nlargest(self.config.topk, likely, key=lambda i: nodes[i].score)
            level = []
            for p in parents:
                for lp, t in zip(top[d], tokens[d], strict=True):
                    nodes.append(Node(t, p, nodes[p].score + lp, d + 1, "medusa"))
                    level.append(len(nodes) - 1)
        return nodes

    def observe(self, result: VerifyResult) -> None:
        """The lookup's rates learn from its chains; the heads learn nothing (the next state reaches `propose`
        through the context)."""
        self.lookup.observe(result)
