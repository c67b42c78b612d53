"""The drafting top-k (specdec.backends.torch.top_tokens, csrc/top_tokens.cpp): torch.topk's scores, best
first, equal scores in order of id, NaN never taken; torch.topk itself where the extension is not loaded."""

from __future__ import annotations

import pytest
import torch

from specdec.backends.torch import q4_kernel
from specdec.backends.torch import top_tokens as module
from specdec.backends.torch.top_tokens import top_tokens


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
