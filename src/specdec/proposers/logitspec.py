"""LogitSpec (Liu et al., arXiv 2507.01449, Algorithm 1): retrieval for the next *and* next-next token.

Why: prompt lookup only drafts when the context's last n-gram occurred before,
which fails often. But the logits the root (this step's first token) was drawn
from also rank good guesses for the token *after* the root: the paper's
observation is that the next-next token is usually among their top-k. So each
step retrieves a continuation for the root (context + root) and for each top-k
candidate c (context + root + c), and verifies all the branches at once as one
token tree.

Per step (Algorithm 1):
1. root branch: the continuation of the longest matching m-gram (m = max_ngram .. 1)
   of context + root, up to `max_continuation` tokens;
2. candidates: top-k tokens of `ctx.last_logits` (one `torch.topk`, one `.tolist()`),
   minus the root branch's first token (already covered); each becomes the branch
   [c] + the continuation of context + root + c;
3. the branches are merged below the root into one trie (`DraftTree.from_branches`).

Two ways to size the tree:
- `adaptive=False`, the paper: the root branch whole, then candidates in rank
  order with the paper's lengths (4 tokens for the top 8, 3 up to rank 32, then
  the bare candidate), until `budget` nodes (64 in the paper, tuned for a GPU);
- `adaptive=True` (default, goes beyond the paper): every node's chance of being
  accepted is estimated online from what verification actually emitted (per
  feature: root branch vs candidate, rank bucket, matched m-gram size, depth,
  and for the root branch how many drafts the previous step accepted),
  and `budget.plan_tree` keeps the nodes that maximise expected tokens per second
  under the forward-pass cost curve measured on this machine (`budget.CostModel`).
  Where nothing repeats the tree shrinks to the root alone, i.e. plain decoding.
  The rates are learned counterfactually, from the emitted tokens, for every
  candidate and retrieval the step computed, offered in the tree or not, so a
  branch cut today can come back when the text starts repeating. Measured on
  SmolLM2 over Spec-Bench, a *bare* next-next candidate (no retrieval behind it)
  is right ~2.5% of the time at rank 1 and less below, while on a 2-core AVX2 CPU
  a node costs ~5% of a step: not worth a node there (the paper's GPU tree keeps
  them, and so does this planner where nodes are nearly free). A candidate whose
  2-gram (root, candidate) occurred before is right ~30% of the time: kept.

Invariants: drafts are deterministic (`draft_probs=None`), so verification is
lossless whatever the tree; the tree never exceeds `budget` nodes nor
`ctx.max_depth` levels below the root; siblings are distinct (a trie); the root
branch's retrieval, when there is one, is the tree's first branch and survives
any budget >= its length + 1 in paper mode. Per-step Python work is O(k +
tree size) plus one sort of the candidate nodes: no loops over the vocabulary
and no per-node tensor operations.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from specdec.engine import ProposalContext
from specdec.models import LoadedModel
from specdec.proposers.budget import AcceptanceStats, CostModel, load_or_measure, plan_tree
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import PREFER_CHOICES, synced_index
from specdec.tree import DraftTree
from specdec.verify import VerifyResult

SELF_RANK = -1  # the root token itself among the top-k (a repeated token, e.g. a digit)
MIN_NODE_PROB = 0.005  # nodes less likely than this are never worth a slot in the tree
# Root-branch rates are kept apart by how many drafts the previous step accepted (0, 1, 2+):
# right after a long acceptance the text is usually still being copied, so the next
# retrieval is far more likely right than after a miss.
MAX_HEAT = 2


@dataclass(frozen=True)
class LogitSpecConfig:
    """LogitSpec drafting; adaptive (cost-aware) tree size by default.

    k: next-next candidates taken from the top-k of the last logits (paper: 60);
    budget: most nodes in the tree, root included (paper: 64);
    max_ngram: longest suffix matched in the n-gram index (falls back to 1);
    max_continuation: longest retrieved continuation per branch;
    prefer: which earlier occurrence a match continues from, "latest" or "earliest";
    adaptive: size the tree by measured cost and online acceptance (else the paper's policy);
    min_gain: a tree must beat the root alone by this expected factor (adaptive only);
    costs_dir: cache folder of measured cost curves ("" = ~/.cache/specdec/costs).
    """

    k: int = 60
    budget: int = 64
    max_ngram: int = 3
    max_continuation: int = 10
    prefer: str = "latest"
    adaptive: bool = True
    min_gain: float = 0.1
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

    def build(self, loaded: LoadedModel) -> LogitSpecProposer:
        costs = load_or_measure(loaded, self.costs_dir or None) if self.adaptive else None
        return LogitSpecProposer(self, costs)


@dataclass(frozen=True)
class Retrieval:
    """One step's retrieval: the root branch and every next-next candidate with its continuation."""

    root_branch: list[int]  # tokens after the root
    root_ngram: int  # matched m (0: no match)
    cand_tokens: list[int]
    cand_ranks: list[int]  # rank among the top-k, the root token excluded (SELF_RANK for the root itself)
    cand_conts: list[list[int]]  # retrieved tokens after root + candidate
    cand_ngrams: list[int]  # matched m for context + root + candidate (0: none)


def retrieve(
    index: NGramIndex,
    token_ids: list[int],
    last_logits: torch.Tensor,
    k: int,
    max_continuation: int,
    cand_continuation: int,
    keep_self: bool,
) -> Retrieval:
    """Algorithm 1, steps 1-2. `token_ids` ends with the root and must be fully indexed."""
    root = token_ids[-1]
    root_branch, root_ngram = index.lookup_with_ngram(token_ids, max_continuation)
    covered = root_branch[0] if root_branch else None
    num = min(k, last_logits.shape[-1])
    top = torch.topk(last_logits, num).indices.tolist() if num else []
    tail = token_ids[len(token_ids) - index.max_ngram + 1 :] if index.max_ngram > 1 else []
    lookup = index.lookup_with_ngram
    tokens, ranks, conts, ngrams = [], [], [], []
    rank = 0
    for token in top:
        if token == root:
            if not keep_self:
                continue
            token_rank = SELF_RANK
        else:
            token_rank, rank = rank, rank + 1
        if token == covered:
            continue
        cont, m = lookup([*tail, token], cand_continuation)
        tokens.append(token)
        ranks.append(token_rank)
        conts.append(cont)
        ngrams.append(m)
    return Retrieval(root_branch, root_ngram, tokens, ranks, conts, ngrams)


def paper_branch_length(rank: int) -> int:
    """The authors' policy: longer branches for higher-ranked candidates (4 / 3 / 1 tokens)."""
    if rank < 8:
        return 4
    if rank < 32:
        return 3
    return 1


def paper_tree(root: int, retrieval: Retrieval, budget: int, max_depth: int) -> DraftTree:
    """The paper's tree: the root branch, then candidates by rank, cut at `budget` nodes."""
    if max_depth <= 0:
        return DraftTree.chain(root)
    branches = [retrieval.root_branch[:max_depth]] if retrieval.root_branch else []
    for token, rank, cont in zip(retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_conts, strict=True):
        length = min(paper_branch_length(rank), max_depth)
        branches.append([token, *cont[: length - 1]])
    return DraftTree.from_branches(root, branches, max_nodes=budget)


def rank_bucket(rank: int) -> int:
    """0 for the root token itself, then 1, 2, 3-4, 5-8, ... (1-based ranks, log2 buckets)."""
    return 0 if rank == SELF_RANK else (rank + 1).bit_length()


# The priors below are given for matches of up to this many tokens; longer matches
# (max_ngram > 3) share the 3-gram prior and learn their own rates online.
PRIOR_MAX_NGRAM = 3


def default_prior(key: Hashable) -> tuple[float, float]:
    """(mean, strength) of a rate before any observation.

    Read off SmolLM2-135M's greedy outputs on Spec-Bench (3 questions per category);
    they only shape the first steps, observations take over within a few dozen.
    """
    kind = key[0]
    if kind == "root":  # ("root", m, heat, depth): the root branch's depth-th token, given the ones above
        _, m, heat, depth = key
        m = min(m, PRIOR_MAX_NGRAM)
        if depth == 1:
            return (0.17, 0.3, 0.8 if heat == MAX_HEAT else 0.55)[m - 1], 4.0
        return (0.6, 0.65, 0.85)[m - 1], 4.0
    if kind == "next":  # ("next", m, i): retrieved token i after a right candidate, given the ones above
        return (0.5 if key[2] == 1 else 0.75), 4.0
    _, bucket, m = key  # ("cand", rank bucket, m): the candidate is the next-next token
    m = min(m, PRIOR_MAX_NGRAM)
    if bucket == 0:  # the root token repeated
        return (0.3 if m >= 2 else 0.005), 20.0
    decay = (2.0, 1.6, 1.4, 1.4)[m] ** (bucket - 1)
    return (0.02, 0.035, 0.35, 0.35)[m] / decay, 20.0


class LogitSpecProposer:
    def __init__(self, config: LogitSpecConfig, costs: CostModel | None = None) -> None:
        if config.adaptive and costs is None:
            raise ValueError("adaptive LogitSpec needs a cost model (LogitSpecConfig.build measures one)")
        self.config = config
        self.costs = costs.table(config.budget) if costs is not None else []
        self.stats = AcceptanceStats(default_prior)
        self.index = NGramIndex(config.max_ngram, config.prefer)
        self._last: Retrieval | None = None
        self._heat = 0  # draft tokens accepted at the previous step, capped at MAX_HEAT

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = NGramIndex(self.config.max_ngram, self.config.prefer)
        self.index.extend(prompt_ids)
        self._last = None
        self._heat = 0

    def propose(self, ctx: ProposalContext) -> DraftTree:
        config = self.config
        tokens = ctx.token_ids
        self.index = synced_index(self.index, tokens)
        root = tokens[-1]
        max_depth = ctx.max_depth
        if max_depth <= 0 or config.budget == 1:
            self._last = None
            return DraftTree.chain(root)
        cand_cont = config.max_continuation - 1 if config.adaptive else paper_branch_length(0) - 1
        retrieval = retrieve(
            self.index, tokens, ctx.last_logits, config.k, config.max_continuation, cand_cont, config.adaptive
        )
        if not config.adaptive:
            return paper_tree(root, retrieval, config.budget, max_depth)
        self._last = retrieval
        return self._adaptive_tree(root, retrieval, max_depth)

    def _adaptive_tree(self, root: int, retrieval: Retrieval, max_depth: int) -> DraftTree:
        branches: list[list[int]] = []
        branch_probs: list[list[float]] = []
        if retrieval.root_branch:
            length = min(len(retrieval.root_branch), max_depth)
            chain = self._chain(("root", retrieval.root_ngram, self._heat), length)
            branches.append(retrieval.root_branch)
            branch_probs.append(chain)
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
                probs.extend(p * c for c in next_chains[m][: min(len(cont), max_depth - 1)] if p * c >= MIN_NODE_PROB)
            branches.append([token, *cont])
            branch_probs.append(probs)
        lengths, _ = plan_tree(branch_probs, self.costs, self.config.budget, self.config.min_gain)
        kept = [branch[:length] for branch, length in zip(branches, lengths, strict=True) if length]
        return DraftTree.from_branches(root, kept, max_nodes=self.config.budget)

    def _chain(self, prefix: tuple, length: int) -> list[float]:
        """Cumulative products rate((*prefix, 1)) * rate((*prefix, 2)) ..., stopping below MIN_NODE_PROB."""
        probs, p, rate = [], 1.0, self.stats.rate
        for depth in range(1, length + 1):
            p *= rate((*prefix, depth))
            if p < MIN_NODE_PROB:
                break
            probs.append(p)
        return probs

    def observe(self, result: VerifyResult) -> None:
        """Learn acceptance rates from the emitted tokens, for every retrieval of the step."""
        retrieval, self._last = self._last, None
        heat, self._heat = self._heat, min(result.num_accepted, MAX_HEAT)
        if retrieval is None:
            return
        actual = result.tokens  # actual[0] follows the root, actual[1] follows that, ...
        update = self.stats.update
        for depth, token in enumerate(retrieval.root_branch[: len(actual)], start=1):
            hit = token == actual[depth - 1]
            update(("root", retrieval.root_ngram, heat, depth), 1.0, float(hit))
            if not hit:
                break
        offered: dict[tuple[str, int, int], int] = {}
        hit_at = -1
        for j, (rank, m) in enumerate(zip(retrieval.cand_ranks, retrieval.cand_ngrams, strict=True)):
            key = ("cand", rank_bucket(rank), m)
            offered[key] = offered.get(key, 0) + 1
            if retrieval.cand_tokens[j] == actual[0]:
                hit_at = j
        for key, count in offered.items():
            update(key, float(count), 0.0)
        if hit_at < 0:
            return
        m = retrieval.cand_ngrams[hit_at]
        update(("cand", rank_bucket(retrieval.cand_ranks[hit_at]), m), 0.0, 1.0)
        for i, token in enumerate(retrieval.cand_conts[hit_at][: len(actual) - 1], start=1):
            hit = token == actual[i]
            update(("next", m, i), 1.0, float(hit))
            if not hit:
                break
