"""EAGLE: a trained head drafts a dynamic tree from the target's own features.

Why: retrieval only helps where the output copies its context; a head that
reads the target's hidden states (`specdec.proposers.eagle.head`) guesses the next
tokens of any text. EAGLE-2's dynamic tree (arXiv 2406.16858) spends the nodes
where the head is confident: each level expands the `topk` likeliest nodes by
cumulative draft probability, and the tree kept is the likeliest nodes overall.
How many nodes are kept comes from this machine's measured cost curve
(`budget.CostModel`): the size that maximises expected tokens per second of
verification, taking the head's cumulative probability as the chance a node is
accepted; so a tree is only as large as it pays.

The head's features come from the verification pass itself: the engine hands
each proposal the target's features at the tokens committed since the last one
(`ProposalContext.features`, captured at `feature_layers`), so the target never
runs an extra pass. The proposer keeps the head's attention entries for the
committed positions (position t holds the target's feature at t and token t + 1);
tree nodes get entries only while their step is drafted. Under the engine's floor a
plain step's pass may capture nothing (`features_optional`): those positions get no
entry, the head attends over the ones it has, and a step right after such a pass
proposes the root alone.

At temperature > 0 the top-k tree is verified as guesses by default, so the engine's
floor may keep a sampled row's steps plain where drafting loses (`deterministic_drafts`).
With `sampled=true` (without retrieval) the tree is drawn from the head's own
distribution instead and verified by rejection sampling (`specdec.proposers.eagle.sampled`,
where the losslessness argument is); such rows always draft, since their draws are the
row's random numbers and a seeded output must not depend on timing. Retrieved
branches stay guesses: mixing them into a drawn tree would need point-mass rows
and a count of drawn siblings fixed before the retrieved ones are merged, and
retrieval's merging (a retrieved token equal to a drawn sibling becomes one
node) would drop or keep drawn nodes by their own values.

Invariants: lossless whatever the head drafts (verification decides); the head's
entries are the committed positions it was given features for, in position order; top-k drafts are
deterministic guesses (`draft_probs` None), so at temperature > 0 the
acceptance rule treats them as such and the output keeps the target's
distribution; greedy decoding always drafts the top-k tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import torch

from specdec.backends.registry import GraphedCall
from specdec.drafters.shipped import find_shipped_head
from specdec.engine.accept import MULTI_DRAFT_RULES
from specdec.engine.costs import CostModel, load_or_measure
from specdec.engine.generation import ProposalContext
from specdec.engine.node_price import PricedCosts
from specdec.engine.read_back import read_back
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.eagle.device_tree import MAX_CATCH_UP, catch_up, catch_up_call, grow, tree_call
from specdec.proposers.eagle.head import ARCHITECTURE, Eagle3Head, load_head
from specdec.proposers.eagle.retrieval import Node, Retrieval
from specdec.proposers.eagle.sampled import HeadSteps, SampledPlan, draft_generator, draft_rows, grow_sampled
from specdec.proposers.plain_lookup import PlainLookup
from specdec.proposers.schema import method_config, option
from specdec.proposers.tree_budget import as_tree, likeliest, min_score, paying_count, top_log_probs
from specdec.tree import DraftTree


def find_head(loaded: LoadedModel) -> Path:
    """The shipped EAGLE-3 head trained for this model (matched by its token embedding), or HeadError."""
    return find_shipped_head(loaded, ARCHITECTURE)


@method_config("eagle")
class EagleConfig:
    """An EAGLE-3 head drafting a dynamic tree (EAGLE-2), sized by this machine's cost curve.

    head: the head's folder (EAGLE-3 layout); "" = the head shipped for the loaded model;
    depth: most draft steps (the tree's depth);
    topk: most nodes expanded per step, and children taken per expanded node;
    min_prob: a node is expanded only if the head gives it at least this cumulative probability
      (each expanded node costs a row of the head's next step; on a CPU that is not free);
    budget: most nodes in the tree, root included;
    adaptive: keep the node count that maximises expected tokens per second (else always `budget`);
    retrieval: add prompt lookup's and LogitSpec's retrieved continuations as branches of the tree;
    sampled: at temperature > 0 (without retrieval) draw the tree from the head's distribution and
      verify it by rejection sampling (`sampled`); else the top-k tree, verified as guesses;
    blocks: the head's products on 8-bit blocks where the backend's kernel runs (a CPU): cheaper drafts,
      never a different output;
    costs_dir: cache folder of measured cost curves ("" = ~/.cache/specdec/costs).
    """

    head: str = ""
    depth: Annotated[int, option(ge=1, le=32, request_max=10)] = 6
    topk: Annotated[int, option(ge=1, le=32, request_max=10)] = 8
    min_prob: Annotated[float, option(ge=0.0, le=1.0)] = 0.05  # server-side: 0 would let a request expand every node
    budget: Annotated[int, option(ge=2, le=256, request_max=64)] = 48
    adaptive: Annotated[bool, option(request=True)] = True
    retrieval: Annotated[bool, option(request=True)] = False
    # off by default: drawn trees are never gated by the engine's floor, and on held-out Spec-Bench questions
    # at temperature > 0 the gated top-k tree ran faster (docs/benchmarks.md)
    sampled: Annotated[bool, option(request=True)] = False
    # drawn siblings (sampled=true, temperature > 0): SpecInfer's one-by-one rule or SpecTr's k-sequential
    accept: Annotated[Literal[MULTI_DRAFT_RULES], option(request=True)] = "specinfer"
    blocks: bool = True
    costs_dir: str = ""

    def load(self, loaded: LoadedModel) -> Eagle3Head:
        folder = Path(self.head).expanduser() if self.head else find_head(loaded)
        key = ("eagle3-head", str(folder.resolve()), self.blocks)
        return loaded.state.shared(key, lambda: self._drafting(load_head(folder, loaded.model)))

    def _drafting(self, head: Eagle3Head) -> Eagle3Head:
        """The head as it drafts: on 8-bit blocks when `blocks` asks for it."""
        return head.on_blocks() if self.blocks else head

    def build(self, loaded: LoadedModel) -> EagleProposer:
        costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
        head = self.load(loaded)
        # kept beside the head: every proposer on it replays the same graphs, captured once
        key = ("eagle-tree", head, self.topk, self.min_prob, self.budget)
        tree = loaded.state.shared(key, lambda: tree_call(head, self.topk, min_score(self.min_prob), self.budget))
        fed = loaded.state.shared(("eagle-catch-up", head), lambda: catch_up_call(head))
        return EagleProposer(self, head, costs, loaded.eos_token_ids, tree, fed)


class EagleProposer(ProposerBase):
    source_stats: dict[str, dict[str, int]] | None  # with retrieval: offered / accepted nodes per source
    device_tree: bool | None = None  # the top-k tree grown on the device (`device_tree`): None where graphs run
    draft_source = "head"
    features_optional = True  # the floor's plain steps may capture nothing: the head skips those positions

    def __init__(
        self,
        config: EagleConfig,
        head: Eagle3Head,
        costs: CostModel | None = None,
        eos_token_ids: Sequence[int] = (),
        tree: GraphedCall | None = None,
        feed: GraphedCall | None = None,
    ) -> None:
        """tree, feed: the head's graphed top-k tree and catch-up (`device_tree`), shared by the proposers on
        it; None: its own."""
        self.config = config
        self.multi_draft = config.accept
        self.head = head
        self.feature_layers = head.layer_ids
        self._draft_ids = head.draft_ids  # [V_d] target ids, made once (not per step)
        self.costs = costs.table(config.budget) if costs is not None else []
        self.priced = PricedCosts(self.costs)  # greedy trees at the node price the engine's steps paid
        self.lookup = PlainLookup(self.costs, eos_token_ids)  # what the floor's plain steps verify
        self._min_score = min_score(config.min_prob)
        self.retrieval = Retrieval() if config.retrieval else None
        sources = ("eagle", "retrieval", "both")
        self.source_stats = {s: {"offered": 0, "accepted": 0} for s in sources} if config.retrieval else None
        self._kept: list[Node] = []  # the last tree's nodes below the root, in tree order
        self._drew = False  # the last tree was drawn from the head's distribution
        # the catch-up and the whole top-k tree at fixed shapes, one CUDA graph each, where graphs run
        self._tree_call = tree if tree is not None else tree_call(head, config.topk, self._min_score, config.budget)
        self._catch_up_call = feed if feed is not None else catch_up_call(head)
        self.begin([])

    @property
    def prunable(self) -> bool:
        """A batch may cut a top-k tree to its budget, never a drawn one: the batch's cut point looks at
        the whole tree's shape, which depends on the drawn tokens, so it could drop a node for its own
        value (see `sampled`)."""
        return not self._drew

    def begin(self, prompt_ids: list[int]) -> None:
        self.lookup.begin(prompt_ids)
        if self.retrieval is not None:
            self.retrieval.begin(prompt_ids)
        self.keys: torch.Tensor | None = None  # [1, kv, entries, d] the head's entries, committed positions
        self.values: torch.Tensor | None = None
        self.key_positions: list[int] = []  # the position of each entry
        self.last_position = -1  # the last entry's position, on the host (no device read a step)
        self.pending: list[tuple[int, torch.Tensor]] = []  # (first position, features) not fed to the head yet
        self.generator: torch.Generator | None = None  # sampled trees' draws, seeded per request

    @property
    def deterministic_drafts(self) -> bool:
        """Its trees carry no draft probabilities where it never draws them (`sampled=false`, or with retrieval):
        the floor may then gate its sampled rows too."""
        return not self.config.sampled or self.retrieval is not None

    @property
    def sized_by_costs(self) -> bool:
        """Adaptive: its trees hold only the nodes this machine's pass costs pay for."""
        return bool(self.costs)

    @torch.inference_mode()
    def propose(self, ctx: ProposalContext) -> DraftTree:
        root = ctx.token_ids[-1]
        self._drew = self.config.sampled and self.retrieval is None and not ctx.sampling.greedy
        committed = len(ctx.token_ids) - 1
        if ctx.features is not None:  # the last step's committed positions, up to the root's
            self.pending.append((committed - ctx.features.shape[0], ctx.features))
        depth = min(self.config.depth, ctx.max_depth)
        if depth <= 0:  # nothing to draft: the features wait, and the next drafting step feeds them in one call
            return self.lookup.propose(ctx)  # the floor's plain step: a looked-up chain at most (`plain_lookup`)
        start, last = self.pending[-1] if self.pending else (0, None)
        if last is None or start + last.shape[0] != committed:
            return DraftTree.chain(root)  # the last pass captured nothing (a plain step under the floor)
        logits, state = self._feed(ctx.token_ids)
        root_pos = len(ctx.token_ids) - 1
        if self._drew:
            return self._sampled(root, logits, HeadSteps(self.head, self.keys, self.values, state, root_pos), depth, ctx)
        if self._on_device(state):
            nodes = grow(self._tree_call, logits, state, self.keys, self.values, root_pos, depth)
        else:
            nodes = self._grow(logits, HeadSteps(self.head, self.keys, self.values, state, root_pos), depth)
        if self.retrieval is not None:
            self.retrieval.add_branches(nodes, ctx.token_ids, depth)
        return self._tree(root, nodes, ctx.node_price)

    def node_sources(self) -> list[str] | None:
        """A plain step's looked-up chain: "lookup". With retrieval: "head" for the head's nodes (those retrieval
        found too included), else "retrieval"."""
        looked_up = self.lookup.node_sources()
        if looked_up is not None or self.retrieval is None:
            return looked_up
        return ["", *("retrieval" if node.source == "retrieval" else "head" for node in self._kept)]

    def observe(self, result: VerifyResult) -> None:
        """Count and learn per source (with retrieval); the committed tokens' features reach `propose`
        through the context). A plain step's looked-up chain teaches the lookup alone."""
        if self.lookup.observe(result) or self.retrieval is None:
            return
        kept = self._kept[: result.tree.num_nodes - 1]  # a batch may have cut the tree
        accepted = set(result.path)
        for j, node in enumerate(kept, start=1):
            self.source_stats[node.source]["offered"] += 1
            self.source_stats[node.source]["accepted"] += j in accepted
        self.retrieval.observe(kept, result.tree.parents.tolist(), result.path)

    def _feed(self, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Give the head the committed positions it has features for and lacks (one step's, or every step's
        since it last drafted: a plain step under the floor leaves its features waiting, or captures none,
        and the head then has no entry there); its logits and state at the last one, the root's parent."""
        features = torch.cat([f for _, f in self.pending])
        # the positions on the host, as lists: spans of the pending features, each after the last
        order = [p for start, f in self.pending for p in range(start, start + f.shape[0])]
        if any(later <= earlier for earlier, later in zip([self.last_position, *order[:-1]], order, strict=True)):
            raise RuntimeError(f"eagle: features for positions {order} after {self.last_position}")
        self.last_position = order[-1]
        self.key_positions.extend(order)
        self.pending = []
        tokens = [token_ids[p + 1] for p in order]
        if self.keys is not None and len(order) <= MAX_CATCH_UP and self._on_device(features):
            logits, state, self.keys, self.values = catch_up(self._catch_up_call, self.keys, self.values, features,
                                                             tokens, order)
            return logits, state
        head = self.head
        hidden = head.fuse(features)[None]  # [1, m, H]
        positions = torch.tensor(order, device=hidden.device)[None]
        q, k, v = head.qkv(hidden, torch.tensor(tokens, device=hidden.device)[None], positions, queries=1)
        keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        values = v if self.values is None else torch.cat([self.values, v], dim=2)
        self.keys, self.values = keys, values
        # Only the last position's output is read: the others' entries (k, v) are all the head keeps of them. On a
        # prompt's catch-up, the attention, MLP and draft-vocabulary head over every position cost several plain
        # steps (docs/benchmarks.md, design choices). It sees every entry: their positions increase to its own.
        mask = torch.ones(1, keys.shape[2], dtype=torch.bool, device=hidden.device)
        logits, state = head.finish(hidden[:, -1:], q, keys, values, mask[None, None])
        return logits[0, -1], state[0, -1]

    def _on_device(self, tensor: torch.Tensor) -> bool:
        """Whether the catch-up and the top-k tree run at fixed shapes (`device_tree`): where graphs run."""
        return self.device_tree if self.device_tree is not None else self._tree_call.graphs_for(tensor)

    def _grow(self, logits: torch.Tensor, steps: HeadSteps, depth: int) -> list[Node]:
        """EAGLE-2's expansion: `depth` levels, each expanding the `topk` likeliest nodes of the last, chosen on
        the host (`device_tree.tree_step` is the same on the device)."""
        k = self.config.topk
        nodes: list[Node] = []
        level = self._children(*self._top(logits[None]), [-1], [0.0], 1, nodes)
        for level_depth in range(1, depth):
            likely = (i for i in level if nodes[i].score >= self._min_score)
            chosen = heapq.nlargest(k, likely, key=lambda i: nodes[i].score)
            if not chosen:
                break
            top, targets = self._top(steps.run(nodes, chosen, level_depth))
            scores = [nodes[i].score for i in chosen]
            level = self._children(top, targets, chosen, scores, level_depth + 1, nodes)
        return nodes

    def _top(self, logits: torch.Tensor) -> tuple[list[list[float]], list[list[int]]]:
        """Each row's `topk` likeliest children: (log-probabilities, target ids), best first."""
        top, ids = top_log_probs(logits, self.config.topk)
        return read_back(top, self._draft_ids[ids])  # one wait, not one a tensor

    def _sampled(
        self, root: int, logits: torch.Tensor, steps: HeadSteps, depth: int, ctx: ProposalContext
    ) -> DraftTree:
        """A tree drawn from the head's distribution, with its rows [N, V] (`sampled`)."""
        if self.generator is None:
            self.generator = draft_generator(ctx.sampling, logits.device)
        plan = SampledPlan(self.config.topk, self._min_score, self.config.budget, self.costs)
        nodes, levels = grow_sampled(steps, logits, plan, depth, ctx.sampling, self.generator, self._draft_ids)
        tokens = [root, *(n.token for n in nodes)]
        parents = [-1, *(n.parent + 1 for n in nodes)]  # level order: every parent before its children
        vocab_size = ctx.last_logits.shape[-1]
        rows = draft_rows(levels, len(tokens), self._draft_ids, vocab_size, ctx.last_logits.device)
        return DraftTree.of_lists(tokens, parents, rows)

    @staticmethod
    def _children(
        top: list[list[float]], targets: list[list[int]], parents: list[int], scores: list[float], depth: int,
        nodes: list[Node],
    ) -> list[int]:
        """Add each parent's children (its row of `top` and `targets`) to `nodes`; returns their indices."""
        out = []
        for row, parent in enumerate(parents):
            for lp, token in zip(top[row], targets[row], strict=True):
                nodes.append(Node(token, parent, scores[row] + lp, depth))
                out.append(len(nodes) - 1)
        return out

    def _tree(self, root: int, nodes: list[Node], price: float | None = None) -> DraftTree:
        """The likeliest nodes (each with its parent), as many as pay for their verification at `price`."""
        kept = likeliest(nodes, self.config.budget)
        kept = kept[: paying_count(kept, nodes, self.priced.at(price))]  # likeliest first, each after its parent
        self._kept = [nodes[i] for i in kept]
        return as_tree(root, nodes, kept)
