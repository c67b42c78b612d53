"""LogitSpec's chain mode (`specdec.proposers.logitspec.chain`): which chain it picks, and how learning moves it.

Pure Python over lists and one logits row: no engine, no vLLM (the vLLM proposer drafts with it).
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.engine.costs import AcceptanceStats
from specdec.proposers.logitspec.chain import choose_chain, retrieve_chain
from specdec.proposers.logitspec.learn import Step, learn_retrieval, learn_step, uninformative_prior
from specdec.proposers.logitspec.retrieval import Retrieval, retrieve
from specdec.proposers.ngram_index import NGramIndex


def _retrieval(root_branch, root_ngram, cands):
    """A retrieval as `logitspec.retrieve` returns it; cands: (token, rank, continuation, m) per candidate."""
    tokens, ranks, conts, ngrams = ([list(c) for c in zip(*cands, strict=True)] if cands else [[], [], [], []])
    return Retrieval(root_branch, root_ngram, tokens, ranks, conts, ngrams, [])  # top-k list: unused by chains


def test_chain_is_the_best_paying_branch_prefix():
    stats = AcceptanceStats(uninformative_prior(k=4))
    retrieval = _retrieval([10, 11, 12], 3, [(20, 0, [21, 22], 2), (30, 1, [], 0)])
    # Priors: root tokens 1/2 each (0.5, 0.25, 0.125); a candidate 1/5 then halves.
    assert choose_chain(retrieval, stats, 0, 5, 0.1) == [10, 11, 12]
    assert choose_chain(retrieval, stats, 0, 2, 0.1) == [10, 11]
    assert choose_chain(retrieval, stats, 0, 5, 0.3) == [10]
    assert choose_chain(_retrieval([], 0, [(20, 0, [21, 22], 2)]), stats, 0, 5, 0.05) == [20, 21]
    assert choose_chain(_retrieval([], 0, []), stats, 0, 5, 0.0) == []


def test_learning_moves_the_choice_to_what_was_emitted():
    stats = AcceptanceStats(uninformative_prior(k=4))
    retrieval = _retrieval([10, 11], 1, [(20, 0, [21, 22], 2)])
    for _ in range(20):  # the candidate's branch is what the model keeps writing; the root branch never
        learn_retrieval(stats, retrieval, 0, [20, 21, 22, 5])
    assert stats.rate(("root", 1, 0, 1)) < 0.1 and stats.rate(("cand", 1, 2)) > 0.8
    assert choose_chain(retrieval, stats, 0, 5, 0.05) == [20, 21, 22]


def test_retrieve_chain_picks_what_the_full_retrieval_would_and_looks_up_less():
    """On repetitive random text, with rates learned as the proposer learns them, at several prices."""
    rng = np.random.default_rng(1)
    phrases = [list(rng.integers(0, 40, size=int(rng.integers(3, 9)))) for _ in range(12)]
    text: list[int] = []
    while len(text) < 600:  # phrases repeat, with random tokens between them: partial, uncertain matches
        text += phrases[int(rng.integers(len(phrases)))] + list(rng.integers(0, 40, size=int(rng.integers(0, 3))))
    text = [int(t) for t in text]
    index = NGramIndex(3, "latest")
    stats = AcceptanceStats(uninformative_prior(k=20))
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
        learn_retrieval(stats, reference, 1, text[end : end + 6])
    assert looked_up < full / 2, (looked_up, full)  # most candidates could not win: not looked up


def test_chain_mode_learns_what_the_tree_proposer_learns_from_the_same_retrieval():
    """One learner: a tree step without floor or other sources updates exactly chain mode's keys."""
    retrieval = _retrieval([10, 11, 12], 2, [(20, 0, [21], 1), (10, 1, [11], 2), (30, 3, [], 0)])
    chain_stats, tree_stats = AcceptanceStats(uninformative_prior(k=4)), AcceptanceStats(uninformative_prior(k=4))
    for emitted in ([10, 11, 7], [20, 21, 22], [5]):
        learn_retrieval(chain_stats, retrieval, 1, emitted)
        learn_step(tree_stats, Step(retrieval, [], 0, 1), 99, emitted, 1)
    assert chain_stats.snapshot() == tree_stats.snapshot()
    assert chain_stats.rate(("root", 2, 1, 2)) > 0.5 > chain_stats.rate(("root", 2, 1, 3))  # 11 right, then 7
