"""Shared test fixtures.

Hermetic by construction: before any test runs, `XDG_CACHE_HOME` points at a
folder under the system's temporary directory, so converted models, cost curves
and calibrations are written there and never into the user's ~/.cache (child
processes such as the test server inherit it). The folder is kept between runs,
so the bundled model is converted once (~20 s), not once per run.

LogitSpec sizes its trees from a measured cost curve, and the engine picks an
attention implementation per pass shape from measured timings; measured under
the suite's own load they would differ from run to run. The session fixture
below seeds the cache with a fixed curve and a fixed attention plan for the
default model, so no test depends on wall-clock timing.
"""

import copy
import os
import tempfile
from pathlib import Path

import pytest

TEST_CACHE_HOME = Path(tempfile.gettempdir()) / f"specdec-tests-{os.getuid()}"
# Seconds per forward pass of SmolLM2-135M in fp32 at these tree sizes (2-core AVX-512 machine, idle).
FIXED_COST_CURVE = {1: 0.039, 2: 0.045, 4: 0.05, 8: 0.06, 16: 0.073, 32: 0.105, 64: 0.157}


def pytest_configure(config):
    os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE_HOME)


@pytest.fixture(scope="session")
def spec_bench_subset() -> Path:
    """The committed test subset of Spec-Bench: 2 questions of each category (12 rows)."""
    return Path(__file__).parent / "data" / "spec_bench_subset.jsonl"


def fixed_attention_plan():  # noqa: ANN201 - specdec.backends.torch.attention.AttentionPlan
    """SDPA for short contexts, eager beyond: both implementations run in the suite, chosen by shape."""
    from specdec.backends.torch import attention

    return attention.AttentionPlan((128, 512), (1, 64), (("sdpa", "sdpa"), ("eager", "sdpa")))


@pytest.fixture(scope="session")
def default_model():
    """The bundled SmolLM2-135M-Instruct in float32, loaded once per session, with a fixed cost curve cached."""
    from specdec.backends.timing_cache import cost_key
    from specdec.backends.torch import attention
    from specdec.engine import costs
    from specdec.models import load_model

    loaded = load_model("smollm2-135m", dtype="fp32")
    attention.save_plan(loaded, fixed_attention_plan())
    key = cost_key(loaded, costs.DEFAULT_SIZES, costs.DEFAULT_CONTEXT)
    curve = costs.CostModel(tuple(FIXED_COST_CURVE), tuple(FIXED_COST_CURVE.values()))
    costs.save_costs(costs.costs_folder(), key, curve)
    return loaded


@pytest.fixture(scope="session")
def engine(default_model):
    """An Engine on the default model (each generate() starts from its own prefill)."""
    from specdec.engine.loop import Engine

    return Engine(default_model)


DROPPED_LAYERS = (3, 4, 5, 6, 25, 26)  # the ones whose absence changes the argmax least
KEPT_LAYERS = tuple(i for i in range(30) if i not in DROPPED_LAYERS)


@pytest.fixture(scope="session")
def small_draft(default_model):
    """A draft sharing the default model's tokenizer: 24 of its own 30 layers (renumbered), norm and head.

    Leaves out the layers whose absence changes the argmax least: the target accepts about
    half its tokens, so both accepted runs and rejections occur.
    """
    target = default_model.model
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(KEPT_LAYERS)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in KEPT_LAYERS]
    draft = type(target)(config)
    state = {}
    for name, tensor in target.state_dict().items():
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            if int(index) not in KEPT_LAYERS:
                continue
            name = f"model.layers.{KEPT_LAYERS.index(int(index))}.{rest}"
        state[name] = tensor
    draft.load_state_dict(state, strict=True)
    return draft.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def bench_prompts(default_model, spec_bench_subset) -> dict[str, list[int]]:
    """Category -> the chat-templated prompt ids of its first question in the committed subset, and
    `counting`: an answer that repeats itself (what lookahead's Jacobi guesses are made for)."""
    from spec_prompts import prompts_by_category

    from specdec.prompts import encode_prompt

    prompts = prompts_by_category(default_model.tokenizer, spec_bench_subset)
    counting = encode_prompt(default_model.tokenizer, "Count from 1 to 40, separated by commas.", chat=True)
    return {**{name.rsplit("-", 1)[0]: ids for name, ids in prompts.items()}, "counting": counting}


@pytest.fixture(scope="session")
def plain_runs(engine, bench_prompts):
    """Plain decoding's outputs on `bench_prompts`, each computed once per session (`spec_prompts.PlainRuns`)."""
    from spec_prompts import PlainRuns

    return PlainRuns(engine, bench_prompts)
