"""Limits the engine must hold whatever a proposer drafts: the model's context
(`max_position_embeddings`) bounds every tree position and every emitted token;
a model without such a limit (0) decodes to max_new_tokens; retrieval with
n-grams longer than LogitSpec's priors (max_ngram > 3) stays lossless."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import LoadedModel
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

CONTEXT = 48
METHODS = ["plain", "pld", "logitspec", "lookahead", "logitspec:adaptive=false"]


def tiny_loaded(default_model: LoadedModel, max_position_embeddings: int) -> LoadedModel:
    """A random 2-layer llama with the bundled tokenizer's vocabulary and a short context."""
    config = LlamaConfig(
        vocab_size=len(default_model.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    return LoadedModel(model=model, tokenizer=default_model.tokenizer, name="tiny-llama")


@pytest.fixture(scope="module")
def short_context(default_model):
    loaded = tiny_loaded(default_model, CONTEXT)
    seen: list[int] = []

    def record_positions(module, args, kwargs):
        positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        seen.append(int(positions.max()))

    # Every position, prefill included, passes through the rotary embedding.
    loaded.model.model.rotary_emb.register_forward_pre_hook(record_positions, with_kwargs=True)
    return loaded, seen


@pytest.mark.parametrize("method", METHODS)
def test_positions_and_tokens_stay_inside_the_context(short_context, method):
    loaded, seen = short_context
    engine = Engine(loaded)
    # A repetitive prompt: retrieval drafts long chains right up to the context limit.
    prompt_ids = [101, 102, 103, 104, 105] * 4
    config = GenerationConfig(max_new_tokens=200, ignore_eos=True)
    plain = engine.generate(prompt_ids, parse_method("plain").build(loaded), config)
    seen.clear()
    out = engine.generate(prompt_ids, parse_method(method).build(loaded), config)
    assert len(prompt_ids) + len(out.token_ids) == CONTEXT
    assert out.finish_reason == "length"
    assert out.token_ids == plain.token_ids
    assert seen and max(seen) <= CONTEXT - 1


def test_no_context_limit_decodes_to_max_new_tokens(default_model):
    loaded = tiny_loaded(default_model, 64)
    loaded.model.config.max_position_embeddings = 0  # a config that states no limit
    engine = Engine(loaded)
    assert engine.target.max_length == 0
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    for method in ("plain", "pld"):
        out = engine.generate([7, 8, 9, 7, 8], parse_method(method).build(loaded), config)
        assert len(out.token_ids) == 12


@pytest.mark.slow
def test_logitspec_with_long_ngrams_is_lossless(engine, default_model):
    text = "the quick brown fox jumps over the lazy dog. " * 6 + "Repeat the sentence above three times."
    prompt_ids = encode_prompt(default_model.tokenizer, text, chat=True)
    config = GenerationConfig(max_new_tokens=48)
    plain = engine.generate(prompt_ids, parse_method("plain").build(default_model), config)
    for spec in ("logitspec:max_ngram=5", "logitspec:max_ngram=6,adaptive=false", "pld:max_ngram=5"):
        out = engine.generate(prompt_ids, parse_method(spec).build(default_model), config)
        assert out.token_ids == plain.token_ids, spec
        assert out.stats.mat > 1.0, spec  # the repeated text was drafted and accepted
