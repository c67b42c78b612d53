"""Token Recycling (`recycle`): the static tree shape, the successor table, and lossless decoding.

Model-free: the shape is a breadth-first, prefix-closed set of rank paths within
the budget and depth (close to the authors' 80-node template); the table writes
the top-k of every verified node's logits into that node's row, expands from the
root along the shape, drops unknown successors and stops below end-of-sequence
nodes; `branches` rebuilds exactly the expanded tree; one table per model and k.
On the real default model (fp32): greedy output is token-identical to plain
greedy on a Spec-Bench prompt of every category, seeded sampling from the same
table state is reproducible, and a warm table drafts tokens that get accepted.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from helpers import fresh_recycle, prompts_by_category
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.proposers import parse_method
from specdec.proposers.recycle import (
    RecycleConfig,
    RecycleProposer,
    RecycleTable,
    depth_prefix,
    output_vocab_size,
    static_shape,
)
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

NEW_TOKENS = 16


def logits_favouring(vocab: int, *ranked: int) -> torch.Tensor:
    """[V] logits whose top tokens are `ranked`, in that order."""
    row = torch.zeros(vocab)
    for i, token in enumerate(ranked):
        row[token] = 10.0 - i
    return row


def ctx_for(tokens: list[int], vocab: int, max_depth: int = 64) -> ProposalContext:
    return ProposalContext(tokens, torch.zeros(vocab), 1, SamplingParams(), max_depth)


# ------------------------------------------------------------------ the static shape
@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 10), budget=st.integers(1, 120), max_depth=st.integers(0, 8))
def test_static_shape_is_breadth_first_prefix_closed_and_bounded(k, budget, max_depth):
    shape = static_shape(k, budget, max_depth)
    assert len(shape) <= budget - 1
    depths = [0]
    for i, (parent, rank, depth) in enumerate(shape, start=1):
        assert 0 <= parent < i and 0 <= rank < k  # parents first: prefix-closed
        assert depth == depths[parent] + 1 <= max_depth
        depths.append(depth)
    assert depths == sorted(depths)  # breadth-first: every depth limit is a prefix
    for limit in range(max_depth + 1):
        assert depth_prefix(shape, limit) == tuple(node for node in shape if node[2] <= limit)
    if max_depth >= 1 and budget > 1:
        assert shape[0] == (0, 0, 1)  # the best successor of the root comes first


def test_static_shape_resembles_the_papers_template():
    shape = static_shape(8, 81, 6)
    widths = [sum(depth == d for *_, depth in shape) for d in range(1, 7)]
    assert widths == [8, 23, 25, 17, 6, 1]  # the authors' "2.2.2": 8, 21, 25, 15, 8, 3
    assert shape[8][:2] == (1, 0)  # the first grandchild hangs below the best successor


# ------------------------------------------------------------------ the table (no model)
def test_update_and_expand_by_hand():
    table = RecycleTable(vocab_size=10, k=2)
    assert table.successors(3) == []
    tokens = torch.tensor([3, 5, 7])
    logits = torch.stack([logits_favouring(10, 5, 6), logits_favouring(10, 7, 1), logits_favouring(10, 9, 2)])
    table.update(tokens, logits)
    assert (table.successors(3), table.successors(5), table.successors(7)) == ([5, 6], [7, 1], [9, 2])
    nodes, parents = table.expand(3, static_shape(2, 64, 2))
    assert nodes == [3, 5, 6, 7, 1]  # 6 and 1 have no row yet: their subtrees are dropped
    assert parents == [-1, 0, 0, 1, 1]
    nodes, parents = table.expand(3, static_shape(2, 64, 3), eos_token_ids=(7,))
    assert nodes == [3, 5, 6, 7, 1]  # 7 is end-of-sequence: no children below it
    assert table.expand(4, static_shape(2, 64, 3)) == ([4], [-1])  # nothing known about 4
    table.update(torch.tensor([3]), logits_favouring(10, 8, 0)[None])  # a row is replaced, not merged
    assert table.successors(3) == [8, 0]


def test_update_refuses_bad_shapes():
    table = RecycleTable(vocab_size=10, k=2)
    with pytest.raises(ValueError, match="columns"):
        table.update(torch.tensor([1]), torch.zeros(1, 11))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        table.update(torch.tensor([1, 2]), torch.zeros(1, 10))
    small = RecycleTable(vocab_size=3, k=8)  # k > V: the row is partly filled
    small.update(torch.tensor([0]), torch.zeros(1, 3))
    assert sorted(small.successors(0)) == [0, 1, 2]


def test_a_row_of_fewer_known_successors_than_k_drops_the_missing_ranks():
    """The top ids read with a step (`VerifyResult.tops`) fill a row holding fewer numbers than k with -1: the row
    keeps the known ids, and a tree grown from it drops the ranks it does not hold."""
    table = RecycleTable(vocab_size=10, k=3)
    tops = np.array([[4, 2, -1], [6, -1, -1]])
    table.update([3, 4], torch.zeros(2, 10), tops)  # the tops are taken as read: the logits are not
    assert (table.successors(3), table.successors(4)) == ([4, 2], [6])
    nodes, parents = table.expand(3, static_shape(3, 64, 2))
    assert nodes == [3, 4, 2, 6] and parents == [-1, 0, 0, 1]


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.integers(0, 11), min_size=1, max_size=4, unique=True), min_size=12, max_size=12
    ),
    root=st.integers(0, 11),
    budget=st.integers(1, 40),
    max_depth=st.integers(0, 5),
)
def test_branches_rebuild_the_expanded_tree(rows, root, budget, max_depth):
    table = RecycleTable(vocab_size=12, k=4)
    for token, successors in enumerate(rows):
        table.update(torch.tensor([token]), logits_favouring(12, *successors)[None])
    shape = table.shape(budget, max_depth)
    nodes, parents = table.expand(root, shape)
    tree = DraftTree.from_branches(root, table.branches(root, budget, max_depth))
    assert sorted(zip(tree.token_list, tree.depths.tolist(), strict=True)) == sorted(
        zip(nodes, DraftTree(torch.tensor(nodes), torch.tensor(parents)).depths.tolist(), strict=True)
    )
    assert tree.num_nodes == len(nodes) <= budget and tree.max_depth <= max_depth
    for kids in tree.children:  # a trie: one table row holds distinct tokens
        assert len({tree.token_list[c] for c in kids}) == len(kids)


def test_proposer_learns_from_every_verified_node_and_respects_max_depth():
    vocab = 12
    proposer = RecycleProposer(RecycleConfig(k=2, budget=16, max_depth=4), RecycleTable(vocab, 2))
    proposer.begin([1, 2])
    first = proposer.propose(
        ProposalContext([1, 2, 3], logits_favouring(vocab, 3, 4), 2, SamplingParams(), 8)
    )
    assert first.token_list == [3] and proposer.table.successors(2) == [3, 4]  # the prefill's logits
    tree = DraftTree.from_branches(3, [[5, 6], [7]])  # nodes 3, 5, 6, 7: every row is written
    logits = torch.stack([logits_favouring(vocab, *pair) for pair in ([5, 7], [6, 0], [8, 9], [10, 11])])
    proposer.observe(VerifyResult([5, 6, 8], [0, 1, 2], logits, tree))
    assert [proposer.table.successors(t) for t in (3, 5, 6, 7)] == [[5, 7], [6, 0], [8, 9], [10, 11]]
    drafted = proposer.propose(ctx_for([1, 2, 3], vocab, max_depth=2))
    assert drafted.max_depth == 2 and drafted.token_list[:3] == [3, 5, 7]


def test_one_table_per_model_and_k_shared_across_builds(default_model):
    default_model.state.clear()
    first = parse_method("recycle").build(default_model)
    second = parse_method("recycle:budget=8").build(default_model)
    other_k = parse_method("recycle:k=4").build(default_model)
    assert first.table is second.table and first.table is not other_k.table
    assert first.table.vocab_size == output_vocab_size(default_model.model) and other_k.table.k == 4
    default_model.state.clear()
    assert parse_method("recycle").build(default_model).table is not first.table


def test_concurrent_updates_and_expansions_keep_rows_whole():
    vocab, k = 64, 4
    table = RecycleTable(vocab, k)
    shape = static_shape(k, 40, 4)
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(200):
            table.update(torch.randint(0, vocab, (8,), generator=gen), torch.randn(8, vocab, generator=gen))

    def reader() -> None:
        try:
            for root in range(200):
                nodes, parents = table.expand(root % vocab, shape)
                tree = DraftTree(torch.tensor(nodes), torch.tensor(parents))
                for kids in tree.children:
                    assert len({nodes[c] for c in kids}) == len(kids)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)] + [
        threading.Thread(target=reader) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


# ------------------------------------------------------------------ on the real model
@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    return prompts_by_category(default_model.tokenizer, spec_bench_subset)


@pytest.mark.slow  # the fast tier's seeded lossless rows (test_lossless) check these tokens are plain sampling's
def test_seeded_sampling_is_reproducible_from_the_same_table_state(engine, default_model, prompts):
    ids = prompts[next(name for name in prompts if name.startswith("translation"))]

    def run(seed: int) -> list[int]:
        config = GenerationConfig(max_new_tokens=16, sampling=SamplingParams(temperature=0.9, seed=seed))
        return engine.generate(ids, fresh_recycle(default_model, RecycleConfig(budget=16)), config).token_ids

    first = run(7)
    assert run(7) == first
    assert run(8) != first
