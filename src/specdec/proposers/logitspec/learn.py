"""LogitSpec's online acceptance rates: priors, feature keys, and learning from the emitted tokens.

Why: the adaptive tree keeps a node only where its expected gain pays for its
cost, so every node needs a probability of being accepted. Those come from
rates per feature key, learned online (`budget.AcceptanceStats`, windowed):

- ("pld", m, heat, depth) / ("root", m, heat, depth): prompt lookup's chain /
  the root's own retrieval: the token at `depth` is right given the ones above
  it (m: matched n-gram size; heat: drafts the previous step accepted, 0..MAX_HEAT);
- ("cand", rank bucket, m): a next-next candidate is right; ("next", m, i): the
  i-th retrieved token after a right candidate, given the ones above;
- ("third", rank bucket): a third-level guess is right given its first-level
  token; ("next3", i): tokens retrieved after it;
- ("recycle", rank): the rank-th recycled successor of a right token is right;
- ("session", m, heat, depth) / ("datastore", m, heat, depth): chains from the
  cross-request store / the external datastore (m: matched n-gram size; the
  store's told apart only as its longest vs shorter, the datastore's capped at 4).

No prior is fitted on any data (Spec-Bench included): chained rates start at
Beta(1, 1); "which of n guesses, if any, is right" (candidates, third-level
guesses, recycled successors) starts symmetric, mean 1/(n + 1); all with the
weight of two observations, so the text at hand takes over within steps.

One learner for both of LogitSpec's proposers: the tree proposer (`learn_step`)
and chain mode (`chain`, which learns `learn_retrieval`'s part and shares the
priors and `chain_probs`), so a key means the same in both.

Learning is counterfactual: every retrieval a step computed is scored against
the tokens verification emitted, whether the planner offered it or not, so a
source cut today comes back when it starts being right.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from specdec.engine.costs import AcceptanceStats
from specdec.proposers.logitspec.retrieval import SELF_RANK, THIRD_K, Retrieval, Third

MAX_HEAT = 2  # right after a long acceptance the text is usually still being copied
RECYCLE_K = 8  # successors per token in the recycled table (Token Recycling's k)
PRIOR_WEIGHT = 2.0
SOURCES = ("pld", "root", "cand", "third", "recycle", "session", "datastore")


def uninformative_prior(k: int) -> Callable[[Hashable], tuple[float, float]]:
    """(mean, strength) of a rate before any observation; fitted on nothing (see the module docstring)."""
    means = {"cand": 1.0 / (max(k, 1) + 1), "third": 1.0 / (THIRD_K + 1), "recycle": 1.0 / (RECYCLE_K + 1)}

    def prior(key: Hashable) -> tuple[float, float]:
        return means.get(key[0], 0.5), PRIOR_WEIGHT  # type: ignore[index]

    return prior


def rank_bucket(rank: int) -> int:
    """0 for the root token itself, then 1, 2, 3-4, 5-8, ... (1-based ranks, log2 buckets)."""
    return 0 if rank == SELF_RANK else (rank + 1).bit_length()


@dataclass
class Step:
    """What one step retrieved and offered: `learn_step` scores it against the emitted tokens."""

    retrieval: Retrieval | None  # None: paper mode (nothing to learn)
    floor_chain: list[int]
    floor_ngram: int
    heat: int
    thirds: list[Third] = field(default_factory=list)
    # (key prefix, chain) of other sources
    chains: list[tuple[tuple, list[int]]] = field(default_factory=list)
    recycle_rows: dict[int, list[int]] = field(default_factory=dict)  # token -> its successors, as drafted
    sources: list[str] = field(default_factory=list)  # per tree node, "" for the root


def count_sources(source_stats: dict[str, dict[str, int]], sources: list[str], path: list[int]) -> None:
    """Add one step's offered nodes per source, and the accepted ones (tree node ids in `path`, root first)."""
    for source in sources:
        if source:
            source_stats.setdefault(source, {"offered": 0, "accepted": 0})["offered"] += 1
    for node in path[1:]:
        source_stats[sources[node]]["accepted"] += 1


def chain_probs(rate: Callable[[Hashable], float], prefix: tuple, length: int, min_prob: float = 0.0) -> list[float]:
    """Cumulative products rate((*prefix, 1)) * rate((*prefix, 2)) ...: the chance each depth is accepted,
    stopping below `min_prob`."""
    probs, p = [], 1.0
    for depth in range(1, length + 1):
        p *= rate((*prefix, depth))
        if p < min_prob:
            break
        probs.append(p)
    return probs


def learn_step(stats: AcceptanceStats, step: Step, root: int, actual: Sequence[int], heat: int) -> None:
    """Score everything `step` retrieved against `actual` (the emitted tokens: actual[0] follows the root)."""
    retrieval = step.retrieval
    if retrieval is None or not actual:
        return
    learn_chain(stats, ("pld", step.floor_ngram, heat), step.floor_chain, actual)
    learn_retrieval(stats, retrieval, heat, actual)
    learn_thirds(stats, step.thirds, actual)
    for prefix, chain in step.chains:
        learn_chain(stats, prefix, chain, actual)
    learn_recycle(stats, step.recycle_rows, root, actual)


def learn_retrieval(stats: AcceptanceStats, retrieval: Retrieval, heat: int, actual: Sequence[int]) -> None:
    """The root's branch and the next-next candidates, scored against `actual` (not empty).

    heat: what the root branch's rates were keyed by when `retrieval` was made. The
    whole of what chain mode learns (`chain`); the tree proposer learns more around it.
    """
    learn_chain(stats, ("root", retrieval.root_ngram, heat), retrieval.root_branch, actual)
    learn_candidates(stats, retrieval, actual)


def learn_chain(stats: AcceptanceStats, prefix: tuple, chain: Sequence[int], actual: Sequence[int]) -> None:
    """(*prefix, depth) keys: one observation per depth until the first wrong token."""
    for depth, token in enumerate(chain[: len(actual)], start=1):
        hit = token == actual[depth - 1]
        stats.update((*prefix, depth), 1.0, float(hit))
        if not hit:
            break


def learn_candidates(stats: AcceptanceStats, retrieval: Retrieval, actual: Sequence[int]) -> None:
    offered: dict[tuple[str, int, int], int] = {}
    hit_at = -1
    for j, (rank, m) in enumerate(zip(retrieval.cand_ranks, retrieval.cand_ngrams, strict=True)):
        key = ("cand", rank_bucket(rank), m)
        offered[key] = offered.get(key, 0) + 1
        if retrieval.cand_tokens[j] == actual[0]:
            hit_at = j
    for key, count in offered.items():
        stats.update(key, float(count), 0.0)
    if hit_at < 0:
        return
    m = retrieval.cand_ngrams[hit_at]
    stats.update(("cand", rank_bucket(retrieval.cand_ranks[hit_at]), m), 0.0, 1.0)
    learn_chain(stats, ("next", m), retrieval.cand_conts[hit_at], actual[1:])


def learn_thirds(stats: AcceptanceStats, thirds: list[Third], actual: Sequence[int]) -> None:
    if len(actual) < 2:
        return
    for third in thirds:
        if third.first != actual[0]:
            continue
        hit = third.token == actual[1]
        stats.update(("third", rank_bucket(third.position)), 1.0, float(hit))
        if hit:
            learn_chain(stats, ("next3",), third.cont, actual[2:])


def learn_recycle(stats: AcceptanceStats, rows: dict[int, list[int]], root: int, actual: Sequence[int]) -> None:
    """Each drafted successor row scored where its token was followed by an emitted token."""
    if not rows:
        return
    prev = root
    for token in actual:
        row = rows.get(prev)
        if row is not None:
            for rank, successor in enumerate(row):
                stats.update(("recycle", rank), 1.0, float(successor == token))
        prev = token
