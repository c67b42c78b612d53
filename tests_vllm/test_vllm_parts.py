"""The engine-free parts of specdec.integrations: options channel, logits row layout, chain choice."""

from __future__ import annotations

import json

import pytest

from specdec.integrations.chain import chain_prior, choose_chain, learn
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
        ({"SPECDEC_VLLM_K": "many"}, "SPECDEC_VLLM_K: option 'k' must be a int"),
        ({"SPECDEC_VLLM_PREFER": "newest"}, "prefer must be one of"),
        ({"SPECDEC_VLLM_NODE_COST": "1.5"}, "node_cost must be in [0, 1)"),
        ({CONFIG_ENV: "/no/such/options.json"}, "cannot read a JSON object"),
    ],
)
def test_bad_options_stop_the_build(environ, message):
    with pytest.raises(ValueError) as error:
        read_options(LogitSpecOptions, environ)
    assert message in str(error.value)


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
