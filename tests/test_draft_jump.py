"""Prompt lookup inside a draft chain (`draft:jump=N`, specdec.proposers.draft_jump) on the default model (fp32).

The distribution test for sampling with copied (point-mass) tokens sits beside the draft's own in
tests/test_draft.py; here: greedy identity on Spec-Bench prompts of every category, that copying
does happen where the output repeats the prompt, and the lookup's rule itself.
"""

from __future__ import annotations

import pytest

from specdec.data import load_questions
from specdec.engine import GenerationConfig
from specdec.prompts import encode_prompt
from specdec.proposers import MethodError, parse_method
from specdec.proposers.draft import DraftConfig
from specdec.proposers.draft_jump import RetrievalJump
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset, per_category=1)
    return [encode_prompt(default_model.tokenizer, q.turns[0], chat=True) for q in questions]


@pytest.mark.parametrize("options", [dict(jump=1, k=3, adaptive=False), dict(jump=2)], ids=["fixed", "timed"])
def test_greedy_is_token_identical_in_every_category(engine, default_model, small_draft, prompts, options):
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    copied = 0
    for prompt in prompts:
        proposer = DraftConfig(**options).build_with(default_model, small_draft)
        out = engine.generate(prompt, proposer, config)
        assert out.token_ids == engine.generate(prompt, PlainProposer(), config).token_ids
        copied += proposer.source_stats["lookup"]["accepted"]
    assert copied > 0  # some copied tokens were accepted: the path ran and paid somewhere


def test_self_draft_with_jump_accepts_its_copies(engine, default_model, prompts):
    """The target as its own draft: every copied token is one the target itself agreed to start."""
    summarization = prompts[2]
    proposer = DraftConfig(k=4, adaptive=False, jump=1).build_with(default_model, default_model.model)
    out = engine.generate(summarization, proposer, GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert out.stats.acceptance_rate > 0.5
    sampled = engine.generate(summarization, DraftConfig(k=4, adaptive=False, jump=1).build_with(
        default_model, default_model.model), GenerationConfig(24, SamplingParams(temperature=0.7, seed=5)))  # fmt: skip
    assert len(sampled.token_ids) == 24


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
