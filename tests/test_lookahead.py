"""The `lookahead` method on the real default model (fp32): greedy output equals plain
decoding, trees stay within budget, the pool fills with diagonal n-grams of the
Jacobi trajectory, and some of them get accepted."""

from __future__ import annotations

import pytest
import torch

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.verify import VerifyResult
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.lookahead import LookaheadConfig, LookaheadProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset, categories=["mt_bench", "math_reasoning"], per_category=1)
    texts = [q.turns[0] for q in questions]
    texts.append("Count from 1 to 40, separated by commas.")
    return [encode_prompt(default_model.tokenizer, t, chat=True) for t in texts]


@pytest.mark.slow  # the fast tier's seeded lossless rows (test_lossless) check these tokens are plain sampling's
def test_seeded_sampling_is_reproducible(engine, default_model, prompts):
    config = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=0.7, seed=9))
    runs = [engine.generate(prompts[2], LookaheadConfig().build(default_model), config).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def _fake_result(tree: DraftTree, next_tokens: dict[int, int], emitted: list[int], vocab: int = 50) -> VerifyResult:
    """A verify result whose logits at node i put all mass on next_tokens[i]."""
    logits = torch.zeros(tree.num_nodes, vocab)
    for node, token in next_tokens.items():
        logits[node, token] = 1.0
    return VerifyResult(emitted, [0], logits, tree)


def test_diagonal_ngrams_enter_the_pool():
    from specdec.engine.generation import ProposalContext

    proposer = LookaheadProposer(LookaheadConfig(window=3, ngram=3, guesses=1, max_nodes=8))
    proposer.begin([1, 2, 3, 4])  # first guess: the prompt's last 3 tokens
    context = [1, 2, 3, 4, 5]  # root 5 at position 4
    tree = proposer.propose(ProposalContext(context, torch.zeros(50), 4, SamplingParams(), 10))
    assert tree.token_list == [5, 2, 3, 4]
    # Target: after root -> 6, after 2 -> 7, after 3 -> 8, after 4 -> 9. Nothing accepted; 6 emitted.
    proposer.observe(_fake_result(tree, {0: 6, 1: 7, 2: 8, 3: 9}, [6]))
    assert proposer.window == [7, 8, 9]  # new iterate for positions 6, 7, 8
    assert not proposer.pool  # one level only: no 3-gram diagonal yet
    context.append(6)  # root 6 at position 5, chain 7, 8, 9 at positions 6..8
    tree = proposer.propose(ProposalContext(context, torch.zeros(50), 4, SamplingParams(), 10))
    proposer.observe(_fake_result(tree, {0: 7, 1: 8, 2: 9, 3: 10}, [7]))
    # Diagonals: level 1 (5@4, 2@5, 3@6, 4@7), level 2 (6@5, 7@6, 8@7, 9@8), new (7@6, 8@7, 9@8, 10@9).
    assert tuple(proposer.pool[5]) == ((6, 7),)  # 5@4, 6@5, new 7@6
    assert tuple(proposer.pool[2]) == ((7, 8),)  # 2@5, 7@6, new 8@7
    assert tuple(proposer.pool[3]) == ((8, 9),)
    assert tuple(proposer.pool[4]) == ((9, 10),)
    # The next tree verifies the pool's continuation of the root beside the Jacobi chain.
    context.append(7)
    tree = proposer.propose(ProposalContext(context, torch.zeros(50), 4, SamplingParams(), 10))
    assert tree.token_list[0] == 7 and tree.num_nodes <= 8


def test_options_are_validated():
    with pytest.raises(ValueError):
        LookaheadConfig(window=0)
    with pytest.raises(ValueError):
        LookaheadConfig(window=8, max_nodes=4)
    assert parse_method("lookahead:window=3,ngram=3,guesses=1").window == 3
