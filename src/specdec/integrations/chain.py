"""LogitSpec in chain mode: the single most promising chain of one step's retrieval, and learning from it.

Why: engines such as vLLM verify one draft chain per request, not a token
tree. LogitSpec's retrieval (`specdec.proposers.logitspec.retrieve`) still
yields several branches: the root's own continuation and, for each top-k
candidate of the logits the root was drawn from, [candidate, its continuation].
This module picks one of them, and how much of it, by expected gain: each token
is worth its chance of being accepted (the product of online-learned
conditional rates down the branch) minus `node_cost`, the price of verifying
one more token; the chain is the branch prefix with the largest total.

Rates use the same feature keys as the tree proposer (`("root", m, heat,
depth)`, `("cand", rank bucket, m)`, `("next", m, i)`), kept in a
`budget.AcceptanceStats` shared by all requests, and are learned
counterfactually: every branch the step retrieved is scored against the tokens
the engine emitted, offered or not, so a branch never chosen can still win later.

Invariants: pure Python over lists (no engine, no tensors); a chain is a prefix
of one retrieved branch, at most `max_len` long, every kept token with a chance
above `node_cost`; [] when nothing pays. Drafts are guesses: whatever is chosen,
the engine's verification keeps the output lossless.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from specdec.proposers.budget import AcceptanceStats
from specdec.proposers.logitspec import Retrieval, rank_bucket

PRIOR_STRENGTH = 2.0  # a prior weighs as much as two observations: data takes over within steps


def chain_prior(k: int) -> Callable[[Hashable], tuple[float, float]]:
    """(mean, strength) before any observation, fitted on nothing.

    A candidate is one of k guesses for the same token (or none of them is right):
    mean 1/(k + 1). Every chained rate (a token right given the ones above it): 1/2.
    """
    cand_mean = 1.0 / (max(k, 1) + 1)

    def prior(key: Hashable) -> tuple[float, float]:
        return (cand_mean if key[0] == "cand" else 0.5), PRIOR_STRENGTH  # type: ignore[index]

    return prior


def cumulative(rate: Callable[[Hashable], float], prefix: tuple, length: int) -> list[float]:
    """[rate(prefix + (1,)), that * rate(prefix + (2,)), ...]: the chance each depth is accepted."""
    probs, p = [], 1.0
    for depth in range(1, length + 1):
        p *= rate((*prefix, depth))
        probs.append(p)
    return probs


def _gain(probs: Sequence[float], node_cost: float) -> tuple[int, float]:
    """(tokens worth keeping, their total gain): the prefix whose chances exceed `node_cost`."""
    num, gain = 0, 0.0
    for p in probs:
        if p <= node_cost:
            break
        num, gain = num + 1, gain + p - node_cost
    return num, gain


def choose_chain(
    retrieval: Retrieval, stats: AcceptanceStats, heat: int, max_len: int, node_cost: float
) -> list[int]:
    """The best-paying chain among the root branch and the candidates' branches ([] if none pays)."""
    best: list[int] = []
    best_gain = 0.0
    rate = stats.rate
    if retrieval.root_branch:
        branch = retrieval.root_branch[:max_len]
        num, gain = _gain(cumulative(rate, ("root", retrieval.root_ngram, heat), len(branch)), node_cost)
        best, best_gain = branch[:num], gain
    next_probs: dict[int, list[float]] = {}  # per-step memo: m -> cumulative continuation rates
    for token, rank, cont, m in zip(
        retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_conts, retrieval.cand_ngrams, strict=True
    ):
        first = rate(("cand", rank_bucket(rank), m))
        if first <= node_cost or (not cont and first - node_cost <= best_gain):
            continue  # nothing to gain, or a bare candidate that cannot beat the best so far
        if m not in next_probs:
            next_probs[m] = cumulative(rate, ("next", m), max_len - 1)
        branch = [token, *cont[: max_len - 1]]
        num, gain = _gain([first, *(first * p for p in next_probs[m][: len(branch) - 1])], node_cost)
        if gain > best_gain:
            best, best_gain = branch[:num], gain
    return best


def learn_chain(stats: AcceptanceStats, prefix: tuple, chain: Sequence[int], emitted: Sequence[int]) -> None:
    """Score `chain` against the emitted tokens depth by depth, up to its first miss."""
    for depth, token in enumerate(chain[: len(emitted)], start=1):
        hit = token == emitted[depth - 1]
        stats.update((*prefix, depth), 1.0, float(hit))
        if not hit:
            break


def learn(stats: AcceptanceStats, retrieval: Retrieval, heat: int, emitted: Sequence[int]) -> None:
    """Learn from one step: `emitted[0]` followed the root, `emitted[1]` followed that, ...

    heat: what the chain's root-branch rates were keyed by when `retrieval` was made.
    """
    if not emitted:
        return
    learn_chain(stats, ("root", retrieval.root_ngram, heat), retrieval.root_branch, emitted)
    offered: dict[tuple, int] = {}
    hit_at = -1
    for j, (token, rank, m) in enumerate(
        zip(retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_ngrams, strict=True)
    ):
        key = ("cand", rank_bucket(rank), m)
        offered[key] = offered.get(key, 0) + 1
        if token == emitted[0]:
            hit_at = j
    for key, count in offered.items():
        stats.update(key, float(count), 0.0)
    if hit_at >= 0:
        m = retrieval.cand_ngrams[hit_at]
        stats.update(("cand", rank_bucket(retrieval.cand_ranks[hit_at]), m), 0.0, 1.0)
        learn_chain(stats, ("next", m), retrieval.cand_conts[hit_at], emitted[1:])
