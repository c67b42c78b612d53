"""The proposer pool (specdec.serve.pool): one build per distinct config, parts prepared only at startup.

What must hold (each test can fail):
- the same config gives the same proposer object (one build); distinct configs
  are kept up to the capacity, least recently used out first;
- expensive parts are made by `prepare` only, once per key; `check` and `get`
  refuse a config whose parts were not prepared, and never make them;
- concurrent `get`s of one config build it once;
- the configs' own preparations assemble working proposers from prepared parts
  (draft with a stand-in draft module, so no second model is loaded).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from specdec.engine.generation import GenerationConfig
from specdec.prompts import encode_prompt
from specdec.proposers import make_config, method_name
from specdec.proposers.draft import DraftProposer
from specdec.proposers.schema import Preparation
from specdec.sampling import SamplingParams
from specdec.serve.options import RequestRefused
from specdec.serve.pool import ProposerPool


class CountingPreparation:
    """A preparation for `plain` whose parts are a counter: prepare calls are counted."""

    def __init__(self) -> None:
        self.prepared = 0

    def __call__(self, config) -> Preparation:
        def prepare(loaded) -> int:
            self.prepared += 1
            return self.prepared

        return Preparation(("parts",), prepare, lambda loaded, parts: config.build(loaded), "why")


def with_stand_in_draft(config) -> Preparation | None:
    """The configs' own preparations, but `draft` prepares the target itself as its draft module."""
    needs = config.preparation()
    if method_name(config) != "draft":
        return needs
    return dataclasses.replace(needs, prepare=lambda loaded: config.prepare(loaded, loaded.model))


def test_the_same_config_gives_the_same_proposer(default_model):
    pool = ProposerPool(default_model)
    first = pool.get(make_config("pld", {"num_pred_tokens": 4}))
    again = pool.get(make_config("pld", {"num_pred_tokens": "4"}))  # equal config, equal key
    other = pool.get(make_config("pld", {"num_pred_tokens": 5}))
    assert again is first and other is not first
    stats = pool.stats()
    assert (stats.builds, stats.hits, stats.size, stats.evictions) == (2, 1, 2, 0)


def test_the_pool_keeps_at_most_capacity_least_recently_used_out(default_model):
    pool = ProposerPool(default_model, capacity=2)
    a, b, c = (make_config("pld", {"num_pred_tokens": n}) for n in (1, 2, 3))
    kept_a = pool.get(a)
    pool.get(b)
    assert pool.get(a) is kept_a  # a is now the most recently used
    pool.get(c)  # evicts b
    assert pool.get(a) is kept_a
    assert pool.stats().evictions == 1 and pool.stats().size == 2
    pool.get(b)  # built again
    assert pool.stats().builds == 4
    with pytest.raises(ValueError):
        ProposerPool(default_model, capacity=0)


def test_parts_are_made_by_prepare_only_and_once(default_model):
    counting = CountingPreparation()
    pool = ProposerPool(default_model, preparation=counting)
    config = make_config("plain")
    for call in (pool.check, pool.get):
        with pytest.raises(RequestRefused) as refused:
            call(config)
        assert (refused.value.code, refused.value.param) == ("method_not_available", "specdec.method")
    assert counting.prepared == 0 and pool.stats().builds == 0
    pool.prepare(config)
    pool.prepare(config)
    pool.check(config)
    assert pool.get(config) is pool.get(config)
    assert counting.prepared == 1 and pool.stats().prepared == 1 and pool.stats().builds == 1


def test_concurrent_gets_build_once(default_model):
    pool = ProposerPool(default_model)
    config = make_config("lookahead", {"window": 3})
    with ThreadPoolExecutor(max_workers=8) as threads:
        proposers = list(threads.map(lambda _: pool.get(config), range(32)))
    assert all(p is proposers[0] for p in proposers)
    assert (pool.stats().builds, pool.stats().hits) == (1, 31)


def test_unprepared_real_preparations_are_refused_with_their_reason(default_model):
    pool = ProposerPool(default_model)
    for method, options, words in [
        ("draft", {}, "draft model"),
        ("draft", {"draft_model": "x"}, "draft model"),
        ("layerskip", {}, "calibrated"),
        ("logitspec", {}, "adaptive=false"),
    ]:
        with pytest.raises(RequestRefused, match=words):
            pool.check(make_config(method, options))
    pool.check(make_config("logitspec", {"adaptive": False}))  # needs no parts
    pool.check(make_config("layerskip", {"skip": "3+4"}))  # a fixed skip set needs no calibration


def test_an_int8_draft_is_quantized_once_and_shared(default_model, engine):
    """The server prepares the int8 copy at startup; each concurrent request's proposer shares it."""
    pool = ProposerPool(default_model, preparation=with_stand_in_draft)
    config = make_config("draft", {"draft_model": "stand-in", "k": 2, "adaptive": False, "quantize": "int8"})
    pool.prepare(config)
    first, second = pool.acquire(config), pool.acquire(config)
    assert first is not second and first.runner.model.model is second.runner.model.model
    assert first.runner.model.model is not default_model.model  # a quantized copy, the target untouched
    prompt = encode_prompt(default_model.tokenizer, "1, 2, 3, 4,")
    settings = GenerationConfig(max_new_tokens=4, sampling=SamplingParams(temperature=0.0))
    plain = engine.generate(prompt, make_config("plain").build(default_model), settings)
    assert engine.generate(prompt, second, settings).token_ids == plain.token_ids
    assert pool.stats().prepared == 1 and pool.stats().builds == 2


def test_real_preparations_assemble_working_proposers(default_model, engine):
    """draft with the target itself as its (stand-in) draft module; layerskip with a fixed skip set."""
    pool = ProposerPool(default_model, preparation=with_stand_in_draft)
    config = make_config("draft", {"draft_model": "stand-in", "k": 2, "max_k": 2, "adaptive": False})
    pool.prepare(config)
    proposer = pool.get(config)
    assert isinstance(proposer, DraftProposer)
    prompt = encode_prompt(default_model.tokenizer, "1, 2, 3, 4,")
    settings = GenerationConfig(max_new_tokens=3, sampling=SamplingParams(temperature=0.0))
    plain = engine.generate(prompt, make_config("plain").build(default_model), settings)
    for _ in range(2):  # a pooled proposer serves a second generation from a clean start
        assert engine.generate(prompt, pool.get(config), settings).token_ids == plain.token_ids
    paper = make_config("logitspec", {"adaptive": False})  # needs no prepared part (was a 500 in the server)
    assert engine.generate(prompt, pool.get(paper), settings).token_ids == plain.token_ids
    skip = make_config("layerskip", {"skip": "10+20", "k": 1, "adaptive": False})
    assert engine.generate(prompt, pool.get(skip), settings).token_ids == plain.token_ids
    assert pool.stats().builds == 3 and pool.stats().prepared == 1
