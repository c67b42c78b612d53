"""NGramIndex against a brute-force scan of the sequence (the reference lives only here)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.proposers.ngram_index import NGramIndex

VOCAB = 6  # a small vocabulary, so that matches (and ties between occurrences) are frequent


def brute_lookup(
    tokens: list[int], suffix: list[int], max_ngram: int, min_ngram: int, max_continuation: int, prefer: str
) -> tuple[list[int], int]:
    """Reference: scan every occurrence of each query tail that has a continuation."""
    for m in range(max_ngram, min_ngram - 1, -1):
        if len(suffix) < m:
            continue
        query = list(suffix[len(suffix) - m :])
        starts = [i for i in range(m, len(tokens)) if tokens[i - m : i] == query]
        if starts:
            start = max(starts) if prefer == "latest" else min(starts)
            return tokens[start : start + max_continuation], m
    return [], 0


def split(tokens: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted({c % (len(tokens) + 1) for c in cuts}), len(tokens)]
    return [tokens[a:b] for a, b in itertools.pairwise(bounds)]


token_lists = st.lists(st.integers(0, VOCAB - 1), max_size=70)
prefers = st.sampled_from(["latest", "earliest"])


@st.composite
def scenarios(draw):
    tokens = draw(token_lists)
    max_ngram = draw(st.integers(1, 4))
    min_ngram = draw(st.integers(1, max_ngram))
    max_continuation = draw(st.integers(0, 10))
    prefer = draw(prefers)
    kind = draw(st.sampled_from(["prefix", "past_end", "free"]))
    if kind == "prefix":  # the query is the indexed sequence itself, or one of its prefixes
        suffix = tokens[: draw(st.integers(0, len(tokens)))]
    elif kind == "past_end":  # LogitSpec: context + candidate token(s) not indexed yet
        suffix = tokens + draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3))
    else:
        suffix = draw(st.lists(st.integers(0, VOCAB - 1), max_size=6))
    cuts = draw(st.lists(st.integers(0, 1000), max_size=8))
    return tokens, suffix, max_ngram, min_ngram, max_continuation, prefer, cuts


@settings(max_examples=1500, deadline=None)
@given(scenarios())
def test_matches_brute_force(scenario):
    tokens, suffix, max_ngram, min_ngram, max_continuation, prefer, cuts = scenario
    expected = brute_lookup(tokens, suffix, max_ngram, min_ngram, max_continuation, prefer)

    whole = NGramIndex(max_ngram, prefer)
    whole.extend(tokens)
    chunked = NGramIndex(max_ngram, prefer)
    for chunk in split(tokens, cuts):
        chunked.extend(chunk)

    for index in (whole, chunked):
        assert index.tokens == tokens
        assert len(index) == len(tokens)
        assert index.lookup_with_ngram(suffix, max_continuation, min_ngram) == expected
        assert index.lookup(suffix, max_continuation, min_ngram) == expected[0]


@settings(max_examples=500, deadline=None)
@given(tokens=token_lists, max_ngram=st.integers(1, 4), prefer=prefers,
       candidates=st.lists(st.integers(0, VOCAB), max_size=VOCAB + 2))
def test_find_next_is_find_of_each_candidate_after_the_sequence(tokens, max_ngram, prefer, candidates):
    """LogitSpec's batched query: each candidate appended to the sequence, as `find` and the scan see it."""
    index = NGramIndex(max_ngram, prefer)
    index.extend(tokens)
    found = index.find_next(candidates)
    assert found == [index.find([*tokens, c]) for c in candidates]
    for c, (pos, m) in zip(candidates, found, strict=True):
        expected = brute_lookup(tokens, [*tokens, c], max_ngram, 1, 4, prefer)
        assert ((index.tokens[pos : pos + 4], m) if m else ([], 0)) == expected


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2), min_size=0, max_size=90),
    chunk_sizes=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    max_ngram=st.integers(1, 4),
    prefer=prefers,
)
def test_every_query_after_every_extend(tokens, chunk_sizes, max_ngram, prefer):
    """Chunks of mixed sizes (both extend paths), every query tail checked after each extend."""
    index = NGramIndex(max_ngram, prefer)
    queries = [list(q) for m in range(1, max_ngram + 1) for q in itertools.product(range(3), repeat=m)]
    pos = 0
    for size in itertools.cycle(chunk_sizes):
        if pos >= len(tokens):
            break
        index.extend(tokens[pos : pos + size])
        pos += size
        seen = tokens[:pos]
        assert index.tokens == seen
        for query in queries:
            for min_ngram in range(1, max_ngram + 1):
                assert index.lookup_with_ngram(query, 5, min_ngram) == brute_lookup(
                    seen, query, max_ngram, min_ngram, 5, prefer
                )


def test_doc_example_and_self_match():
    index = NGramIndex(max_ngram=2)
    index.extend([5, 6, 7, 5, 6, 8])
    assert index.lookup([1, 5, 6], 3) == [8]
    assert index.lookup_with_ngram([9, 6], 2) == ([8], 1)
    # The sequence's own final n-gram has nothing after it: never a self-match.
    tail = NGramIndex(max_ngram=3)
    tail.extend([1, 2, 3])
    assert tail.lookup_with_ngram([1, 2, 3], 4) == ([], 0)
    # "latest" means the latest occurrence that has a continuation, not the final token.
    again = NGramIndex(max_ngram=1)
    again.extend([7, 8, 7])
    assert again.lookup([7], 4) == [8, 7]
    earliest = NGramIndex(max_ngram=1, prefer="earliest")
    earliest.extend([7, 8, 7, 9, 7])
    assert earliest.lookup([7], 1) == [8]


def test_longest_match_wins_over_latest_shorter_one():
    index = NGramIndex(max_ngram=3)
    index.extend([1, 2, 3, 4, 9, 3, 5])
    # (1, 2, 3) matched once (continuation 4), although 3 alone occurs later (continuation 5).
    assert index.lookup_with_ngram([1, 2, 3], 2) == ([4, 9], 3)
    assert index.lookup_with_ngram([7, 2, 3], 2) == ([4, 9], 2)
    assert index.lookup_with_ngram([7, 7, 3], 2) == ([5], 1)


def test_empty_index_and_empty_suffix():
    index = NGramIndex()
    assert len(index) == 0 and index.tokens == []
    assert index.lookup_with_ngram([1, 2, 3], 5) == ([], 0)
    index.extend([])
    assert len(index) == 0
    index.extend([4])  # a single token has no continuation yet
    assert index.lookup([4], 5) == []
    index.extend([4])
    assert index.lookup_with_ngram([4], 5) == ([4], 1)
    assert index.lookup_with_ngram([], 5) == ([], 0)


def test_max_continuation_zero_reports_match_without_tokens():
    index = NGramIndex(max_ngram=2)
    index.extend([1, 2, 1, 2])
    assert index.lookup_with_ngram([1, 2], 0) == ([], 2)
    assert index.lookup([1, 2], 0) == []


def test_min_ngram_longer_than_suffix():
    index = NGramIndex(max_ngram=3)
    index.extend([1, 2, 1, 2, 1, 2])
    assert index.lookup_with_ngram([2], 3, min_ngram=2) == ([], 0)
    assert index.lookup_with_ngram([1, 2], 3, min_ngram=3) == ([], 0)
    assert index.lookup_with_ngram([2, 1, 2], 3, min_ngram=3) == ([1, 2], 3)


def test_continuation_is_clipped_at_the_end_of_the_sequence():
    index = NGramIndex(max_ngram=2)
    index.extend([3, 4, 5, 3, 4])
    assert index.lookup([3, 4], 10) == [5, 3, 4]


def test_integer_like_tokens_are_normalised():
    index = NGramIndex(max_ngram=2)
    index.extend(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    index.extend(torch.tensor([3, 9]))
    assert index.tokens == [1, 2, 3, 1, 2, 3, 9]
    assert all(type(tok) is int for tok in index.tokens)
    assert index.lookup(torch.tensor([1, 2]), 3) == [3, 9]
    assert index.lookup(np.array([5, 3]), 3) == [9]
    assert index.lookup((2, 3), 3) == [9]
    with pytest.raises(TypeError):
        index.extend([1.5])


@pytest.mark.parametrize(
    "kwargs",
    [{"max_ngram": 0}, {"max_ngram": -1}, {"max_ngram": 2.0}, {"max_ngram": True}, {"prefer": "first"}],
)
def test_constructor_validation(kwargs):
    with pytest.raises(ValueError):
        NGramIndex(**kwargs)


def test_lookup_validation():
    index = NGramIndex(max_ngram=2)
    index.extend([1, 2, 1])
    with pytest.raises(ValueError):
        index.lookup([1], -1)
    with pytest.raises(ValueError):
        index.lookup([1], 3, min_ngram=0)
    with pytest.raises(ValueError):
        index.lookup([1], 3, min_ngram=3)


def test_properties_and_repr():
    index = NGramIndex(4, "earliest")
    index.extend(range(5))
    assert (index.max_ngram, index.prefer, len(index)) == (4, "earliest", 5)
    assert repr(index) == "NGramIndex(max_ngram=4, prefer='earliest', len=5)"
