"""LogitSpec (Liu et al., arXiv 2507.01449): retrieval for the next *and* next-next token, as one tree.

Why: prompt lookup only drafts when the context's last n-gram occurred before,
which fails often. But the logits the root (this step's first token) was drawn
from also rank good guesses for the token *after* the root: the paper's
observation is that the next-next token is usually among their top-k. So each
step retrieves a continuation for the root and for each top-k candidate, and
verifies all the branches at once as one token tree (retrieval and the paper's
fixed tree: logitspec_retrieval.py; the trie of candidate nodes and the
cost-aware choice: logitspec_plan.py).

Two ways to size the tree:
- `adaptive=False`, the paper (faithful to the authors' code; every remaining
  difference is listed in logitspec_retrieval.py): the root branch whole (up to
  20 tokens), then candidates in rank order with the paper's lengths, until
  `budget` nodes (64 in the paper, tuned for a GPU);
- `adaptive=True` (default, beyond the paper): each candidate node's chance of
  being accepted is estimated online from what verification actually emitted,
  per feature (source, matched m-gram size, depth, rank bucket, and for chains
  how many drafts the previous step accepted), and the planner keeps the nodes
  that maximise expected tokens per second under the forward-pass cost curve
  measured on this machine (`budget.CostModel`).

Prompt lookup is the floor (`floor=true`): whenever the root has a retrieval,
the tree holds exactly the chain `pld` (default config) would verify this step,
unless that chain does not pay on this machine: (1 + its expected accepted
tokens) / cost(chain) <= 1 / cost(root alone), the expected tokens coming from
the acceptance such chains have had so far (`budget.chain_pays`; `pld` itself
never asks, it always drafts). Everything else joins only by expected gain. A
declined floor still competes node by node like any other branch.

No prior is fitted on any data (Spec-Bench included): chained rates (a retrieved
token right given the ones above it) start at Beta(1, 1); "which of the k
candidates, if any, is the next-next token" starts symmetric, mean 1/(k + 1)
per candidate (1/(THIRD_K + 1) for third-level guesses), with the weight of two
observations. All rates are learned online (`budget.AcceptanceStats`, windowed),
counterfactually: every retrieval the step computed is scored against the
emitted tokens, offered in the tree or not, so a branch cut today comes back
when the text starts repeating.

Options beyond the paper: `third` adds next-next-next guesses below first-level
ones, from the same last logit, only where the index has seen the pair (guess,
third) and only where the planner says they pay.

`source_stats` counts, over the proposer's lifetime, the nodes each source
offered and how many of them were accepted (sources: "pld", "root", "cand",
"third"); consumers take differences around a generation.

Invariants: drafts are deterministic (`draft_probs=None`), so verification is
lossless whatever the tree; the tree never exceeds `budget` nodes nor
`ctx.max_depth` levels below the root; siblings are distinct (a trie). Per-step
Python work is O(k + candidate nodes) plus one sort: no loops over the
vocabulary and no per-node tensor operations.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from specdec.engine import ProposalContext
from specdec.models import LoadedModel
from specdec.proposers.budget import AcceptanceStats, CostModel, chain_pays, load_or_measure
from specdec.proposers.logitspec_plan import ROOT, NodePool
from specdec.proposers.logitspec_retrieval import (
    SELF_RANK,
    THIRD_K,
    Retrieval,
    Third,
    paper_pool,
    paper_retrieve,
    paper_tree,
    retrieve,
    retrieve_thirds,
)
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import PREFER_CHOICES, PLDConfig, PLDProposer, synced_index
from specdec.tree import DraftTree
from specdec.verify import VerifyResult

__all__ = ["LogitSpecConfig", "LogitSpecProposer", "Retrieval", "paper_tree", "retrieve", "uninformative_prior"]

MIN_NODE_PROB = 0.005  # nodes less likely than this are never worth a slot in the tree
# Chain rates are kept apart by how many drafts the previous step accepted (0, 1, 2+):
# right after a long acceptance the text is usually still being copied.
MAX_HEAT = 2
POOL_FACTOR = 4  # candidate nodes considered per step, as a multiple of the budget
SOURCES = ("pld", "root", "cand", "third")


@dataclass(frozen=True)
class LogitSpecConfig:
    """LogitSpec drafting; adaptive (cost-aware) tree size by default.

    k: next-next candidates taken from the top-k of the last logits (paper: 60);
    budget: most nodes in the tree, root included (paper: 64);
    max_ngram: longest suffix matched in the n-gram index (falls back to 1);
    max_continuation: longest retrieved continuation per branch (paper: 20);
    prefer: which earlier occurrence a match continues from, "latest" or "earliest";
    adaptive: size the tree by measured cost and online acceptance (else the paper's policy);
    min_gain: a tree must beat the root alone by this expected factor (adaptive, no floor);
    floor: keep prompt lookup's chain whenever it pays (adaptive only);
    third: next-next-next guesses where the index has seen the pair (adaptive only);
    costs_dir: cache folder of measured cost curves ("" = ~/.cache/specdec/costs).
    """

    k: int = 60
    budget: int = 64
    max_ngram: int = 3
    max_continuation: int = 20
    prefer: str = "latest"
    adaptive: bool = True
    min_gain: float = 0.1
    floor: bool = True
    third: bool = False
    costs_dir: str = ""

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1 (the root), got {self.budget}")
        if self.max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {self.max_ngram}")
        if self.max_continuation < 1:
            raise ValueError(f"max_continuation must be >= 1, got {self.max_continuation}")
        if self.prefer not in PREFER_CHOICES:
            raise ValueError(f"prefer must be one of {PREFER_CHOICES}, got {self.prefer!r}")
        if self.min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain}")
        if self.third and not self.adaptive:
            raise ValueError("third needs adaptive=true (the paper's fixed tree has no third level)")

    def build(self, loaded: LoadedModel) -> LogitSpecProposer:
        costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
        return LogitSpecProposer(self, costs, loaded.eos_token_ids)


def uninformative_prior(k: int) -> Callable[[Hashable], tuple[float, float]]:
    """(mean, strength) of a rate before any observation; fitted on nothing.

    Chained rates: Beta(1, 1). "cand" keys: symmetric over the k candidates and
    "none of them", i.e. mean 1/(k + 1); "third" keys likewise over THIRD_K;
    both with the weight of two observations, so data takes over within steps.
    """
    cand_mean = 1.0 / (max(k, 1) + 1)
    third_mean = 1.0 / (THIRD_K + 1)

    def prior(key: Hashable) -> tuple[float, float]:
        kind = key[0]  # type: ignore[index]
        if kind == "cand":
            return cand_mean, 2.0
        if kind == "third":
            return third_mean, 2.0
        return 0.5, 2.0

    return prior


def rank_bucket(rank: int) -> int:
    """0 for the root token itself, then 1, 2, 3-4, 5-8, ... (1-based ranks, log2 buckets)."""
    return 0 if rank == SELF_RANK else (rank + 1).bit_length()


@dataclass
class Step:
    """What one adaptive step retrieved and offered: `observe` scores it against the emitted tokens."""

    retrieval: Retrieval | None
    floor_chain: list[int]
    floor_ngram: int
    heat: int
    thirds: list[Third] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per tree node, "" for the root


class LogitSpecProposer:
    def __init__(
        self, config: LogitSpecConfig, costs: CostModel | None = None, eos_token_ids: tuple[int, ...] = ()
    ) -> None:
        if config.adaptive and costs is None:
            raise ValueError("adaptive LogitSpec needs a cost model (LogitSpecConfig.build measures one)")
        self.config = config
        self.costs = costs.table(config.budget) if costs is not None else []
        self.stats = AcceptanceStats(uninformative_prior(config.k))
        self.index = NGramIndex(config.max_ngram, config.prefer)
        self.pld = PLDProposer(PLDConfig(), eos_token_ids)  # the floor: exactly pld's chain
        self.source_stats: dict[str, dict[str, int]] = {s: {"offered": 0, "accepted": 0} for s in SOURCES}
        self.floor_held: bool | None = None  # last step: floor kept (True), declined (False), none (None)
        self._last: Step | None = None
        self._heat = 0  # draft tokens accepted at the previous step, capped at MAX_HEAT

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = NGramIndex(self.config.max_ngram, self.config.prefer)
        self.index.extend(prompt_ids)
        self.pld.begin(prompt_ids)
        self._last = None
        self._heat = 0

    def propose(self, ctx: ProposalContext) -> DraftTree:
        config = self.config
        tokens = ctx.token_ids
        self.index = synced_index(self.index, tokens)
        root = tokens[-1]
        self._last, self.floor_held = None, None
        if ctx.max_depth <= 0 or config.budget == 1:
            return DraftTree.chain(root)
        if not config.adaptive:
            retrieval = paper_retrieve(self.index, tokens, ctx.last_logits, config.k, config.max_continuation)
            tree, sources = paper_pool(root, retrieval, config.budget, ctx.max_depth).whole()
            self._last = Step(None, [], 0, self._heat, sources=sources)
            return tree
        return self._adaptive(ctx)

    def _adaptive(self, ctx: ProposalContext) -> DraftTree:
        config = self.config
        floor_chain, floor_ngram = self.pld.draft(ctx) if config.floor else ([], 0)
        floor_chain = floor_chain[: config.budget - 1]
        skip = frozenset(floor_chain[:1])
        retrieval = retrieve(
            self.index, ctx.token_ids, ctx.last_logits, config.k, config.max_continuation,
            config.max_continuation - 1, True, skip,
        )  # fmt: skip
        step = Step(retrieval, floor_chain, floor_ngram, self._heat)
        pool = NodePool(ctx.token_ids[-1], ctx.max_depth, POOL_FACTOR * config.budget)
        floor = self._add_floor(pool, step)
        if retrieval.root_branch:
            probs = self._chain(("root", retrieval.root_ngram, step.heat), len(retrieval.root_branch))
            pool.add(ROOT, retrieval.root_branch, probs, "root")
        self._add_candidates(pool, retrieval)
        if config.third:
            step.thirds = self._thirds(step)
            self._add_thirds(pool, step.thirds)
        chosen = pool.plan(self.costs, config.budget, floor, MIN_NODE_PROB, config.min_gain)
        tree, step.sources = pool.tree(chosen)
        self._last = step
        return tree

    def _add_floor(self, pool: NodePool, step: Step) -> list[int]:
        """Prompt lookup's chain: kept whole when it pays (its node ids returned), else a branch like others."""
        chain = step.floor_chain
        if not chain:
            return []
        probs = self._chain(("pld", step.floor_ngram, step.heat), len(chain), min_prob=0.0)
        if chain_pays(probs, self.costs):
            self.floor_held = True
            return pool.add(ROOT, chain, probs, "pld")
        self.floor_held = False
        pool.add(ROOT, chain, [p for p in probs if p >= MIN_NODE_PROB], "pld")
        return []

    def _add_candidates(self, pool: NodePool, retrieval: Retrieval) -> None:
        first_rates: dict[tuple[int, int], float] = {}  # per-step memo: (bucket, m) -> rate
        next_chains: dict[int, list[float]] = {}  # per-step memo: m -> cumulative continuation rates
        rate = self.stats.rate
        for token, rank, cont, m in zip(
            retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_conts, retrieval.cand_ngrams, strict=True
        ):
            bucket = rank_bucket(rank)
            p = first_rates.get((bucket, m))
            if p is None:
                p = first_rates[bucket, m] = rate(("cand", bucket, m))
            if p < MIN_NODE_PROB:
                continue
            probs = [p]
            if cont:
                if m not in next_chains:
                    next_chains[m] = self._chain(("next", m), self.config.max_continuation - 1)
                probs.extend(p * c for c in next_chains[m][: len(cont)] if p * c >= MIN_NODE_PROB)
            pool.add(ROOT, [token, *cont], probs, "cand")

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

    def _chain(self, prefix: tuple, length: int, min_prob: float = MIN_NODE_PROB) -> list[float]:
        """Cumulative products rate((*prefix, 1)) * rate((*prefix, 2)) ..., stopping below `min_prob`."""
        probs, p, rate = [], 1.0, self.stats.rate
        for depth in range(1, length + 1):
            p *= rate((*prefix, depth))
            if p < min_prob:
                break
            probs.append(p)
        return probs

    # ------------------------------------------------------------------ learning
    def observe(self, result: VerifyResult) -> None:
        """Count offered / accepted nodes per source; learn rates from the emitted tokens."""
        step, self._last = self._last, None
        heat, self._heat = self._heat, min(result.num_accepted, MAX_HEAT)
        if step is None:
            return
        for source in step.sources:
            if source:
                self.source_stats[source]["offered"] += 1
        for node in result.path[1:]:
            self.source_stats[step.sources[node]]["accepted"] += 1
        if step.retrieval is None:
            return
        actual = result.tokens  # actual[0] follows the root, actual[1] follows that, ...
        self._learn_chain(("pld", step.floor_ngram, heat), step.floor_chain, actual)
        self._learn_chain(("root", step.retrieval.root_ngram, heat), step.retrieval.root_branch, actual)
        self._learn_candidates(step.retrieval, actual)
        self._learn_thirds(step.thirds, actual)

    def _learn_chain(self, prefix: tuple, chain: list[int], actual: list[int]) -> None:
        for depth, token in enumerate(chain[: len(actual)], start=1):
            hit = token == actual[depth - 1]
            self.stats.update((*prefix, depth), 1.0, float(hit))
            if not hit:
                break

    def _learn_candidates(self, retrieval: Retrieval, actual: list[int]) -> None:
        offered: dict[tuple[str, int, int], int] = {}
        hit_at = -1
        for j, (rank, m) in enumerate(zip(retrieval.cand_ranks, retrieval.cand_ngrams, strict=True)):
            key = ("cand", rank_bucket(rank), m)
            offered[key] = offered.get(key, 0) + 1
            if retrieval.cand_tokens[j] == actual[0]:
                hit_at = j
        for key, count in offered.items():
            self.stats.update(key, float(count), 0.0)
        if hit_at < 0:
            return
        m = retrieval.cand_ngrams[hit_at]
        self.stats.update(("cand", rank_bucket(retrieval.cand_ranks[hit_at]), m), 0.0, 1.0)
        self._learn_chain(("next", m), retrieval.cand_conts[hit_at], actual[1:])

    def _learn_thirds(self, thirds: list[Third], actual: list[int]) -> None:
        if len(actual) < 2:
            return
        for third in thirds:
            if third.first != actual[0]:
                continue
            hit = third.token == actual[1]
            self.stats.update(("third", rank_bucket(third.position)), 1.0, float(hit))
            if hit:
                self._learn_chain(("next3",), third.cont, actual[2:])
