"""LogitSpec's parts without a model: periodic continuation, the PLD floor, the paper mode, third level, priors.

The identity tests on the real model (every mode against plain greedy, on every
Spec-Bench category) and the floor check on real prompts live in
test_retrieval.py, beside the fixtures they share.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import has_path, walk
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.engine.costs import CostModel
from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.proposers import MethodError, parse_method
from specdec.proposers.logitspec.learn import uninformative_prior
from specdec.proposers.logitspec.plan import ROOT, NodePool, best_prefix, chain_pays
from specdec.proposers.logitspec.proposer import LogitSpecConfig, LogitSpecProposer
from specdec.proposers.logitspec.retrieval import (
    continue_match,
    paper_branch_length,
    paper_retrieve,
    periodic_continuation,
    retrieve_thirds,
)
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import PLDConfig, PLDProposer
from specdec.sampling import SamplingParams

CPU_COSTS = CostModel((1, 16, 32, 64), (0.052, 0.094, 0.127, 0.189))  # SmolLM2 fp32, 2-core AVX2 CPU
DEAR = CostModel((1, 2, 64), (1.0, 3.0, 90.0))  # a second node costs two steps: no chain pays


def ctx_for(tokens: list[int], logits: torch.Tensor, max_depth: int = 64) -> ProposalContext:
    return ProposalContext(tokens, logits, 1, SamplingParams(), max_depth)


def indexed(tokens: list[int], max_ngram: int = 3) -> NGramIndex:
    index = NGramIndex(max_ngram, "latest")
    index.extend(tokens)
    return index


def pld_chain(tokens: list[int], max_depth: int = 64) -> list[int]:
    pld = PLDProposer(PLDConfig())
    pld.begin(tokens[:-1])
    return pld.propose(ctx_for(tokens, torch.zeros(16), max_depth)).token_list[1:]


# ------------------------------------------------------------------ periodic continuation
def test_periodic_continuation_by_hand():
    assert periodic_continuation([1, 2, 3, 1, 2], [], 2, 7) == [3, 1, 2, 3, 1, 2, 3]  # "1 2" last seen at 0
    assert periodic_continuation([7, 7, 7, 7], [], 3, 5) == [7] * 5  # a run of one token
    assert periodic_continuation([5, 6, 7, 5], [6], 2, 7) == [7, 5, 6, 7, 5, 6, 7]  # the candidate 6 is in the loop
    assert periodic_continuation([1, 2, 3, 4, 5], [], 1, 3) == [2, 3, 4]  # room enough: a plain slice
    # Through an index: "1 2" (2-gram) last continued at position 2; the run repeats instead of stopping.
    assert continue_match(indexed([1, 2, 3, 1, 2]), (), 7) == ([3, 1, 2, 3, 1, 2, 3], 2)
    assert continue_match(indexed([4, 9, 9, 9]), (), 6) == ([9] * 6, 2)
    assert continue_match(indexed([1, 2, 3]), (), 4) == ([], 0)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=1, max_size=30),
    extra=st.lists(st.integers(0, 4), max_size=2),
    length=st.integers(0, 40),
    data=st.data(),
)
def test_periodic_continuation_is_an_overlapping_copy(tokens, extra, length, data):
    pos = data.draw(st.integers(0, len(tokens) - 1))
    text = [*tokens, *extra]  # reference: copy token by token from `distance` back, reading what was just written
    distance = len(text) - pos
    while len(text) < pos + length:
        text.append(text[len(text) - distance])
    expected = text[pos : pos + length]
    assert periodic_continuation(tokens, extra, pos, length) == expected


# ------------------------------------------------------------------ the PLD floor
def test_floor_is_pld_chain_as_a_root_branch_when_it_pays():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    context = [1, 2, 9, 9, 9, 5, 1, 2, 8, 6, 4, 1, 2]  # pld (earliest "1 2") drafts 9 9 9 ...; latest: 8 6 4
    proposer = LogitSpecProposer(LogitSpecConfig(k=4, floor=True), CPU_COSTS)
    proposer.begin(context[:-1])
    tree = proposer.propose(ctx_for(context, torch.zeros(16)))
    chain = pld_chain(context)
    assert chain[:3] == [9, 9, 9] and proposer.floor_held is True
    assert tree.parent_list[: len(chain) + 1] == list(range(-1, len(chain)))  # the first branch, whole
    assert has_path(tree, chain)
    assert tree.num_nodes <= proposer.config.budget
    capped = proposer.propose(ctx_for(context, torch.zeros(16), max_depth=3))
    assert has_path(capped, chain[:3]) and capped.max_depth <= 3


def test_floor_is_declined_where_a_chain_does_not_pay_and_comes_back():
    context = [1, 2, 9, 9, 9, 5, 1, 2, 8, 6, 4, 1, 2]
    dear = LogitSpecProposer(LogitSpecConfig(k=4, floor=True), DEAR)
    dear.begin(context[:-1])
    assert dear.propose(ctx_for(context, torch.zeros(16))).num_nodes == 1 and dear.floor_held is False
    proposer = LogitSpecProposer(LogitSpecConfig(k=0, floor=True), CPU_COSTS)
    proposer.begin(context[:-1])
    for _ in range(300):  # the target never agrees with the chain: its expected tokens fall, it stops paying
        tree = proposer.propose(ctx_for(context, torch.zeros(16)))
        proposer.observe(VerifyResult([15], [0], torch.zeros(tree.num_nodes, 16), tree))
    assert proposer.propose(ctx_for(context, torch.zeros(16))).num_nodes == 1 and proposer.floor_held is False
    truth = [*pld_chain(context), 15]
    for _ in range(150):  # ... then always does: the floor is learned back counterfactually
        tree = proposer.propose(ctx_for(context, torch.zeros(16)))
        path = walk(tree, truth)
        proposer.observe(VerifyResult(truth[: len(path)], path, torch.zeros(tree.num_nodes, 16), tree))
    assert proposer.propose(ctx_for(context, torch.zeros(16))).num_nodes > 1 and proposer.floor_held is True


def test_floor_off_and_no_match():
    context = [1, 2, 9, 9, 9, 5, 1, 2, 8, 6, 4, 1, 2]
    off = LogitSpecProposer(LogitSpecConfig(k=0, floor=False), CPU_COSTS)
    off.begin(context[:-1])
    off.propose(ctx_for(context, torch.zeros(16)))
    assert off.floor_held is None
    fresh = LogitSpecProposer(LogitSpecConfig(k=4), CPU_COSTS)
    fresh.begin(list(range(10)))
    fresh.propose(ctx_for([*range(10), 11], torch.zeros(16)))
    assert fresh.floor_held is None  # nothing retrieved for the root: no floor to hold


def test_a_gated_step_verifies_only_a_looked_up_chain_that_pays():
    """A step the floor keeps plain (depth 0) drafts nothing unless it may look up (`lookup_depth`): then the
    root's own retrieval where it matched two tokens or more, cut to the prefix that pays (with `floor`:
    prompt lookup's chain, whole), learned from like a drafting step's; never a candidate or another source's node."""
    context = [1, 2, 9, 9, 9, 5, 1, 2, 8, 6, 4, 1, 2]  # "1 2": earliest 9 9 9 (pld), latest 8 6 4 (the root's)
    gated = dataclasses.replace(ctx_for(context, torch.zeros(16)), max_depth=0)
    for floor, source, chain in ((True, "pld", pld_chain(context)),
                                 (False, "root", continue_match(indexed(context), (), 8)[0])):  # fmt: skip
        proposer = LogitSpecProposer(LogitSpecConfig(k=4, floor=floor), CPU_COSTS)
        proposer.begin(context[:-1])
        assert proposer.propose(gated).num_nodes == 1  # no lookup asked: the root alone
        tree = proposer.propose(dataclasses.replace(gated, lookup_depth=8))
        kept = tree.token_list[1:]
        assert tree.parent_list == list(range(-1, len(kept))) and 0 < len(kept) <= len(chain)
        assert kept == chain[: len(kept)] and chain[0] == (9 if floor else 8)
        if floor:
            assert len(kept) == min(8, len(chain))
        before = proposer.stats.rate((source, 2, 0, 1))
        proposer.observe(VerifyResult([chain[0], 15], [0, 1], torch.zeros(tree.num_nodes, 16), tree))
        assert proposer.stats.rate((source, 2, 0, 1)) > before
        assert proposer.source_stats[source]["accepted"] == 1
    dear = LogitSpecProposer(LogitSpecConfig(k=4), DEAR)
    dear.begin(context[:-1])
    assert dear.propose(dataclasses.replace(gated, lookup_depth=8)).num_nodes == 1  # it does not pay
    fresh = LogitSpecProposer(LogitSpecConfig(k=4), CPU_COSTS)
    fresh.begin(list(range(10)))
    no_match = ProposalContext([*range(10), 11], torch.zeros(16), 1, SamplingParams(), 0, lookup_depth=8)
    assert fresh.propose(no_match).num_nodes == 1


def test_chain_pays_and_best_prefix_with_a_floor():
    costs = CPU_COSTS.table(64)
    assert chain_pays([0.5, 0.25], costs) and not chain_pays([0.01] * 10, costs)
    assert not chain_pays([0.9], DEAR.table(64))
    # A fixed floor is kept; others join only where they raise the expected rate.
    num, rate = best_prefix([0.9, 0.8, 0.001], costs, 64, min_gain=0.5, fixed_nodes=3, fixed_expected=1.5)
    assert num == 2 and rate == pytest.approx((1 + 1.5 + 1.7) / costs[6])


def test_node_pool_merges_clamps_and_plans_parents_first():
    pool = NodePool(0, max_depth=3, max_nodes=10)
    a = pool.add(ROOT, [1, 2, 3, 4], [0.9, 0.8, 0.7, 0.6], "pld")
    assert len(a) == 3  # depth 3 at most
    b = pool.add(ROOT, [1, 5], [0.95, 0.9], "root")  # shares node "1": merged, the larger estimate kept
    assert b[0] == a[0] and pool.probs[a[0]] == 0.95 and pool.sources[a[0]] == "pld"
    assert pool.probs[b[1]] <= pool.probs[b[0]]  # clamped below its parent
    chosen = pool.plan([0.0] + [1.0] * 10, 10, [], 0.0, 0.0)  # free nodes: all
    tree, sources = pool.tree(chosen)
    assert has_path(tree, [1, 2, 3]) and has_path(tree, [1, 5]) and sources[0] == ""


def test_siblings_are_exclusive_when_planned():
    pool = NodePool(0, max_depth=3, max_nodes=10)
    pld = pool.add(ROOT, [1, 2], [0.8, 0.6], "pld")
    root = pool.add(ROOT, [3, 4], [0.7, 0.5], "root")  # another first token: both cannot be accepted
    probs = pool.exclusive_probs()
    assert probs[pld[0]] == pytest.approx(0.8 / 1.5) and probs[root[0]] == pytest.approx(0.7 / 1.5)
    assert probs[pld[1]] == pytest.approx(0.8 / 1.5 * 0.6 / 0.8)  # the subtree scaled with its top
    assert pool.probs[pld[0]] == 0.8  # the sources' own estimates are kept
    # An extra node costs 0.6 of a step: the first two nodes paid on the sources' sum, not on exclusive chances.
    costs = [0.0] + [1.0 + 0.6 * n for n in range(10)]
    assert pool.plan(costs, 10, [], 0.0, 0.0) == []
    lone = NodePool(0, max_depth=3, max_nodes=10)
    lone.add(ROOT, [1, 2], [0.8, 0.6], "pld")
    assert lone.exclusive_probs() == lone.probs and lone.plan(costs, 10, [], 0.0, 0.0) == [1]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 3), min_size=1, max_size=4),
                          st.lists(st.floats(0.01, 1.0), min_size=1, max_size=4)), min_size=1, max_size=8))
def test_exclusive_children_never_sum_past_their_parent(branches):
    pool = NodePool(0, max_depth=4, max_nodes=32)
    for anchor, branch, probs in branches:
        pool.add(min(anchor, len(pool) - 1), branch, sorted(probs, reverse=True), "pld")
    probs = pool.exclusive_probs()
    below = [0.0] * len(pool)
    for node in range(1, len(pool)):
        parent = pool.parents[node]
        below[parent] += probs[node]
        assert probs[node] <= min(probs[parent], pool.probs[node]) + 1e-12
    assert all(total <= probs[node] + 1e-9 for node, total in enumerate(below) if total)


# ------------------------------------------------------------------ paper mode
def test_paper_mode_by_hand():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # root 6: a repeated run "5 6 7 8"
    logits = torch.zeros(16)
    logits[6], logits[7], logits[3] = 3.0, 2.0, 1.0  # top: the root 6 (skipped), 7, 3, ...
    got = paper_retrieve(indexed(context), context, logits, k=3, max_continuation=20)
    assert got.root_branch == [7, 8, 5, 6] * 5  # 20 tokens: the run continues periodically
    assert got.cand_tokens == [7, 3] and got.cand_ranks == [1, 2]  # 7 kept though it starts the root branch
    assert got.cand_conts[0] == [8, 5, 6]  # "6 7" -> 8 5 6 (top position 1: 4 tokens)
    assert [paper_branch_length(p) for p in (0, 8, 9, 32, 33)] == [4, 4, 3, 3, 1]
    proposer = LogitSpecProposer(LogitSpecConfig(k=3, adaptive=False))
    proposer.begin(context[:-1])
    tree = proposer.propose(ctx_for(context, logits))
    assert has_path(tree, got.root_branch) and has_path(tree, [3])
    assert tree.num_nodes == 1 + 20 + 1  # candidate 7's "7 8 5 6" merged into the root branch


def test_paper_mode_fills_the_budget_in_rank_order():
    context = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3]
    logits = torch.arange(16, dtype=torch.float32).flip(0)  # top: 0, 1, 2, ...

    def size(budget: int) -> int:
        proposer = LogitSpecProposer(LogitSpecConfig(k=16, budget=budget, adaptive=False))
        proposer.begin(context[:-1])
        return proposer.propose(ctx_for(context, logits)).num_nodes

    full = size(1000)
    assert full > 16  # the root branch, every candidate and its continuation
    assert [size(b) for b in (1, 5, 16, 64)] == [min(b, full) for b in (1, 5, 16, 64)]


# ------------------------------------------------------------------ third level
def test_third_level_only_where_the_pair_was_seen():
    context = [1, 2, 3, 4, 2, 5, 6, 7]
    index = indexed(context)
    thirds = retrieve_thirds(index, [(2, 3), (7, -1)], top=[5, 3, 4, 9], length=2)
    assert [(t.first, t.token, t.position, t.cont) for t in thirds] == [(2, 5, 0, [6, 7])]  # (2, 3): taken
    assert retrieve_thirds(indexed(context, max_ngram=1), [(2, -1)], top=[5], length=2) == []


def test_third_level_nodes_hang_below_first_level_ones():
    context = [1, 2, 3, 4, 2, 5, 6, 7, 8, 9, 1]  # root 1 -> 2 retrieved; "2 5" and "2 3" both seen
    logits = torch.zeros(16)
    logits[5], logits[3] = 2.0, 1.0
    free = CostModel((1, 64), (1.0, 1.0))
    proposer = LogitSpecProposer(LogitSpecConfig(k=4, third=True), free)
    proposer.begin(context[:-1])
    tree = proposer.propose(ctx_for(context, logits))
    assert has_path(tree, [2, 5]) and has_path(tree, [2, 3])  # the root branch's 2, then the third-level 5
    assert "third" in proposer._last.sources
    with pytest.raises(MethodError):
        parse_method("logitspec:adaptive=false,third=true")


# ------------------------------------------------------------------ priors and source counts
def test_priors_are_uninformative():
    prior = uninformative_prior(60)
    assert prior(("root", 3, 2, 1)) == (0.5, 2.0) and prior(("pld", 1, 0, 7)) == (0.5, 2.0)
    assert prior(("cand", 1, 3)) == prior(("cand", 7, 0)) == (pytest.approx(1 / 61), 2.0)  # rank and match alike


def test_source_stats_count_offered_and_accepted():
    context = [1, 2, 9, 9, 9, 5, 1, 2, 8, 6, 4, 1, 2]
    proposer = LogitSpecProposer(LogitSpecConfig(k=4, floor=True), CPU_COSTS)
    proposer.begin(context[:-1])
    tree = proposer.propose(ctx_for(context, torch.zeros(16)))
    path = [0, 1, 2]  # the floor's first two nodes accepted
    proposer.observe(VerifyResult([9, 9, 15], path, torch.zeros(tree.num_nodes, 16), tree))
    stats = proposer.source_stats
    assert stats["pld"]["accepted"] == 2 and sum(s["offered"] for s in stats.values()) == tree.num_nodes - 1
