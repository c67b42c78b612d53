"""Attention chosen per pass shape: the plan's buckets, exact tree logits under either
implementation, the model handed back as it was, and the measured plan's cache."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_logits_close, reference_logits, tiny_llama, tiny_qwen2, trees

from specdec.backends.torch.attention import AttentionPlan, load_or_measure_plan, resolve_plan
from specdec.backends.torch.target import TargetModel
from specdec.models import LoadedModel

PLAN = AttentionPlan((128, 512), (1, 16), (("sdpa", "eager"), ("eager", "sdpa")))


def test_plan_picks_the_bucket_at_or_above_the_shape():
    assert PLAN.choose(0, 1) == "sdpa"
    assert PLAN.choose(128, 2) == "eager"  # sizes bucket 16
    assert PLAN.choose(129, 1) == "eager"  # context bucket 512
    assert PLAN.choose(10_000, 16) == "sdpa"  # beyond the largest context: the largest bucket
    assert PLAN.choose(10_000, 17) == "sdpa"  # larger than any measured tree (a prefill): SDPA
    with pytest.raises(ValueError):
        AttentionPlan((128,), (1,), (("flash",),))
    with pytest.raises(ValueError):
        AttentionPlan((128, 512), (1,), (("sdpa",),))


def test_resolve_plan_by_name(default_model):
    assert resolve_plan(default_model, "eager").choose(5000, 3) == "eager"
    assert resolve_plan(default_model, PLAN) is PLAN
    with pytest.raises(ValueError, match="attention must be"):
        resolve_plan(default_model, "flash")


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_tree_logits_are_exact_under_either_implementation(make, impl):
    model = make()
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (140,), generator=torch.Generator().manual_seed(2)).tolist()
    plan = AttentionPlan((64,), (64,), ((impl,),))
    target = TargetModel(model, attention=plan)
    for shape in ("chain", "bushy"):
        tree = trees(vocab)[shape]
        target.prefill(prefix)
        logits = target.forward_tree(tree.tokens, tree.parents)
        assert model.config._attn_implementation == "sdpa"  # handed back as it was
        for node in range(tree.num_nodes):
            expected = reference_logits(model, prefix + tree.path_tokens(node))
            assert_logits_close(logits[node], expected)


def test_measured_plan_is_cached_unless_busy(default_model, tmp_path):
    loaded = LoadedModel(tiny_llama(), default_model.tokenizer, "tiny-llama")
    busy = load_or_measure_plan(loaded, tmp_path, is_busy=lambda share: True)
    assert list(tmp_path.glob("*.json")) == []
    first = load_or_measure_plan(loaded, tmp_path, is_busy=lambda share: False)
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert load_or_measure_plan(loaded, tmp_path, is_busy=lambda share: True) == first  # read back, not timed
    assert len(busy.choices) == len(first.choices)
    assert loaded.model.config._attn_implementation == "sdpa"


def test_attention_as_switches_every_layer_and_hands_back():
    """The switch reaches every attention module, the first time (checked by transformers) and after."""
    model = tiny_llama()
    target = TargetModel(model)
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "config")]
    assert layers
    for _ in range(2):
        with target.attention_as("eager"):
            assert {m.config._attn_implementation for m in layers} == {"eager"}
        assert {m.config._attn_implementation for m in layers} == {"sdpa"}
    with pytest.raises((ValueError, ImportError)):  # one this model cannot run is refused, not set
        with target.attention_as("flash_attention_2"):
            pass
    assert model.config._attn_implementation == "sdpa"
