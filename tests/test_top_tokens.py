"""The drafting top-k (specdec.backends.torch.top_tokens, csrc/top_tokens.cpp): torch.topk's scores, best
first, equal scores in order of id, NaN never taken; torch.topk itself where the extension is not loaded.
`argmax_rows`, greedy acceptance's argmax from the same kernel, against torch.argmax and numpy's."""

from __future__ import annotations

import pytest
import torch

from specdec.backends.torch import top_tokens as module
from specdec.backends.torch.top_tokens import argmax_rows, top_tokens
from specdec.engine.accept import accept_greedy
from specdec.kernels import q4_kernel
from specdec.tree import DraftTree


@pytest.fixture(scope="module", autouse=True)
def extension():
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "vocab", "k"), [(5, 49152, 8), (1, 49152, 60), (3, 1000, 17), (2, 37, 37), (4, 5, 0)])
def test_the_best_scores_best_first(dtype, rows, vocab, k):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab + k)).to(dtype)
    ids = top_tokens(logits, k)
    assert ids.shape == (rows, k) and ids.dtype == torch.int64
    expected = torch.topk(logits.float(), k, dim=-1).values
    assert torch.equal(torch.gather(logits, 1, ids).float(), expected)
    assert torch.equal(top_tokens(logits[0], k), ids[0])  # one row, 1-D
    for r in range(rows):  # a row's ids do not depend on the rows beside it
        assert torch.equal(top_tokens(logits[r : r + 1], k), ids[r : r + 1])


def test_equal_scores_go_in_order_of_id_and_nan_is_never_taken():
    logits = torch.zeros(1, 100)
    logits[0, [90, 7, 33, 64]] = 2.0  # four ties for the best, then ties at 0
    logits[0, 50] = float("nan")
    assert top_tokens(logits, 6).tolist() == [[7, 33, 64, 90, 0, 1]]
    few = torch.full((1, 20), float("nan"))
    few[0, 3] = 1.0
    assert top_tokens(few, 2).tolist() == [[3, -1]]  # fewer than k numbers: -1 fills the rest


def test_without_the_extension_it_is_torch_topk(monkeypatch):
    monkeypatch.setattr(module.q4_kernel, "is_loaded", lambda: False)
    logits = torch.randn(3, 300)
    assert torch.equal(top_tokens(logits, 9), torch.topk(logits, 9, dim=-1).indices)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_argmax_rows_is_torch_argmax_ties_to_the_lowest_id(dtype):
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(3)).to(dtype)
    logits[2, [40000, 9, 700]] = 50.0  # three ties for the best: the lowest id wins, as in torch.argmax
    expected = logits.float().argmax(-1).tolist()
    assert argmax_rows(logits) == expected and expected[2] == 9
    assert [int(row.float().numpy().argmax()) for row in logits] == expected
    few = torch.full((2, 20), float("nan"), dtype=dtype)
    few[0, 3] = 1.0
    assert argmax_rows(few) is None  # a row without a number: the caller reduces its rows itself


def test_greedy_acceptance_reads_the_same_tokens_with_and_without_the_kernel(monkeypatch):
    data = torch.Generator().manual_seed(5)
    tree = DraftTree.from_branches(7, [[1, 2, 3], [4, 5], [4, 6]])
    for dtype in (torch.bfloat16, torch.float32):
        for _ in range(20):
            logits = torch.randn(tree.num_nodes, 300, generator=data).to(dtype)
            # a row whose argmax is the drafted child, so walks go deep
            logits[0, 4], logits[4, 6] = 9.0, 9.0  # nodes 4 and 6 hold tokens 4 and 6
            assert argmax_rows(logits) is not None
            with_kernel = accept_greedy(tree, logits)
            with monkeypatch.context() as patch:
                patch.setattr(module.q4_kernel, "is_loaded", lambda: False)
                without = accept_greedy(tree, logits)
            assert (with_kernel.path, with_kernel.tokens) == (without.path, without.tokens)
            assert with_kernel.tokens == [int(logits[node].float().argmax()) for node in with_kernel.path]
            assert with_kernel.path == [0, 4, 6]


def _random_tree(data: torch.Generator, nodes: int, vocab: int) -> DraftTree:
    """A tree of `nodes` nodes with random parents and tokens; siblings may repeat a token (the first wins)."""
    parents = [-1] + [int(torch.randint(0, node, (1,), generator=data)) for node in range(1, nodes)]
    tokens = torch.randint(0, vocab, (nodes,), generator=data)
    return DraftTree(tokens, torch.tensor(parents))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_walk_in_one_call_is_the_python_walk(monkeypatch, dtype):
    """`greedy_walk` against accept_greedy's own walk (a row at a time) on random trees whose rows often
    point at a child, duplicate siblings and a view into a wider pass's logits included."""
    data = torch.Generator().manual_seed(11)
    vocab, deep = 1000, 0
    for trial in range(200):
        tree = _random_tree(data, int(torch.randint(1, 24, (1,), generator=data)), 6)
        wide = torch.randn(tree.num_nodes + 3, vocab, generator=data).to(dtype)
        logits = wide[: tree.num_nodes]  # as a pass's row b hands it on: a view
        for node, kids in enumerate(tree.children):  # most rows' argmax is one of the node's children
            if kids and trial % 5:
                logits[node, tree.token_list[kids[int(torch.randint(0, len(kids), (1,), generator=data))]]] = 9.0
        walked = module.greedy_walk(logits, tree.token_list, tree.parent_list)
        assert walked is not None
        with monkeypatch.context() as patch:
            patch.setattr(module.q4_kernel, "is_loaded", lambda: False)
            python = accept_greedy(tree, logits)
        assert walked == (python.path, python.tokens)
        kernel = accept_greedy(tree, logits)  # the rule itself takes the one call
        assert (kernel.path, kernel.tokens) == walked
        deep += len(python.path) > 2
    assert deep > 50  # the walks went below the first level often


def test_the_walk_leaves_a_row_without_a_number_to_the_caller():
    tree = DraftTree.chain(1, [2])
    logits = torch.zeros(2, 10)
    logits[0, 2] = 1.0
    logits[1] = float("nan")
    assert module.greedy_walk(logits, tree.token_list, tree.parent_list) is None
    assert module.greedy_walk(logits[:1], [1], [-1]) == ([0], [2])
    with pytest.raises(RuntimeError, match="one token and one parent"):
        torch.ops.specdec_top.greedy_walk(logits, [1], [-1])
