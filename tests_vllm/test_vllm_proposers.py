"""Our proposers inside vLLM's CPU build: lossless greedy output, really speculating, vLLM's layout unchanged.

The engines run once per session (conftest.runs): plain decoding and each
proposer, fp32, bundled model, 8 Spec-Bench prompts of every category in one batch.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NUM_PROMPTS, NUM_SPECULATIVE_TOKENS, PROPOSERS


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_output_equals_plain_decoding(runs, proposer):
    plain, spec = runs[None], runs[proposer]
    assert len(plain.outputs) == NUM_PROMPTS and all(plain.outputs)
    assert spec.proposer["class"] == proposer
    for i, (expected, got) in enumerate(zip(plain.outputs, spec.outputs, strict=True)):
        assert got == expected, f"prompt {i}: {proposer} diverged from plain decoding"
    assert spec.short_output == plain.short_output


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_proposer_drafts_per_request_and_vllm_accepts(runs, proposer):
    state = runs[proposer].proposer
    counters = state["counters"]
    assert counters["errors"] == 0
    assert state["runner_found"], "vLLM's model runner was not found: request ids and logits rows are unavailable"
    assert counters["drafted"] > 0 and counters["accepted"] > 0, counters
    assert 0 < counters["propose_s"] < 60, counters  # timed: the per-step cost of drafting is measurable
    # States are keyed by vLLM request id; the batch's requests were dropped once they left.
    assert len(state["request_keys"]) <= 1 and all(isinstance(key, str) for key in state["request_keys"])


def test_logitspec_reads_the_logits_rows_vllm_sampled_from(runs):
    """Fails loudly if vLLM's layout of the logits rows changes: for greedy requests, the token emitted is a maximum of its row."""
    counters = runs["LogitSpecProposer"].proposer["counters"]
    assert counters["layout_missing"] == 0, "no logits tensor had the expected number of rows"
    assert counters["layout_checked"] >= NUM_PROMPTS
    assert counters["layout_mismatched"] == 0, counters
    assert counters["cost_steps"] > 0, counters  # decode steps were timed for the draft price


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_empty_and_one_token_contexts_get_no_draft(runs, proposer):
    import specdec.integrations.vllm as integration

    fresh = getattr(integration, proposer)(runs[proposer].vllm_config)  # no runner: rows are the keys
    tokens = np.zeros((4, 16), dtype=np.int32)
    tokens[2, :2] = [5, 6]
    tokens[3, :1] = [7]
    assert fresh.propose([], np.zeros(0, dtype=np.int32), tokens) == []
    # an empty row, a partial prefill (nothing emitted), a 1-token context, another 1-token context
    sampled = [[], [], [7], [7]]
    assert fresh.propose(sampled, np.array([0, 2, 1, 1], dtype=np.int32), tokens) == [[], [], [], []]
    drafts = fresh.propose([[6]], np.array([2], dtype=np.int32), tokens[2:3])  # 2 tokens: a context at last
    assert len(drafts) == 1 and len(drafts[0]) <= NUM_SPECULATIVE_TOKENS
    assert fresh.counters["errors"] == 0
