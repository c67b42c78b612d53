"""TargetModel: tree forward passes and KV compaction agree with plain sequential decoding.

Reference for every node: a fresh, cache-free forward pass over prefix + the
node's root-to-node path; its last row must equal the node's tree logits.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_logits_close, reference_logits, tiny_llama, tiny_qwen2, trees
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.backends.torch.target import TargetModel, head_logits, head_weight
from specdec.models import UnsupportedModelError
from specdec.tree import DraftTree


@pytest.fixture(scope="module", params=["default", "llama", "qwen2"])
def model(request, default_model):
    if request.param == "default":
        return default_model.model
    return tiny_llama() if request.param == "llama" else tiny_qwen2()


@pytest.mark.parametrize("shape", ["root-only", "chain", "wide", "deep", "bushy"])
def test_tree_logits_match_sequential(model, shape):
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (13,), generator=torch.Generator().manual_seed(0)).tolist()
    tree = trees(vocab)[shape]
    target = TargetModel(model)
    target.prefill(prefix)
    logits = target.forward_tree(tree.tokens, tree.parents)
    assert logits.shape == (tree.num_nodes, vocab)
    for node in range(tree.num_nodes):
        expected = reference_logits(model, prefix + tree.path_tokens(node))
        assert_logits_close(logits[node], expected)


@pytest.mark.parametrize("capacity", [256, 4], ids=["roomy", "grows"])
@pytest.mark.parametrize("shape", ["chain", "wide", "deep", "bushy"])
def test_commit_then_continue_equals_fresh_prefill(model, shape, capacity):
    """With capacity 4 the cache doubles during the prefill and again during the trees."""
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    tree = trees(vocab)[shape]
    target = TargetModel(model, capacity=capacity)
    target.prefill(prefix)
    target.forward_tree(tree.tokens, tree.parents)
    deepest = int(tree.depths.argmax())
    path = tree.path(deepest)
    target.commit(path)
    assert target.num_cached == len(prefix) + len(path)
    # Two more steps on top of the compacted cache, one chain and one small tree.
    follow = DraftTree(torch.tensor([3, 4, 5]), torch.tensor([-1, 0, 0]))
    logits = target.forward_tree(follow.tokens, follow.parents)
    committed = prefix + tree.path_tokens(deepest)
    for node in range(follow.num_nodes):
        expected = reference_logits(model, committed + follow.path_tokens(node))
        assert_logits_close(logits[node], expected)
    target.commit([0, 2])
    fresh = TargetModel(model)
    fresh_logits = fresh.prefill(committed + [3, 5, 8])
    assert_logits_close(target.append([8])[-1], fresh_logits)
    # The same cache object serves the next sequence: nothing of this one may leak into it.
    assert_logits_close(target.prefill(prefix), fresh.prefill(prefix))


def test_trim_rolls_back(model):
    target = TargetModel(model)
    target.prefill([1, 2, 3, 4, 5, 6])
    target.trim(4)
    assert target.num_cached == 4
    assert_logits_close(target.append([9])[-1], reference_logits(model, [1, 2, 3, 4, 9]))


def test_protocol_errors(model):
    target = TargetModel(model)
    tree = DraftTree.chain(1, [2])
    with pytest.raises(RuntimeError, match="prefill"):
        target.forward_tree(tree.tokens, tree.parents)
    target.prefill([1, 2, 3])
    with pytest.raises(RuntimeError, match="nothing to commit"):
        target.commit([0])
    target.forward_tree(tree.tokens, tree.parents)
    with pytest.raises(RuntimeError, match="commit"):
        target.forward_tree(tree.tokens, tree.parents)
    with pytest.raises(ValueError, match="root-first"):
        target.commit([1])
    target.commit([0, 1])
    with pytest.raises(ValueError, match="trim"):
        target.trim(99)
    with pytest.raises(ValueError, match="empty"):
        target.prefill([])


def test_sliding_window_model_is_refused():
    with pytest.raises(UnsupportedModelError, match="sliding"):
        TargetModel(tiny_qwen2(sliding=True))


@pytest.mark.parametrize("rows", [1, 2, 7, 40])
def test_head_logits_equal_the_linear_head(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(1000, 64, generator=generator)
    hidden = torch.randn(rows, 64, generator=generator)
    torch.testing.assert_close(head_logits(weight, hidden), hidden @ weight.T, atol=1e-4, rtol=1e-4)


def test_fast_head_only_for_plain_fp32_heads(default_model):
    assert head_weight(default_model.model) is default_model.model.lm_head.weight
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    assert head_weight(LlamaForCausalLM(config).to(torch.bfloat16)) is None
