"""`draft:fill=N`: the chain verified as a tree whose spare nodes hold the draft's runner-up picks (fp32).

Greedy identity to plain decoding on Spec-Bench prompts of every category (a leaf only adds a
path the target may take), with leaves actually accepted on the way; the tree's shape; sampling
left as it was (fill is greedy only); bad values refused.
"""

from __future__ import annotations

import pytest
import torch

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.prompts import encode_prompt
from specdec.proposers.draft import DraftConfig
from specdec.sampling import SamplingParams

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset, per_category=1)
    return [encode_prompt(default_model.tokenizer, q.turns[0], chat=True) for q in questions]


def test_the_tree_is_the_chain_plus_distinct_leaves_within_fill(default_model, small_draft, prompts):
    proposer = DraftConfig(fill=5, k=3, adaptive=False).build_with(default_model, small_draft)
    prompt = prompts[0]
    proposer.begin(prompt)
    logits = torch.zeros(default_model.model.config.vocab_size)
    tree = proposer.propose(ProposalContext(prompt, logits, len(prompt), SamplingParams(), max_depth=8))
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    assert len(tokens) == 5 and parents[:4] == [-1, 0, 1, 2]  # the fixed chain of 3, then one leaf
    for node in range(4, len(tokens)):
        siblings = [tokens[i] for i in range(1, len(tokens)) if parents[i] == parents[node] and i != node]
        assert tokens[node] not in siblings


@pytest.mark.slow
def test_sampling_keeps_the_chain(engine, default_model, small_draft, prompts):
    """In the full tier (~11 s here: two sampled runs beside a draft model); the fast tier checks the tree."""
    sampling = SamplingParams(temperature=0.8, seed=3)
    outs = []
    for fill in (0, 6):
        proposer = DraftConfig(fill=fill, k=3, adaptive=False).build_with(default_model, small_draft)
        outs.append(engine.generate(prompts[1], proposer, GenerationConfig(NEW_TOKENS, sampling)))
        assert proposer.num_leaves_accepted == 0
    assert outs[0].token_ids == outs[1].token_ids
    assert [s.tree_size for s in outs[0].stats.steps] == [s.tree_size for s in outs[1].stats.steps]


@pytest.mark.parametrize("fill", [-1, 65])
def test_bad_fill_is_refused(fill):
    with pytest.raises(ValueError, match="fill must be in"):
        DraftConfig("some-draft", fill=fill)
