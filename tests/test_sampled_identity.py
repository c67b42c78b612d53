"""Seeded sampling emits plain sampling's tokens, whatever was drafted (fp32, the real default model).

Why: the engines draw the t-th sampled token of a request with the t-th uniform of
its generator (`specdec.uniforms`), so for drafts without probabilities (retrieval,
lookup, Token Recycling, lookahead) the tree only decides how many positions one
pass settles. So a seed gives plain sampling's output, also after state shared
across requests (the recycle table, the session store) has changed. A rule that
drew by tree node instead fails here: trees of different shapes spend the
generator's values differently.
"""

from __future__ import annotations

import pytest
from spec_prompts import prompts_by_category

from specdec.generation import GenerationConfig
from specdec.proposers import parse_method
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams

NEW_TOKENS = 24
CATEGORIES = ("mt_bench", "summarization", "math_reasoning")  # short and long prompts, prose and numbers
SAMPLINGS = (SamplingParams(temperature=0.7, seed=11), SamplingParams(temperature=1.0, top_p=0.9, seed=12))
METHODS = (
    "pld", "logitspec", "logitspec:session=true,third=true", "logitspec:adaptive=false",
    "recycle", "lookahead",
)  # fmt: skip


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset) -> dict[str, list[int]]:
    return prompts_by_category(default_model.tokenizer, spec_bench_subset, CATEGORIES)


@pytest.fixture(scope="module")
def plain_sampled(engine, prompts) -> dict[tuple[str, int], list[int]]:
    return {
        (name, i): engine.generate(ids, PlainProposer(), GenerationConfig(NEW_TOKENS, sampling)).token_ids
        for name, ids in prompts.items()
        for i, sampling in enumerate(SAMPLINGS)
    }


@pytest.mark.parametrize("method", METHODS)
def test_seeded_sampling_is_plain_sampling(engine, default_model, prompts, plain_sampled, method):
    proposer = parse_method(method).build(default_model)  # shared state (recycle table, store) as served
    accepted = 0
    for _ in range(2):  # the second round runs on state the first one changed
        for name, ids in prompts.items():
            for i, sampling in enumerate(SAMPLINGS):
                out = engine.generate(ids, proposer, GenerationConfig(NEW_TOKENS, sampling))
                assert out.token_ids == plain_sampled[name, i], f"{method} differs on {name}, {sampling}"
                accepted += sum(step.num_accepted for step in out.stats.steps)
    assert accepted > 0  # drafts were accepted: the trees mattered to how far steps went
