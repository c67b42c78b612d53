"""A plain step's lookup: what a head-based proposer still verifies on a step the floor keeps plain.

Why: on a fast pass a head's drafts can cost more than they return, and the engine's floor then
keeps the row's steps plain (`specdec.engine.floor`). Such a step need not be blind: where the
context's end matched earlier text, the continuation of that match is a free guess, and on copied
text (summaries, retrieval, code edits) a good one. LogitSpec verifies its own retrieval there;
Medusa, Hydra, EAGLE, lookahead and Token Recycling verify this one: the continuation of the latest earlier match of the
context's longest suffix (at least `STRONG_MATCH` tokens), cut to its best-paying prefix on the
acceptance rates such chains earned in this proposer's earlier steps and on the proposer's own
cost table at the node price the engine's steps paid (`ProposalContext.node_price`).

Invariants: a lookup runs only where the engine asked for one (`ProposalContext.lookup_depth`, a
step with `max_depth` 0); its chain carries no draft probabilities (deterministic guesses, so a
sampled row's output is plain sampling's: `engine.uniforms`) and is verified like any tree; the
whole chain is learned from, counterfactually, whatever part of it was verified; the index sees
each token once (`synced_index`).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.engine.costs import AcceptanceStats, load_or_measure
from specdec.engine.generation import ProposalContext
from specdec.engine.node_price import PricedCosts
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.logitspec.learn import MAX_HEAT, PRIOR_WEIGHT, chain_probs, learn_chain
from specdec.proposers.logitspec.plan import best_prefix
from specdec.proposers.logitspec.retrieval import continue_match
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import cut_after_eos, synced_index
from specdec.tree import DraftTree

MAX_NGRAM = 3  # longest suffix matched
STRONG_MATCH = 2  # a shorter match (one token) predicts too little to be worth a plain step's rows
MAX_CHAIN = 20  # longest chain looked at
MIN_NODE_PROB = 0.005  # a node less likely than this is never worth a row
MIN_GAIN = 0.1  # the chain must beat the root alone by this expected factor


class PlainLookup:
    """The looked-up chain of a gated plain step, and the rates that size it (one per proposer)."""

    def __init__(self, costs: Sequence[float], eos_token_ids: Sequence[int] = ()) -> None:
        self.priced = PricedCosts(costs)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.index = NGramIndex(MAX_NGRAM, "latest")
        # chained rates ("lookup", m, heat, depth): Beta(1, 1) with the weight of two observations, fitted on nothing
        self.stats = AcceptanceStats(lambda key: (0.5, PRIOR_WEIGHT))
        self._heat = 0  # drafts the previous step accepted, capped: right after a long acceptance text is copied
        self._pending: tuple[tuple, list[int]] | None = None
        self._verified = 0  # nodes below the root of the tree last proposed (0: not the lookup's)
        self.offered = 0  # looked-up tokens verified ...
        self.accepted = 0  # ... and accepted, over the proposer's life

    @classmethod
    def for_loaded(cls, loaded: LoadedModel) -> PlainLookup:
        """A lookup priced on the loaded model's measured pass costs (a proposer without a cost table of its own)."""
        return cls(load_or_measure(loaded).table(MAX_CHAIN + 1), loaded.eos_token_ids)

    def begin(self, prompt_ids: list[int]) -> None:
        """A new prompt: index it afresh (the rates carry over)."""
        self.index = NGramIndex(MAX_NGRAM, "latest")
        self.index.extend(prompt_ids)
        self._heat, self._pending = 0, None

    def propose(self, ctx: ProposalContext) -> DraftTree:
        """The root and the best-paying prefix of the looked-up chain (the root alone where none pays)."""
        root = ctx.token_ids[-1]
        self._pending, self._verified = None, 0
        if ctx.lookup_depth <= 0 or len(self.priced.table) < 2:
            return DraftTree.chain(root)
        self.index = synced_index(self.index, ctx.token_ids)
        chain, ngram = continue_match(self.index, (), min(MAX_CHAIN, ctx.lookup_depth))
        chain = cut_after_eos(chain, self.eos_token_ids)
        if ngram < STRONG_MATCH or not chain:
            return DraftTree.chain(root)
        key = ("lookup", ngram, self._heat)
        costs = self.priced.at(ctx.node_price)
        probs = chain_probs(self.stats.rate, key, len(chain), MIN_NODE_PROB)
        kept, _ = best_prefix(probs, costs, len(costs) - 1, MIN_GAIN)
        self._pending, self._verified = (key, chain), kept  # learned from whole, verified as far as it pays
        return DraftTree.chain(root, chain[:kept])

    def node_sources(self) -> list[str] | None:
        """The tree last proposed's sources where it was a looked-up chain ("lookup" below the root), else None."""
        return ["", *["lookup"] * self._verified] if self._pending is not None else None

    def observe(self, result: VerifyResult) -> bool:
        """Learn from a step; True when its tree was this lookup's."""
        pending, self._pending = self._pending, None
        self._heat = min(result.num_accepted, MAX_HEAT)
        if pending is None:
            return False
        learn_chain(self.stats, pending[0], pending[1], result.tokens)
        self.offered += result.tree.num_nodes - 1
        self.accepted += result.num_accepted
        return True
