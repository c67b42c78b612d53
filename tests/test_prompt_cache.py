"""Whole-prompt prefills kept by exact ids (`specdec.backends.torch.prompt_cache`) and taken by a row again.

What must hold: a row that takes its prompt from the cache gets the very bits a fresh prefill gives
(entries, logits, features); a prompt prefilled in chunks neither takes nor leaves an entry; another set
of captured layers is another entry; the budget evicts the least recently used and keeps nothing larger
than itself.
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_llama

from specdec.backends.contract import PromptFill
from specdec.backends.torch.prompt_cache import Prefilled, PromptCache
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.proposers import parse_method

PROMPT = [7, 3, 99, 12, 45, 45, 45, 300, 2, 18, 77, 5]


def _row(rows: BatchedTarget, row: int) -> torch.Tensor:
    length = rows.lengths[row]
    return torch.stack([torch.cat([layer._keys[row, :, :length], layer._values[row, :, :length]])
                        for layer in rows.cache.layers])


def test_a_cached_prompt_joins_with_the_bits_of_a_fresh_prefill():
    rows = BatchedTarget(TargetModel(tiny_llama()))
    rows.capture = (1,)
    first_slot, first_logits, first_features = rows.add(PROMPT)
    assert len(rows.prompts) == 1 and rows.prompts.hits == 0
    second_slot, second_logits, second_features = rows.add(PROMPT)
    assert rows.prompts.hits == 1 and (first_slot, second_slot) == (0, 1)
    assert torch.equal(second_logits, first_logits) and torch.equal(second_features, first_features)
    assert torch.equal(_row(rows, 1), _row(rows, 0))
    fresh = BatchedTarget(TargetModel(rows.single.model), prompt_bytes=0)
    fresh.capture = (1,)
    _, logits, _ = fresh.add(PROMPT)
    assert len(fresh.prompts) == 0 and torch.equal(logits, first_logits)
    assert torch.equal(_row(fresh, 0), _row(rows, 1))


def test_chunked_prompts_and_other_layers_are_other_entries():
    rows = BatchedTarget(TargetModel(tiny_llama()))
    fill = PromptFill(PROMPT)
    assert rows.fill(fill, 5) is None and rows.fill(fill, 5) is None
    assert rows.fill(fill, 5) is not None and len(rows.prompts) == 0  # chunked: not kept
    rows.add(PROMPT)
    rows.capture = (0, 2)
    rows.add(PROMPT)  # other captured layers: prefilled again
    assert len(rows.prompts) == 2 and rows.prompts.hits == 0
    chunked = PromptFill(PROMPT)
    assert rows.fill(chunked, 4) is None and rows.prompts.hits == 0  # chunked: not taken either


def _entry(tokens: int) -> Prefilled:
    return Prefilled(((torch.zeros(1, tokens, 4), torch.zeros(1, tokens, 4)),), torch.zeros(4), None)


def test_the_budget_evicts_the_least_recently_used():
    size = _entry(8).nbytes
    cache = PromptCache(max_bytes=2 * size)
    cache.put(((1,), ()), _entry(8))
    cache.put(((2,), ()), _entry(8))
    assert cache.get(((1,), ())) is not None  # now the most recently used
    cache.put(((3,), ()), _entry(8))
    assert cache.get(((2,), ())) is None and cache.get(((1,), ())) is not None and len(cache) == 2
    cache.put(((4,), ()), _entry(100))  # larger than the whole budget: never kept
    assert cache.get(((4,), ())) is None and cache.nbytes == 2 * size
    nothing = PromptCache(max_bytes=0)
    nothing.put(((1,), ()), _entry(1))
    assert len(nothing) == 0
    with pytest.raises(ValueError):
        PromptCache(max_bytes=-1)


def test_the_same_prompt_again_decodes_the_same_text(default_model, engine):
    prompt = default_model.tokenizer("Name three rivers of Europe.").input_ids
    config = GenerationConfig(max_new_tokens=12)
    fresh = Engine(default_model)
    outs = [fresh.generate(prompt, parse_method(m).build(default_model), config) for m in ("plain", "pld", "plain")]
    assert outs[0].token_ids == outs[1].token_ids == outs[2].token_ids
    assert fresh._solo.target.prompts.hits == 2


def test_an_engine_that_keeps_no_prompts_prefills_every_request(default_model):
    prompt = default_model.tokenizer("Name three rivers of Europe.").input_ids
    config = GenerationConfig(max_new_tokens=4)
    paying = Engine(default_model, keep_prompts=False)
    outs = [paying.generate(prompt, parse_method(m).build(default_model), config) for m in ("plain", "pld")]
    assert outs[0].token_ids == outs[1].token_ids
    assert (paying._solo.target.prompts.hits, len(paying._solo.target.prompts)) == (0, 0)
