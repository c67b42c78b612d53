"""LogitSpec (Liu et al., arXiv 2507.01449): retrieval for the next *and* next-next token, as one tree.

Why: prompt lookup only drafts when the context's last n-gram occurred before,
which fails often. But the logits the root (this step's first token) was drawn
from also rank good guesses for the token *after* the root: the paper's
observation is that the next-next token is usually among their top-k. So each
step retrieves a continuation for the root and for each top-k candidate, and
verifies all the branches at once as one token tree (retrieval and the paper's
fixed tree: `retrieval`; the trie of candidate nodes and the
cost-aware choice: `plan`).

Two ways to size the tree:
- `adaptive=False`, the paper (faithful to the authors' code; every remaining
  difference is listed in `retrieval`): the root branch whole (up to
  20 tokens), then candidates in rank order with the paper's lengths, until
  `budget` nodes (64 in the paper, tuned for a GPU);
- `adaptive=True` (default, beyond the paper): each candidate node's chance of
  being accepted is estimated online from what verification actually emitted,
  per feature (source, matched m-gram size, depth, rank bucket, and for chains
  how many drafts the previous step accepted), and the planner keeps the nodes
  that maximise expected tokens per second under the forward-pass cost curve
  measured on this machine (`specdec.engine.costs.CostModel`).

Prompt lookup's chain as a floor is an option (`floor=true`, off by default):
whenever the root has a retrieval, the tree then holds exactly the chain `pld`
(default config) would verify this step, unless that chain does not pay on this
machine: (1 + its expected accepted tokens) / cost(chain) <= 1 / cost(root
alone), the expected tokens coming from the acceptance such chains have had so
far (`plan.chain_pays`; `pld` itself never asks, it always drafts). Everything
else joins only by expected gain; a declined floor still competes node by node.
Off, the root's own retrieval (the same kind of match) is planned node by node
like every branch: a chain kept whole drafted its unlikely tail too, and on
held-out Spec-Bench turns the default ran faster without it
(docs/benchmarks.md, "LogitSpec without a forced chain").

Under the engine's floor (`specdec.engine.floor`) a step kept plain still looks
up (`ProposalContext.lookup_depth`): the root's own retrieval (with `floor`,
prompt lookup's chain), where the context's end matched two tokens or more, is
verified as far as it pays on its learned rates; no candidate, recycled or
stored node is (their work is what the floor saves). Text that turns predictable is then drafted before the floor's
next try of drafting.

No prior is fitted on any data (Spec-Bench included): chained rates start at
Beta(1, 1), "which of n guesses is right" symmetric; all are learned online and
counterfactually (feature keys and priors: `learn`), and by default carried from
request to request on the same loaded model (`shared_rates`, kept in `loaded.state`
as the recycle table is): a request no longer sizes its first trees on the prior.

Options beyond the paper (adaptive only), each a source of nodes weighed by its
own learned rate: `third`: next-next-next guesses below first-level ones, from
the same last logit, only where the index has seen the pair (guess, third);
`recycle`: Token Recycling's successor table extends branches whose retrieval
ran out and supplies branches where the context has no match of two or more
tokens; `session`: earlier requests on the same loaded model (the request's own
text ranks first); `datastore=DIR`: an on-disk corpus, consulted where the
context has no such match (server-side only; sources: `sources`).
`recycle` is on by default: on Spec-Bench questions the benchmarks do not report it
raised tokens per step and tokens/s, greedy and sampled, though each step costs a little
more (docs/benchmarks.md, "Measurements behind design choices"). The
others are off (each costs work per step; whether it pays is for the benchmark to
show: `source_stats`, bench's per-source table).

`source_stats` counts, over the proposer's lifetime, the nodes each source
offered and how many of them were accepted (sources: see
`learn.SOURCES`); consumers take differences around a generation.

Invariants: drafts are deterministic (`draft_probs=None`), so verification is
lossless whatever the tree; the tree never exceeds `budget` nodes nor
`ctx.max_depth` levels below the root; siblings are distinct (a trie). Per-step
Python work is O(k + candidate nodes) plus one sort: no loops over the
vocabulary and no per-node tensor operations.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from specdec.datastore import Datastore
from specdec.engine.costs import AcceptanceStats, CostModel, load_or_measure
from specdec.engine.generation import ProposalContext
from specdec.engine.node_price import PricedCosts
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.logitspec.learn import (
    MAX_HEAT,
    SOURCES,
    Step,
    chain_probs,
    count_sources,
    learn_chain,
    learn_step,
    rank_bucket,
    uninformative_prior,
)
from specdec.proposers.logitspec.plan import ROOT, NodePool, best_prefix, chain_pays
from specdec.proposers.logitspec.retrieval import (
    Retrieval,
    Third,
    continue_match,
    paper_pool,
    paper_retrieve,
    retrieve,
    retrieve_thirds,
)
from specdec.proposers.logitspec.sources import (
    SessionFeed,
    Sources,
    add_recycled,
    prefill_row,
    store_branches,
)
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import PREFER_CHOICES, PLDConfig, PLDProposer, cut_after_eos, synced_index
from specdec.proposers.schema import Preparation, method_config, option
from specdec.tree import DraftTree

__all__ = ["LogitSpecConfig", "LogitSpecProposer"]

MIN_NODE_PROB = 0.005  # nodes less likely than this are never worth a slot in the tree
POOL_FACTOR = 4  # candidate nodes considered per step, as a multiple of the budget
STRONG_MATCH = 2  # own text matched at least this many tokens: other stores rank after it, recycle waits


@method_config("logitspec")
class LogitSpecConfig:
    """LogitSpec drafting; adaptive (cost-aware) tree size by default.

    k: next-next candidates taken from the top-k of the last logits (paper: 60);
    budget: most nodes in the tree, root included (paper: 64);
    max_ngram: longest suffix matched in the n-gram index (falls back to 1);
    max_continuation: longest retrieved continuation per branch (paper: 20);
    prefer: which earlier occurrence a match continues from, "latest" or "earliest";
    adaptive: size the tree by measured cost and online acceptance (else the paper's policy);
    min_gain: a tree must beat the root alone by this expected factor (adaptive, no floor);
    floor: keep prompt lookup's chain whole whenever it pays (adaptive only; off: the root's retrieval is planned
      node by node);
    third: next-next-next guesses where the index has seen the pair (adaptive only);
    recycle: Token Recycling's successor table as a source (adaptive only: the paper's tree ignores it);
    session: earlier requests on the same loaded model as a source (adaptive only);
    shared_rates: the acceptance rates learned over earlier requests on the same loaded model (its state scope)
      carry on, else each request starts from the prior (adaptive only; speed only: drafts never change outputs);
    datastore: a datastore folder consulted when the context has no match (adaptive; server-side);
    costs_dir: cache folder of measured cost curves ("" = ~/.cache/specdec/costs).
    """

    # request caps keep a request's work per step small; the store's size is server-side (the
    # `session` method's), and the datastore is a path the server names
    k: Annotated[int, option(ge=0, request_max=100)] = 60
    budget: Annotated[int, option(ge=1, request_max=64)] = 64
    max_ngram: Annotated[int, option(ge=1, request_max=5)] = 3
    max_continuation: Annotated[int, option(ge=1, request_max=20)] = 20
    prefer: Annotated[Literal[PREFER_CHOICES], option(request=True)] = "latest"
    adaptive: Annotated[bool, option(request=True)] = True
    min_gain: Annotated[float, option(ge=0.0, request_max=10.0)] = 0.1
    floor: Annotated[bool, option(request=True)] = False
    third: Annotated[bool, option(request=True)] = False
    recycle: Annotated[bool, option(request=True)] = True
    session: Annotated[bool, option(request=True)] = False
    shared_rates: Annotated[bool, option(request=True)] = True
    datastore: str = ""
    costs_dir: str = ""

    def __post_init__(self) -> None:
        extras = [name for name in ("third", "session", "datastore") if getattr(self, name)]
        if extras and not self.adaptive:
            raise ValueError(f"{', '.join(extras)} need adaptive=true (the paper's fixed tree has no other sources)")

    def open_datastore(self, loaded: LoadedModel) -> Datastore | None:
        """The datastore folder checked against the model's tokenizer (DatastoreError if unusable), or None."""
        return Datastore.open(self.datastore, loaded.tokenizer) if self.datastore else None

    def build(self, loaded: LoadedModel) -> LogitSpecProposer:
        costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
        return self.assemble(loaded, costs, self.open_datastore(loaded))

    def preparation(self) -> Preparation | None:
        """The tree-cost curve (adaptive trees) and the datastore, when named; the paper's tree needs neither."""
        if not (self.adaptive or self.datastore):
            return None

        def prepare(loaded: LoadedModel) -> tuple[CostModel | None, Datastore | None]:
            costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
            return costs, self.open_datastore(loaded)  # DatastoreError (at startup) for an unusable folder

        return Preparation(
            ("logitspec", self.costs_dir if self.adaptive else None, self.datastore),
            prepare,
            lambda loaded, parts: self.assemble(loaded, *parts),
            "logitspec with adaptive=true needs the tree-cost curve (and a datastore, if one is named), which "
            "this server did not prepare at startup; ask with adaptive=false (operator: specdec serve "
            "--method-config logitspec, or --method-config logitspec:datastore=DIR)",
        )

    def assemble(self, loaded: LoadedModel, costs: CostModel | None, datastore: Datastore | None) -> LogitSpecProposer:
        """A proposer from parts made beforehand (the server prepares costs and the datastore at startup)."""
        recycle = self.recycle and self.adaptive
        sources = Sources.for_loaded(loaded, recycle, self.session, datastore)
        stats = None
        if self.shared_rates and self.adaptive:  # per k: the prior of "which of k guesses" depends on it
            key = ("logitspec-rates", self.k, loaded.state_scope)
            stats = loaded.state.shared(key, lambda: AcceptanceStats(uninformative_prior(self.k)))
        return LogitSpecProposer(self, costs, loaded.eos_token_ids, sources, stats)


class LogitSpecProposer(ProposerBase):
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    prunable = True  # a batch may cut the tree to its budget
    source_stats: dict[str, dict[str, int]]  # per-source offered / accepted nodes, over its life

    def __init__(
        self,
        config: LogitSpecConfig,
        costs: CostModel | None = None,
        eos_token_ids: tuple[int, ...] = (),
        sources: Sources | None = None,
        stats: AcceptanceStats | None = None,
    ) -> None:
        """stats: acceptance rates to learn into (shared across requests: `LogitSpecConfig.assemble`), else new."""
        if config.adaptive and costs is None:
            raise ValueError("adaptive LogitSpec needs a cost model (LogitSpecConfig.build measures one)")
        self.config = config
        self.costs = costs.table(config.budget) if costs is not None else []
        self.priced = PricedCosts(self.costs)  # at the node price the engine's steps paid (`node_price`)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sources = sources or Sources()
        self.stats = stats if stats is not None else AcceptanceStats(uninformative_prior(config.k))
        self.index = NGramIndex(config.max_ngram, config.prefer)
        self.pld = PLDProposer(PLDConfig(), eos_token_ids)  # the floor: exactly pld's chain
        self.feed = SessionFeed(self.sources.session) if self.sources.session is not None else None
        self.source_stats: dict[str, dict[str, int]] = {s: {"offered": 0, "accepted": 0} for s in SOURCES}
        self.floor_held: bool | None = None  # last step: floor kept (True), declined (False), none (None)
        self.last_pool: NodePool | None = None  # last step's candidate nodes, planned or not (for analysis)
        self._last: Step | None = None
        self._heat = 0  # draft tokens accepted at the previous step, capped at MAX_HEAT
        self._first_step = True

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = NGramIndex(self.config.max_ngram, self.config.prefer)
        self.index.extend(prompt_ids)
        self.pld.begin(prompt_ids)
        if self.feed is not None:
            self.feed.begin(prompt_ids)
        self._last = None
        self._heat = 0
        self._first_step = True

    @property
    def top_wanted(self) -> int:
        """The last logits' top-k candidates, and every node's row of the recycle table where it feeds one."""
        recycle = self.sources.recycle
        return max(self.config.k, recycle.k if recycle is not None else 0)

    @property
    def tops_at_every_node(self) -> bool:
        """Where the recycle table is fed: its rows are every node's top ids."""
        return self.sources.recycle is not None

    @property
    def sized_by_costs(self) -> bool:
        """Adaptive: its trees hold only the nodes this machine's pass costs pay for."""
        return bool(self.costs)

    def propose(self, ctx: ProposalContext) -> DraftTree:
        config = self.config
        tokens = ctx.token_ids
        self.index = synced_index(self.index, tokens)
        if self.feed is not None:
            self.feed.sync(tokens)
        # The recycle table is shared across requests, sampled ones included: sampled tokens are drawn
        # by output position (specdec.engine.uniforms), so a seed's output does not depend on the drafts.
        if self.sources.recycle is not None and self._first_step:
            prefill_row(self.sources.recycle, tokens, ctx.last_logits)
        self._first_step = False
        self._last, self.floor_held, self.last_pool = None, None, None
        if ctx.max_depth <= 0 or config.budget == 1:
            return self._looked_up(ctx) if ctx.lookup_depth > 0 and config.adaptive else DraftTree.chain(tokens[-1])
        if not config.adaptive:
            retrieval = paper_retrieve(
                self.index, tokens, ctx.last_logits, config.k, config.max_continuation, ctx.last_top
            )
            tree, sources = paper_pool(tokens[-1], retrieval, config.budget, ctx.max_depth).whole()
            self._last = Step(None, [], 0, self._heat, sources=sources)
            return tree
        return self._adaptive(ctx)

    def _adaptive(self, ctx: ProposalContext) -> DraftTree:
        config = self.config
        costs = self.priced.at(ctx.node_price)
        floor_chain, floor_ngram = self.pld.draft(ctx) if config.floor else ([], 0)
        floor_chain = floor_chain[: config.budget - 1]
        retrieval = retrieve(
            self.index, ctx.token_ids, ctx.last_logits, config.k, config.max_continuation,
            config.max_continuation - 1, True, frozenset(floor_chain[:1]), ctx.last_top,
        )  # fmt: skip
        step = Step(retrieval, floor_chain, floor_ngram, self._heat)
        pool = NodePool(ctx.token_ids[-1], ctx.max_depth, POOL_FACTOR * config.budget)
        floor = self._add_floor(pool, step, costs)
        ran_out = [floor[-1]] if floor and len(floor_chain) < self.pld.config.num_pred_tokens else []
        if retrieval.root_branch:
            probs = self._chain(("root", retrieval.root_ngram, step.heat), len(retrieval.root_branch))
            pool.add(ROOT, retrieval.root_branch, probs, "root")
        ran_out += self._add_candidates(pool, retrieval)
        if config.third:
            step.thirds = self._thirds(step)
            self._add_thirds(pool, step.thirds)
        self._add_other_sources(pool, step, ctx, ran_out)
        chosen = pool.plan(costs, config.budget, floor, MIN_NODE_PROB, config.min_gain)
        tree, step.sources = pool.tree(chosen)
        self._last, self.last_pool = step, pool
        return tree

    def _looked_up(self, ctx: ProposalContext) -> DraftTree:
        """A step the floor keeps plain: the root's own retrieval (a drafting step's root branch: the longest
        match's latest continuation) where the context's end matched at least `STRONG_MATCH` tokens, cut to
        its best-paying prefix on the root branch's learned rates; with `floor`, prompt lookup's chain, whole
        where it pays. Else the root alone. The lookup is the step's only work beyond a plain step's."""
        config, root = self.config, ctx.token_ids[-1]
        if config.floor:
            chain, ngram = self.pld.draft(dataclasses.replace(ctx, max_depth=ctx.lookup_depth))
            source = "pld"
        else:
            chain, ngram = continue_match(self.index, (), min(config.max_continuation, ctx.lookup_depth))
            chain, source = cut_after_eos(chain, self.eos_token_ids), "root"
        chain = chain[: config.budget - 1]
        if ngram < STRONG_MATCH or not chain:
            return DraftTree.chain(root)
        key, costs = (source, ngram, self._heat), self.priced.at(ctx.node_price)
        probs = self._chain(key, len(chain), min_prob=0.0 if config.floor else MIN_NODE_PROB)
        if config.floor and not chain_pays(probs, costs):
            return DraftTree.chain(root)
        kept = chain if config.floor else chain[: best_prefix(probs, costs, config.budget, config.min_gain)[0]]
        if not kept:
            return DraftTree.chain(root)
        # the whole chain is learned from (what it would have matched), the kept part verified
        self._last = Step(None, [], 0, self._heat, chains=[(key, chain)], sources=["", *[source] * len(kept)])
        return DraftTree.chain(root, kept)

    def _add_floor(self, pool: NodePool, step: Step, costs: list[float]) -> list[int]:
        """Prompt lookup's chain: kept whole when it pays (its node ids returned), else a branch like others."""
        chain = step.floor_chain
        if not chain:
            return []
        probs = self._chain(("pld", step.floor_ngram, step.heat), len(chain), min_prob=0.0)
        if chain_pays(probs, costs):
            self.floor_held = True
            return pool.add(ROOT, chain, probs, "pld")
        self.floor_held = False
        pool.add(ROOT, chain, [p for p in probs if p >= MIN_NODE_PROB], "pld")
        return []

    def _add_candidates(self, pool: NodePool, retrieval: Retrieval) -> list[int]:
        """Next-next candidates with their continuations; the pool ids of the leaves whose retrieval ran out."""
        first_rates: dict[tuple[int, int], float] = {}  # per-step memo: (bucket, m) -> rate
        next_chains: dict[int, list[float]] = {}  # per-step memo: m -> cumulative continuation rates
        ran_out = []
        wanted = self.config.max_continuation - 1
        for token, rank, cont, m in zip(
            retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_conts, retrieval.cand_ngrams, strict=True
        ):
            bucket = rank_bucket(rank)
            p = first_rates.get((bucket, m))
            if p is None:
                p = first_rates[bucket, m] = self.stats.rate(("cand", bucket, m))
            if p < MIN_NODE_PROB:
                continue
            probs = [p]
            if cont:
                if m not in next_chains:
                    next_chains[m] = self._chain(("next", m), wanted)
                probs.extend(p * c for c in next_chains[m][: len(cont)] if p * c >= MIN_NODE_PROB)
            ids = pool.add(ROOT, [token, *cont], probs, "cand")
            if len(cont) < wanted and len(ids) == 1 + len(cont):
                ran_out.append(ids[-1])
        return ran_out

    def _thirds(self, step: Step) -> list[Third]:
        """Third-level guesses below the first-level ones: the floor's, the root branch's, then candidates'."""
        retrieval = step.retrieval
        assert retrieval is not None
        chains = [step.floor_chain, retrieval.root_branch]
        chains += [[token, *cont[:1]] for token, cont in zip(retrieval.cand_tokens, retrieval.cand_conts, strict=True)]
        firsts: dict[int, int] = {}  # first-level token -> the token its own retrieval puts below it (-1: none)
        for chain in chains:
            if chain and chain[0] not in firsts:
                firsts[chain[0]] = chain[1] if len(chain) > 1 else -1
        return retrieve_thirds(self.index, list(firsts.items()), retrieval.top, self.config.max_continuation - 2)

    def _add_thirds(self, pool: NodePool, thirds: list[Third]) -> None:
        rate = self.stats.rate
        cont_rates = self._chain(("next3",), self.config.max_continuation)
        for third in thirds:
            anchor = pool.child(ROOT, third.first)
            if anchor < 0:
                continue
            p = pool.probs[anchor] * rate(("third", rank_bucket(third.position)))
            probs = [q for q in (p, *(p * c for c in cont_rates[: len(third.cont)])) if q >= MIN_NODE_PROB]
            pool.add(anchor, [third.token, *third.cont], probs, "third")

    def _add_other_sources(self, pool: NodePool, step: Step, ctx: ProposalContext, ran_out: list[int]) -> None:
        """Session store and datastore branches (after the request's own text), then recycled successors."""
        retrieval = step.retrieval
        assert retrieval is not None
        own_match = max(step.floor_ngram, retrieval.root_ngram) >= STRONG_MATCH
        length = min(self.config.max_continuation, ctx.max_depth)
        found = store_branches(self.sources, ctx.token_ids, length, own_match, self.eos_token_ids)
        for source, m, branch in found:
            prefix = (source, m, step.heat)
            step.chains.append((prefix, branch))
            pool.add(ROOT, branch, self._chain(prefix, len(branch)), source)
        if self.sources.recycle is not None:
            anchors = ran_out if own_match else [ROOT, *ran_out]
            rows = add_recycled(
                pool, self.sources.recycle, anchors, self.stats.rate, self.config.budget, MIN_NODE_PROB,
                self.eos_token_ids,
            )  # fmt: skip
            step.recycle_rows = rows

    def own_match(self) -> int:
        """This step: tokens of the context's end matched earlier in it by the root's retrieval (0: none)."""
        step = self._last
        if step is None or step.retrieval is None:
            return 0
        floor = step.floor_ngram if step.floor_chain else 0
        return max(floor, step.retrieval.root_ngram if step.retrieval.root_branch else 0)

    def node_sources(self) -> list[str] | None:
        """This step's node sources (`SOURCES`, root ""), or None where it proposed the root alone."""
        return None if self._last is None else self._last.sources

    def tag_nodes(self, source: str, count: int) -> None:
        """A caller appended `count` nodes of its own `source` to this step's tree (counted in source_stats)."""
        if self._last is not None:
            self._last.sources.extend([source] * count)

    def _chain(self, prefix: tuple, length: int, min_prob: float = MIN_NODE_PROB) -> list[float]:
        return chain_probs(self.stats.rate, prefix, length, min_prob)

    def observe(self, result: VerifyResult) -> None:
        """Count offered / accepted nodes per source; learn rates from the emitted tokens; feed the recycle table
        (on steps that were asked to draft: a floor's plain step then costs what `plain`'s does)."""
        step, self._last = self._last, None
        heat, self._heat = self._heat, min(result.num_accepted, MAX_HEAT)
        if step is None:  # asked for no draft (the floor's plain step): no work beyond a plain step's
            return
        if step.retrieval is None and self.config.adaptive:  # a plain step's looked-up chain (`_looked_up`)
            count_sources(self.source_stats, step.sources, result.path)
            for prefix, chain in step.chains:
                learn_chain(self.stats, prefix, chain, result.tokens)
            return
        if self.sources.recycle is not None:
            self.sources.recycle.update(result.tree.token_list, result.target_logits, result.tops)
        count_sources(self.source_stats, step.sources, result.path)
        learn_step(self.stats, step, result.tree.token_list[0], result.tokens, heat)
