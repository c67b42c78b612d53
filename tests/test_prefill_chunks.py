"""Chunked prefill (`specdec.engine.batch.Batch`): a prompt that joins running rows is prefilled a chunk per step.

What must hold (each test can fail):
- in fp32 greedy, a row whose prompt was prefilled in chunks between other rows'
  steps emits exactly the tokens of that prompt decoded alone (`Engine.generate`,
  one piece), and the rows it joined do too;
- each step runs at most one chunk: the joining row waits for ceil(L / chunk)
  steps while the running row emits a token in every one of them;
- chunked entries equal the one-piece prefill's up to float rounding;
- a waiting row cancelled between chunks leaves no trace: the prompt prefilled
  after it (on the same staging cache) is still exact;
- a prompt that finds no row decoding is prefilled in one piece (`Engine.generate`
  is never chunked).
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec.backends.contract import PromptFill
from specdec.backends.torch.rows import BatchedTarget
from specdec.engine.generation import GenerationConfig
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.plain import PlainProposer

pytestmark = pytest.mark.slow  # the full tier (make test-all): batched runs with long prompts

CHUNK = 48
ROUNDING = {"atol": 1e-4, "rtol": 1e-4}  # fp32: chunked passes sum in another order (and may use other kernels)
STORY = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle, "
    "describing the sea, the weather, the island, the birds and the ships that pass by. "
)


@pytest.fixture(scope="module")
def prompts(default_model):
    tok = default_model.tokenizer
    short = encode_prompt(tok, "Name three colors of the rainbow.", chat=True)
    long = encode_prompt(tok, STORY * 6 + "Begin the story now.", chat=True)
    other = encode_prompt(tok, "Count from one to twenty: one, two, three,", chat=False)
    assert len(long) > 4 * CHUNK
    return short, long, other


@pytest.mark.parametrize("method", ["plain", "logitspec"])
def test_a_chunked_row_and_the_rows_it_joined_equal_their_prompts_alone(engine, default_model, prompts, method):
    _, long, _ = prompts
    # a request with a long answer: a short one (18 tokens to its end) finished during the fill when
    # logitspec accepted well, and the check below needs the running row still decoding
    story = encode_prompt(default_model.tokenizer, "Tell me a long story about a dragon.", chat=True)
    running_config, joining_config = GenerationConfig(max_new_tokens=80), GenerationConfig(max_new_tokens=10)
    expected_running = engine.generate(story, parse_method(method).build(default_model), running_config)
    expected_joining = engine.generate(long, parse_method(method).build(default_model), joining_config)

    batch = engine.batch(None, max_batch=2, prefill_chunk=CHUNK)
    running = batch.add(story, parse_method(method).build(default_model), running_config)
    batch.step()
    joining = batch.add(long, parse_method(method).build(default_model), joining_config)
    assert joining.fill is not None and joining in batch.waiting and not joining.tokens
    steps_waiting = 0
    while joining.fill is not None:
        emitted = len(running.tokens)
        batch.step()
        steps_waiting += 1
        assert not running.finished
        assert len(running.tokens) > emitted  # the running row decoded in the same step
    assert steps_waiting == math.ceil(len(long) / CHUNK)
    batch.run()
    assert joining.output.token_ids == expected_joining.token_ids
    assert running.output.token_ids == expected_running.token_ids
    assert len(expected_running.token_ids) == 80  # it never came near its end while the other row waited


def test_chunked_entries_equal_one_piece_entries(default_model, engine, prompts):
    _, long, _ = prompts
    whole, chunked = BatchedTarget(engine.target), BatchedTarget(engine.target)
    _, logits, _ = whole.add(long)
    fill = PromptFill(long)
    results = [chunked.fill(fill, CHUNK) for _ in range(math.ceil(len(long) / CHUNK))]
    assert all(r is None for r in results[:-1]) and results[-1] is not None
    assert chunked.lengths == whole.lengths == [len(long)]
    torch.testing.assert_close(results[-1][1], logits, **ROUNDING)
    for mine, theirs in zip(chunked.cache.layers, whole.cache.layers, strict=True):
        torch.testing.assert_close(mine._keys[0, :, : len(long)], theirs._keys[0, :, : len(long)], **ROUNDING)
        torch.testing.assert_close(mine._values[0, :, : len(long)], theirs._values[0, :, : len(long)], **ROUNDING)


def test_a_waiting_row_cancelled_between_chunks_leaves_no_trace(engine, prompts):
    short, long, other = prompts
    config = GenerationConfig(max_new_tokens=10)
    expected = engine.generate(other * 8, PlainProposer(), config).token_ids
    batch = engine.batch(None, max_batch=3, prefill_chunk=CHUNK)
    running = batch.add(short, PlainProposer(), GenerationConfig(max_new_tokens=60))
    doomed = batch.add(long, PlainProposer(), config)
    later = batch.add(other * 8, PlainProposer(), config)
    batch.step()
    batch.step()
    assert doomed.fill is not None and doomed.fill.done == 2 * CHUNK
    batch.cancel(doomed)
    assert doomed not in batch.active
    batch.run()
    assert doomed.cancelled and doomed.output is None
    assert later.output.token_ids == expected
    assert running.output is not None


def test_a_prompt_alone_is_prefilled_in_one_piece(engine, prompts):
    _, long, _ = prompts
    batch = engine.batch(None, max_batch=2, prefill_chunk=CHUNK)
    row = batch.add(long, PlainProposer(), GenerationConfig(max_new_tokens=3))
    assert row.fill is None and row in batch.rows and len(row.tokens) == len(long) + 1
    with pytest.raises(ValueError, match="prefill_chunk"):
        engine.batch(None, prefill_chunk=0)
