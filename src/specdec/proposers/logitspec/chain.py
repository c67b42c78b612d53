"""LogitSpec in chain mode: the single most promising chain of one step's retrieval, and learning from it.

Why: engines such as vLLM verify one draft chain per request, not a token
tree. LogitSpec's retrieval (`retrieval.retrieve`) still
yields several branches: the root's own continuation and, for each top-k
candidate of the logits the root was drawn from, [candidate, its continuation].
This module picks one of them, and how much of it, by expected gain: each token
is worth its chance of being accepted (the product of online-learned
conditional rates down the branch) minus `node_cost`, the price of verifying
one more token; the chain is the branch prefix with the largest total.

Rates, priors and learning are the tree proposer's (`learn`): the same feature
keys (`("root", m, heat, depth)`, `("cand", rank bucket, m)`, `("next", m, i)`),
kept in a `budget.AcceptanceStats` shared by all requests, seeded by
`learn.uninformative_prior` and learned by `learn.learn_retrieval`,
counterfactually: every branch the step retrieved is scored against the tokens
the engine emitted, offered or not, so a branch never chosen can still win later.

`retrieve_chain` does the retrieval and the choice in one pass and skips the
index lookups of candidates whose rank cannot win (on two cores those lookups
were most of the proposer's time per step); it picks what `choose_chain` would
pick from the full retrieval.

Invariants: no engine (one `torch.topk` over the logits row, the rest pure
Python over lists); a chain is a prefix of one retrieved branch, at most
`max_len` long, every kept token with a chance above `node_cost`; [] when
nothing pays. Drafts are guesses: whatever is chosen,
the engine's verification keeps the output lossless.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.engine.costs import AcceptanceStats
from specdec.proposers.logitspec.learn import chain_probs, rank_bucket
from specdec.proposers.logitspec.retrieval import Retrieval, continue_match, ranked_candidates
from specdec.proposers.ngram_index import NGramIndex


def _gain(probs: Sequence[float], node_cost: float) -> tuple[int, float]:
    """(tokens worth keeping, their total gain): the prefix whose chances exceed `node_cost`."""
    num, gain = 0, 0.0
    for p in probs:
        if p <= node_cost:
            break
        num, gain = num + 1, gain + p - node_cost
    return num, gain


class _Chooser:
    """The best-paying chain so far, offered branch by branch; and a bound on what a candidate could gain."""

    def __init__(self, stats: AcceptanceStats, heat: int, max_len: int, node_cost: float, max_ngram: int) -> None:
        self.rate, self.heat, self.max_len, self.node_cost = stats.rate, heat, max_len, node_cost
        self.ngrams = range(max_ngram + 1)  # m of a candidate's match: 0 (none) .. max_ngram
        self.best: list[int] = []
        self.best_gain = 0.0
        self._next: dict[int, list[float]] = {}  # m -> cumulative continuation rates (per-step memo)
        self._bounds: dict[int, float] = {}  # rank bucket -> most any candidate in it could gain
        self._reach = 0.0  # 1 + the largest chances of a continuation's tokens (any m), depth by depth

    def next_probs(self, m: int) -> list[float]:
        if m not in self._next:
            self._next[m] = chain_probs(self.rate, ("next", m), self.max_len - 1)
        return self._next[m]

    def offer_root(self, branch: list[int], m: int) -> None:
        branch = branch[: self.max_len]
        num, gain = _gain(chain_probs(self.rate, ("root", m, self.heat), len(branch)), self.node_cost)
        if gain > self.best_gain:
            self.best, self.best_gain = branch[:num], gain

    def offer_candidate(self, token: int, rank: int, cont: list[int], m: int) -> None:
        first = self.rate(("cand", rank_bucket(rank), m))
        if first <= self.node_cost or (not cont and first - self.node_cost <= self.best_gain):
            return  # nothing to gain, or a bare candidate that cannot beat the best so far
        branch = [token, *cont[: self.max_len - 1]]
        num, gain = _gain([first, *(first * p for p in self.next_probs(m)[: len(branch) - 1])], self.node_cost)
        if gain > self.best_gain:
            self.best, self.best_gain = branch[:num], gain

    def can_win(self, rank: int) -> bool:
        """Whether a candidate of this rank, whatever its match, could beat the best chain so far."""
        bucket = rank_bucket(rank)
        if bucket not in self._bounds:
            if not self._reach:
                depths = zip(*(self.next_probs(m) for m in self.ngrams if m), strict=True)
                self._reach = 1.0 + sum(max(chances) for chances in depths)
            first = max(self.rate(("cand", bucket, m)) for m in self.ngrams)
            self._bounds[bucket] = first * self._reach if first > self.node_cost else 0.0
        return self._bounds[bucket] > self.best_gain


def choose_chain(
    retrieval: Retrieval, stats: AcceptanceStats, heat: int, max_len: int, node_cost: float
) -> list[int]:
    """The best-paying chain among the root branch and the candidates' branches ([] if none pays)."""
    max_ngram = max([retrieval.root_ngram, *retrieval.cand_ngrams])
    chooser = _Chooser(stats, heat, max_len, node_cost, max_ngram)
    if retrieval.root_branch:
        chooser.offer_root(retrieval.root_branch, retrieval.root_ngram)
    for token, rank, cont, m in zip(
        retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_conts, retrieval.cand_ngrams, strict=True
    ):
        chooser.offer_candidate(token, rank, cont, m)
    return chooser.best


def retrieve_chain(
    index: NGramIndex, last_logits: torch.Tensor, k: int, max_len: int, stats: AcceptanceStats, heat: int,
    node_cost: float,
) -> tuple[Retrieval, list[int]]:  # fmt: skip
    """`retrieve` and `choose_chain` in one pass, looking up only candidates that could still win.

    last_logits: [V] (or [0]: no candidates); `index` holds the whole context, which ends with the
    root. The branches are `retrieve`'s (the root's continuation of up to `max_len`; the top-k
    candidates of `last_logits` in rank order, the root token itself kept, the root branch's first
    token left out, each with up to `max_len - 1` tokens of continuation) and the chain is the one
    `choose_chain` would pick from all of them; but a candidate is looked up in the index only while
    `can_win` says its rank bucket could beat the best chain so far: looking up all 60 candidates
    was most of the proposer's time per step. The Retrieval returned holds the candidates looked
    up (`learn.learn_retrieval` scores those; whether one is looked up never depends on its own outcome).
    """
    root_branch, root_ngram = continue_match(index, (), max_len)
    chooser = _Chooser(stats, heat, max_len, node_cost, index.max_ngram)
    if root_branch:
        chooser.offer_root(root_branch, root_ngram)
    covered = root_branch[0] if root_branch else None
    root = index.tokens[-1]
    num = min(k, last_logits.shape[-1])
    top = torch.topk(last_logits, num).indices.tolist() if num else []
    tokens, ranks, conts, ngrams = [], [], [], []
    for token, rank in ranked_candidates(top, root, keep_self=True):
        if token == covered or not chooser.can_win(rank):
            continue
        cont, m = continue_match(index, (token,), max_len - 1)
        chooser.offer_candidate(token, rank, cont, m)
        tokens.append(token)
        ranks.append(rank)
        conts.append(cont)
        ngrams.append(m)
    return Retrieval(root_branch, root_ngram, tokens, ranks, conts, ngrams, top), chooser.best
