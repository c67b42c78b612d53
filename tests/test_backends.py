"""Every backend the registry knows keeps the contract (`specdec.backends.contract`) and decodes losslessly.

Lossless per backend: `logitspec`'s greedy text equals plain decoding's on the same backend, on the
bundled model (torch in fp32; llama.cpp with exact passes, on its GGUF file) and, for the compiled
backend, on conftest's tiny random target (fp32): the bundled model's graphs took 3-4 minutes each to
compile on a cold cache (CI's), nine minutes for this one row; the tiny target's compile in seconds and
run the same code. tests/test_compiled.py checks the compiled pass itself.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import save_fixed_costs

from specdec.backends import registry
from specdec.backends.contract import Rows, Target
from specdec.choices import BACKENDS
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models.state import ModelState
from specdec.proposers import parse_method

SETTINGS = {"torch": {}, "compiled": {}, "llamacpp": {"exact": "on"}}  # what makes each pass exact


def test_every_declared_backend_has_an_implementation():
    assert set(registry._VERIFIERS) == set(BACKENDS) == set(SETTINGS)


def test_an_undeclared_backend_is_refused():
    from specdec.choices import check_backend

    with pytest.raises(ValueError, match="backend must be one of torch, compiled, llamacpp"):
        check_backend("tpu")


@pytest.mark.parametrize("backend", [
    "torch", pytest.param("compiled", marks=pytest.mark.slow), "llamacpp",
])  # fmt: skip
def test_backend_keeps_the_contract_and_decodes_losslessly(default_model, bench_prompts, backend, request):
    model = request.getfixturevalue("tiny") if backend == "compiled" else default_model
    loaded = dataclasses.replace(model, backend=backend, state=ModelState(), **SETTINGS[backend])
    save_fixed_costs(loaded)
    target = registry.verifier(loaded)
    assert isinstance(target, Target)
    rows = registry.rows_of(target)
    assert isinstance(rows, Rows) and rows.num_rows == 0
    slot, logits, _ = rows.add(bench_prompts["summarization"][:64])
    assert slot == 0 and rows.num_rows == 1 and logits.shape == (target.config.vocab_size,)
    rows.release()
    engine = Engine(loaded)
    config = GenerationConfig(max_new_tokens=32)
    # the article's end, the request and the reply's start, whose summary may copy; and a count, which repeats
    # itself whatever the pass's rounding (llama.cpp's AVX2 build wrote a summary that copied nothing)
    mats = []
    for prompt in (bench_prompts["summarization"][-320:], bench_prompts["counting"]):
        plain = engine.generate(prompt, parse_method("plain").build(loaded), config)
        out = engine.generate(prompt, parse_method("logitspec").build(loaded), config)
        assert out.token_ids == plain.token_ids
        mats.append(out.stats.mat)
    assert max(mats) > 1.0
