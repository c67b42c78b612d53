"""The cross-request session store and the `session` method.

Model-free: lookups follow the most frequent continuation across documents and
the longest matching n-gram; the store never holds more than its token cap and
its counts always equal a recount over the documents it holds (after adds,
extends and evictions, also from many threads at once); one store per model.
On the real default model (fp32): greedy output is token-identical to plain
greedy, and a repeated request drafts from the first one's output.
"""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest

from specdec.bench.config import parse_methods
from specdec.bench.runner import SpecdecContender
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import LoadedModel
from specdec.proposers import parse_method
from specdec.proposers.logitspec.sources import Sources
from specdec.proposers.session_store import SessionStore

NEW_TOKENS = 16


def recount(store: SessionStore) -> list[dict]:
    """The tables a fresh store builds from the documents `store` holds (white-box: its private state)."""
    fresh = SessionStore(store.max_tokens, store.max_ngram)
    for doc in store._docs.values():
        fresh.add(doc)
    return fresh._tables


# ------------------------------------------------------------------ model-free
def test_lookup_follows_the_most_frequent_continuation():
    store = SessionStore(max_tokens=100, max_ngram=3)
    store.add([1, 2, 3, 4, 5])
    store.add([9, 2, 3, 7, 8])
    store.add([8, 2, 3, 7, 6])
    assert store.lookup([0, 2, 3], 4) == [7, 6]  # "2 3" -> 7 twice; "2 3 7" -> 8 or 6: a tie, the smaller id
    assert store.lookup([1, 2, 3], 4) == [4, 5]  # the 3-gram "1 2 3" wins over "2 3"
    assert store.branches([0, 2, 3], 2, max_branches=3) == [[7, 6], [4, 5]]  # distinct first tokens
    assert store.lookup([0, 5], 3) == []  # "5" ends a document: it never continued
    assert store.lookup([0, 2, 3], 4, min_ngram=3) == []  # "0 2 3" was never seen
    doc = store.add([5, 6])
    assert store.extend(doc, [1]) and store.lookup([5], 2) == [6, 1]


def test_extend_adds_exactly_the_new_ngrams():
    store = SessionStore(max_tokens=100, max_ngram=3)
    doc = store.add([1, 2])
    store.extend(doc, [3])
    store.extend(doc, [4, 5])
    assert store._tables == recount(store)
    assert store.num_tokens == 5 and store.lookup([2, 3], 5) == [4, 5]


@pytest.mark.parametrize("seed", range(5))
def test_memory_stays_under_the_cap_and_counts_stay_exact(seed):
    rng = random.Random(seed)
    store = SessionStore(max_tokens=60, max_ngram=3)
    docs: list[int] = []
    for _ in range(80):
        if docs and rng.random() < 0.5:
            store.extend(rng.choice(docs), [rng.randrange(6) for _ in range(rng.randrange(1, 15))])
        else:
            docs.append(store.add([rng.randrange(6) for _ in range(rng.randrange(1, 90))]))
        assert store.num_tokens <= store.max_tokens
    assert store._tables == recount(store)
    assert 1 <= len(store) < len(docs)  # older documents were evicted


def test_least_recently_used_documents_go_first():
    store = SessionStore(max_tokens=10, max_ngram=2)
    first = store.add([1, 2, 3, 4])
    second = store.add([5, 6, 7, 8])
    store.extend(first, [9])  # `first` is now the most recent
    store.add([10, 11, 12])  # 12 tokens > 10: the least recently used (`second`) goes
    assert store.lookup([5], 2) == [] and store.lookup([3], 2) == [4, 9]
    assert not store.extend(second, [1])  # evicted documents are not extended
    big = store.add(list(range(20, 50)))  # longer than the cap: its first 10 tokens are kept
    assert len(store) == 1 and store.num_tokens == 10 and store.lookup([28], 3) == [29]
    assert store.extend(big, [1]) and store.num_tokens == 10  # a full document takes no more tokens


def test_safe_under_threads():
    store = SessionStore(max_tokens=500, max_ngram=3)
    errors: list[BaseException] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        try:
            doc = store.add([rng.randrange(8) for _ in range(20)])
            for _ in range(150):
                store.extend(doc, [rng.randrange(8) for _ in range(rng.randrange(1, 6))])
                store.branches([rng.randrange(8) for _ in range(4)], 6, max_branches=3)
                assert store.num_tokens <= store.max_tokens
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert store.num_tokens <= store.max_tokens and store._tables == recount(store)


def test_one_store_per_model_and_bounds(default_model):
    default_model.state.clear()
    first = parse_method("session").build(default_model)
    same = parse_method("session:num_pred_tokens=4").build(default_model)
    smaller = parse_method("session:max_tokens=1000").build(default_model)
    assert first.store is same.store and first.store is not smaller.store
    default_model.state.clear()


def test_stores_are_shared_within_a_scope_and_apart_across_scopes(default_model):
    default_model.state.clear()
    first = parse_method("session").build(default_model)
    again = parse_method("session").build(default_model)
    scoped = parse_method("session").build(dataclasses.replace(default_model, state_scope="method a"))
    assert first.store is again.store and scoped.store is not first.store
    sources = Sources.for_loaded(dataclasses.replace(default_model, state_scope="method a"), False, True, None)
    assert sources.session is scoped.store  # logitspec:session=true and `session` meet in one scope
    default_model.state.clear()


def test_state_lives_on_the_loaded_model_not_the_module(default_model):
    """A replace (the bench's scopes) keeps the loaded model's state; another load of it starts empty."""
    default_model.state.clear()
    first = parse_method("session").build(default_model)
    assert dataclasses.replace(default_model, state_scope="x").state is default_model.state
    other_load = LoadedModel(default_model.model, default_model.tokenizer, default_model.name)
    assert other_load.state is not default_model.state
    assert parse_method("session").build(other_load).store is not first.store
    assert parse_method("session").build(default_model).store is first.store
    default_model.state.clear()


def test_bench_gives_each_method_its_own_store(default_model):
    """Else a method run after another on the same prompt would draft that method's answer from the store."""
    default_model.state.clear()
    engine = Engine(default_model)
    specs = parse_methods(("session", "session:num_pred_tokens=4"))
    first, second = (SpecdecContender(engine, spec, GenerationConfig(max_new_tokens=4)) for spec in specs)
    assert first.proposer.store is not second.proposer.store
    default_model.state.clear()
