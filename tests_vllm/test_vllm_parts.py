"""The engine-free parts of specdec.integrations: options channel, logits row layout, chain choice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec.integrations.chain import chain_prior, choose_chain, learn, retrieve_chain
from specdec.integrations.step_cost import StepCost
from specdec.integrations.vllm_options import (
    CONFIG_ENV,
    LogitSpecOptions,
    PromptLookupOptions,
    read_options,
)
from specdec.integrations.vllm_runner import root_rows
from specdec.proposers.budget import AcceptanceStats
from specdec.proposers.logitspec import Retrieval


def test_options_file_then_environment_then_defaults(tmp_path):
    path = tmp_path / "options.json"
    path.write_text(json.dumps({"k": 30, "node_cost": 0, "min_ngram": 2, "prefer": "earliest"}))
    environ = {CONFIG_ENV: str(path), "SPECDEC_VLLM_K": "12", "SPECDEC_VLLM_MAX_NGRAM": "4"}
    assert read_options(LogitSpecOptions, environ) == LogitSpecOptions(12, 4, "earliest", 0.0)
    assert read_options(PromptLookupOptions, environ) == PromptLookupOptions(4, 2, "earliest")
    assert read_options(LogitSpecOptions, {}) == LogitSpecOptions()


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"SPECDEC_VLLM_K": "many"}, "SPECDEC_VLLM_K: logitspec: option k must be an integer"),
        ({"SPECDEC_VLLM_PREFER": "newest"}, "prefer must be one of"),
        ({"SPECDEC_VLLM_NODE_COST": "1.5"}, "node_cost must be in [0, 1)"),
        ({"SPECDEC_VLLM_MEASURE_COST": "maybe"}, "option measure_cost must be true or false"),
        ({CONFIG_ENV: "/no/such/options.json"}, "cannot read a JSON object"),
    ],
)
def test_bad_options_stop_the_build(environ, message):
    with pytest.raises(ValueError) as error:
        read_options(LogitSpecOptions, environ)
    assert message in str(error.value)


def test_boolean_options_read_words_not_truthiness(tmp_path):
    assert read_options(LogitSpecOptions, {"SPECDEC_VLLM_MEASURE_COST": "false"}).measure_cost is False
    assert read_options(LogitSpecOptions, {"SPECDEC_VLLM_MEASURE_COST": "0"}).measure_cost is False
    path = tmp_path / "options.json"
    path.write_text(json.dumps({"measure_cost": False}))
    assert read_options(LogitSpecOptions, {CONFIG_ENV: str(path), "SPECDEC_VLLM_MEASURE_COST": "yes"}).measure_cost


def test_unknown_option_in_the_file_is_an_error(tmp_path):
    path = tmp_path / "options.json"
    path.write_text(json.dumps({"kk": 3}))
    with pytest.raises(ValueError, match=r"unknown options \['kk'\]"):
        read_options(PromptLookupOptions, {CONFIG_ENV: str(path)})


def test_root_rows_follow_vllms_layout():
    # vLLM's own example (_calc_spec_decode_metadata): drafts [3, 0, 2, 0, 1] -> 4, 1, 3, 1, 2 rows.
    assert root_rows([3, 0, 2, 0, 1], [2, 1, 3, 0, 1]) == [1, 4, 7, -1, 9]
    assert root_rows([0, 0], [1, 1]) == [0, 1]


def _retrieval(root_branch, root_ngram, cands):
    """A retrieval as `logitspec.retrieve` returns it; cands: (token, rank, continuation, m) per candidate."""
    tokens, ranks, conts, ngrams = ([list(c) for c in zip(*cands, strict=True)] if cands else [[], [], [], []])
    extra = {"top": []} if "top" in Retrieval.__dataclass_fields__ else {}  # the top-k list, unused by chains
    return Retrieval(root_branch, root_ngram, tokens, ranks, conts, ngrams, **extra)


def test_chain_is_the_best_paying_branch_prefix():
    stats = AcceptanceStats(chain_prior(k=4))
    retrieval = _retrieval([10, 11, 12], 3, [(20, 0, [21, 22], 2), (30, 1, [], 0)])
    # Priors: root tokens 1/2 each (0.5, 0.25, 0.125); a candidate 1/5 then halves.
    assert choose_chain(retrieval, stats, 0, 5, 0.1) == [10, 11, 12]
    assert choose_chain(retrieval, stats, 0, 2, 0.1) == [10, 11]
    assert choose_chain(retrieval, stats, 0, 5, 0.3) == [10]
    assert choose_chain(_retrieval([], 0, [(20, 0, [21, 22], 2)]), stats, 0, 5, 0.05) == [20, 21]
    assert choose_chain(_retrieval([], 0, []), stats, 0, 5, 0.0) == []


def test_learning_moves_the_choice_to_what_was_emitted():
    stats = AcceptanceStats(chain_prior(k=4))
    retrieval = _retrieval([10, 11], 1, [(20, 0, [21, 22], 2)])
    for _ in range(20):  # the candidate's branch is what the model keeps writing; the root branch never
        learn(stats, retrieval, 0, [20, 21, 22, 5])
    assert stats.rate(("root", 1, 0, 1)) < 0.1 and stats.rate(("cand", 1, 2)) > 0.8
    assert choose_chain(retrieval, stats, 0, 5, 0.05) == [20, 21, 22]


def test_step_cost_finds_the_price_of_a_carried_token():
    """Steps of 40 ms + 2 ms per carried token, +-10% noise, 2 tokens emitted per step."""
    rng = np.random.default_rng(0)
    cost = StepCost(min_steps=30)
    for step in range(200):
        tokens = int(rng.integers(1, 7))
        cost.observe(tokens, (0.040 + 0.002 * tokens) * rng.uniform(0.9, 1.1), emitted=2)
        if step < 29:
            assert cost.price() is None  # too few steps: the caller keeps its configured price
    assert abs(cost.per_token() - 0.002) < 0.0007
    # 2 tokens per ~47 ms step: ~42.5 tokens/s; one more carried token's 2 ms would have produced ~0.085
    assert 0.055 < cost.price() < 0.115


def test_step_cost_needs_spread_and_ignores_idle_gaps():
    cost = StepCost(min_steps=5)
    for _ in range(50):
        cost.observe(6, 0.05, emitted=3)  # always the same tokens carried: no slope to read
    assert cost.per_token() is None and cost.price() is None
    cost.observe(1, 60.0, emitted=1)  # the engine idled between two generate calls: not a step
    assert cost.steps == 50
    for tokens in (1, 6) * 20:  # more tokens, no more time: drafts are free; the price is zero, never negative
        cost.observe(tokens, 0.05 - 0.001 * tokens, emitted=2)
    assert cost.price() == 0.0


def test_retrieve_chain_picks_what_the_full_retrieval_would_and_looks_up_less():
    """On repetitive random text, with rates learned as the proposer learns them, at several prices."""
    import torch

    from specdec.proposers.logitspec import retrieve
    from specdec.proposers.ngram_index import NGramIndex

    rng = np.random.default_rng(1)
    phrases = [list(rng.integers(0, 40, size=int(rng.integers(3, 9)))) for _ in range(12)]
    text: list[int] = []
    while len(text) < 600:  # phrases repeat, with random tokens between them: partial, uncertain matches
        text += phrases[int(rng.integers(len(phrases)))] + list(rng.integers(0, 40, size=int(rng.integers(0, 3))))
    text = [int(t) for t in text]
    index = NGramIndex(3, "latest")
    stats = AcceptanceStats(chain_prior(k=20))
    generator = torch.Generator().manual_seed(0)
    looked_up = full = 0
    for end in range(50, len(text) - 6):
        index.extend(text[len(index) : end])
        logits = torch.randn(40, generator=generator)
        logits[text[end]] += 3.0  # the true next-next token is often among the top candidates
        reference = retrieve(index, index.tokens, logits, 20, 5, 4, True)
        for price in (0.0, 0.03, 0.2):
            retrieval, chain = retrieve_chain(index, logits, 20, 5, stats, 1, price)
            assert chain == choose_chain(reference, stats, 1, 5, price), (end, price)
            assert set(retrieval.cand_tokens) <= set(reference.cand_tokens)
        looked_up, full = looked_up + len(retrieval.cand_tokens), full + len(reference.cand_tokens)
        learn(stats, reference, 1, text[end : end + 6])
    assert looked_up < full / 2, (looked_up, full)  # most candidates could not win: not looked up
