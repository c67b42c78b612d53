"""Prompt lookup as the draft's lookahead (`draft:jump=N`, specdec.proposers.draft_jump), default model (fp32).

The distribution test with `jump` sits beside the draft's own in tests/test_draft.py; here: greedy
identity on Spec-Bench prompts of every category, that the chains are the draft's own (only its
passes change), and the lookup's rule itself.
"""

from __future__ import annotations

import pytest

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.prompts import encode_prompt
from specdec.proposers import MethodError, parse_method
from specdec.proposers.draft import DraftConfig
from specdec.proposers.draft_jump import RetrievalJump
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow  # the full tier (make test-all): draft-model runs on the real model

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset, per_category=1)
    return [encode_prompt(default_model.tokenizer, q.turns[0], chat=True) for q in questions]


def test_jump_keeps_the_drafts_chains_and_saves_its_passes(engine, default_model, small_draft, prompts):
    """Same chains (so the same target passes and accepted tokens), fewer draft passes; greedy and seeded
    sampling alike (the copied span's pass gives the same rows the one-token passes would)."""
    summarization = prompts[2]
    for sampling in (SamplingParams(), SamplingParams(temperature=0.7, seed=5)):
        outs, passes = [], []
        for jump in (0, 1):
            proposer = DraftConfig(k=6, adaptive=False, jump=jump).build_with(default_model, small_draft)
            outs.append(engine.generate(summarization, proposer, GenerationConfig(NEW_TOKENS, sampling)))
            passes.append(proposer.num_passes)
        assert outs[0].token_ids == outs[1].token_ids
        assert outs[0].stats.num_forward_passes == outs[1].stats.num_forward_passes
        assert passes[1] < passes[0], passes


def test_lookup_copies_only_where_the_draft_agrees():
    jump = RetrievalJump(1, length=3, eos_token_ids=[99])
    jump.sync([1, 2, 3, 4, 1, 2])
    assert jump.after([3], room=10) == [4, 1, 2]  # "2" -> 3 agrees: copy what followed
    assert jump.after([7], room=10) == []  # the draft disagrees with the text
    assert jump.after([3], room=1) == [4]
    assert jump.after([3, 4], room=10) == [1, 2, 3]  # "... 2 3" -> 4 agrees, continued periodically
    strict = RetrievalJump(3, length=3)
    strict.sync([1, 2, 3, 4, 1, 2])
    assert strict.after([3], room=10) == []  # only a 2-token match ("1 2"): below min_ngram
    assert strict.after([3, 4], room=10) == [1, 2, 3]  # "1 2 3" matched
    jump.sync([5, 99, 6, 5])
    assert jump.after([99], room=10) == []  # the draft's token ends the text: nothing follows it
    jump.sync([5, 6, 99, 7, 5])
    assert jump.after([6], room=10) == [99]  # cut after the end-of-sequence token


def test_options_are_validated():
    for bad in ("jump=4", "jump=-1", "jump=1,jump_length=0"):
        with pytest.raises(MethodError, match="jump"):
            parse_method(f"draft:draft_model=x,{bad}")
    assert parse_method("draft:draft_model=x,jump=2").jump == 2

