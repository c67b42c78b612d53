"""Shared test fixtures.

Hermetic by construction: before any test runs, `XDG_CACHE_HOME` points at a
folder under the system's temporary directory, so converted models, cost curves
and calibrations are written there and never into the user's ~/.cache (child
processes such as the test server inherit it). The folder is kept between runs,
so the bundled model is converted once (~20 s), not once per run. One thing is
shared with the user's cache: the C++ extension's build folder (`extensions/`),
which `make install` has just compiled (~70 s) from the same sources; the build
checks its sources itself and rebuilds what changed.

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


def pytest_configure(config):
    share_extension_builds()
    os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE_HOME)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        # Under pytest-xdist the cores are shared: each worker (and the servers it starts) takes its
        # share, so the workers do not fight over one another's threads.
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


def share_extension_builds() -> None:
    """Point the suite's `specdec/extensions` at the user's (where it exists and the suite has none of its own):
    a fresh clone's `make test` then reuses the build `make install` made instead of compiling it again."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    users = (Path(base).expanduser() if base else Path.home() / ".cache") / "specdec" / "extensions"
    ours = TEST_CACHE_HOME / "specdec" / "extensions"
    if users == ours or not users.is_dir() or ours.exists() or ours.is_symlink():
        return
    ours.parent.mkdir(parents=True, exist_ok=True)
    try:
        ours.symlink_to(users, target_is_directory=True)
    except FileExistsError:  # another xdist worker linked it first
        pass


@pytest.fixture(scope="session")
def spec_bench_subset() -> Path:
    """The committed test subset of Spec-Bench: 2 questions of each category (12 rows)."""
    return Path(__file__).parent / "data" / "spec_bench_subset.jsonl"


@pytest.fixture(scope="session")
def default_model():
    """The bundled SmolLM2-135M-Instruct in float32, loaded once per session, with a fixed cost curve cached."""
    from helpers import fixed_attention_plan, save_fixed_costs

    from specdec.backends.torch import attention
    from specdec.models import load_model

    loaded = load_model("smollm2-135m", dtype="fp32")
    attention.save_plan(loaded, fixed_attention_plan())
    return save_fixed_costs(loaded)


@pytest.fixture(scope="session")
def engine(default_model):
    """An Engine on the default model (each generate() starts from its own prefill); no floor: every
    step drafts as its proposer chose, so tests see a method's own trees."""
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
    from helpers import prompts_by_category

    from specdec.prompts import encode_prompt

    prompts = prompts_by_category(default_model.tokenizer, spec_bench_subset)
    counting = encode_prompt(default_model.tokenizer, "Count from 1 to 40, separated by commas.", chat=True)
    return {**{name.rsplit("-", 1)[0]: ids for name, ids in prompts.items()}, "counting": counting}


@pytest.fixture(scope="session")
def plain_runs_of(engine, tmp_path_factory, worker_id):
    """prompts -> plain decoding's outputs on them, each computed once per run (`helpers.PlainRuns`: under
    pytest-xdist the workers share them through the run's base folder, keyed by the prompt's ids)."""
    from helpers import PlainRuns

    shared = tmp_path_factory.getbasetemp().parent if worker_id != "master" else None
    return lambda prompts: PlainRuns(engine, prompts, shared)


@pytest.fixture(scope="session")
def plain_runs(plain_runs_of, bench_prompts):
    """Plain decoding's outputs on `bench_prompts` (`plain_runs_of`)."""
    return plain_runs_of(bench_prompts)


@pytest.fixture(scope="session")
def stdlib_datastore(default_model, tmp_path_factory) -> Path:
    """A REST datastore over a few standard-library modules (`helpers.CORPUS`), for the default tokenizer."""
    from helpers import CORPUS

    from specdec.datastore_build import build_datastore

    return build_datastore(CORPUS, default_model.tokenizer, tmp_path_factory.mktemp("ds") / "stdlib").out_dir


@pytest.fixture(scope="module")
def tiny(default_model):
    """A tiny random Llama target over the default model's tokenizer (`helpers.tiny_target`)."""
    from helpers import tiny_target

    from specdec.models import LoadedModel

    return LoadedModel(tiny_target(len(default_model.tokenizer)), default_model.tokenizer, "tiny-llama", pack="off")


@pytest.fixture(scope="module")
def data_file(tiny, tmp_path_factory):
    """Chats (`helpers.TEXTS`), and the tiny target's own continuations of them (already tokenized): what
    the trained-head tests train on."""
    import json

    from helpers import TEXTS

    from specdec.engine.generation import GenerationConfig
    from specdec.engine.loop import Engine
    from specdec.proposers.plain import PlainProposer

    path = tmp_path_factory.mktemp("data") / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": t[:40]}, {"role": "assistant", "content": t}]} for t in TEXTS]
    engine = Engine(tiny, attention="sdpa")
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    for ids in (tiny.tokenizer(t)["input_ids"] for t in TEXTS):
        rows.append({"input_ids": ids + engine.generate(ids, PlainProposer(), config).token_ids})
    path.write_text("\n".join(json.dumps(r) for r in rows * 4) + "\n")
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under `--dist loadgroup` a group runs on one worker: a test module is one group (its module fixtures
    built once), unless a test names its own group (test_lossless.py's cases, each serving its rows in turn).

    tryfirst: pytest-xdist reads the groups in its own hook of the same name (it appends them to the test
    ids); run after it, these markers are ignored and every module is split over both workers
    (`test_suite_guards.py` checks that the groups take effect)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_terminal_summary(terminalreporter):
    """A run where every C++ kernel test skipped says so in the log (`helpers.kernel_test_outcomes`)."""
    from helpers import kernel_test_outcomes

    passed, skipped, reasons = kernel_test_outcomes(terminalreporter.stats)
    if passed == 0 and skipped == 0:
        return  # no kernel test was selected
    if passed == 0:
        terminalreporter.section("C++ kernels NOT TESTED", sep="!", red=True, bold=True)
        terminalreporter.line(f"all {skipped} kernel tests skipped on this machine; why: {'; '.join(sorted(reasons))}")
    else:
        terminalreporter.line(f"kernel tests: {passed} passed, {skipped} skipped on this CPU")
