"""Fixtures for specdec inside vLLM (run in .venv-vllm: `make test-vllm`; the main suite does not collect this folder).

One vLLM engine per method (startup is slow): plain decoding, then each of our
proposers, each in fp32 on the bundled model, each generating greedily for 8
Spec-Bench prompts (every category) in one batch and for a 1-token prompt. The
engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the tests can
read the proposer vLLM built through `LLM.collective_rpc`; each engine is
dropped before the next starts.

Hermetic like the main suite: the same cache folder under the temporary
directory (the bundled model is converted once for both suites), and no
SPECDEC_VLLM_* option from the caller's environment.
"""

from __future__ import annotations

import gc
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TEST_CACHE_HOME = Path(tempfile.gettempdir()) / f"specdec-tests-{os.getuid()}"  # as tests/conftest.py
SUBSET = Path(__file__).resolve().parent.parent / "tests" / "data" / "spec_bench_subset.jsonl"
NUM_PROMPTS = 8
MAX_TOKENS = 32
NUM_SPECULATIVE_TOKENS = 5
PROPOSERS = ("PromptLookupProposer", "LogitSpecProposer")


def pytest_configure(config):
    os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE_HOME)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    for name in [name for name in os.environ if name.startswith("SPECDEC_VLLM_")]:
        del os.environ[name]


@dataclass
class Run:
    """What one engine produced: token ids per prompt and for the 1-token prompt, and its proposer's state."""

    outputs: list[list[int]]
    short_output: list[int]
    proposer: dict[str, Any]  # of the proposer vLLM built: counters, runner found, request keys ({} without)
    vllm_config: Any


@pytest.fixture(scope="session")
def model_folder() -> str:
    from specdec.models import DEFAULT_MODEL, local_folder

    return str(local_folder(DEFAULT_MODEL))


@pytest.fixture(scope="session")
def prompts(model_folder) -> list[str]:
    """8 chat-formatted Spec-Bench questions: the first of each category, then the next ones in file order."""
    from transformers import AutoTokenizer

    from specdec.data import load_questions

    questions = load_questions(SUBSET)
    firsts = {q.category: q for q in reversed(questions)}
    chosen = list(firsts.values()) + [q for q in questions if q not in firsts.values()]
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True, tokenize=False)
        for q in chosen[:NUM_PROMPTS]
    ]


def _proposer_state(worker: Any) -> dict[str, Any]:
    """Runs in the engine (collective_rpc): a plain copy of what the tests check, no reference kept."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return {}
    return {
        "class": type(drafter).__name__,
        "counters": dict(drafter.counters),
        "runner_found": drafter.runner is not None,
        "request_keys": list(drafter.requests),
    }


def generate(model_folder: str, prompts: list[str], proposer: str | None) -> Run:
    """Start an engine (speculating with `proposer`, a class in specdec.integrations.vllm), generate, drop it."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = None
    if proposer is not None:
        spec = {
            "method": "custom_class",
            "model": f"specdec.integrations.vllm.{proposer}",
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        }
    llm = LLM(
        model=model_folder, dtype="float32", max_model_len=2048, max_num_seqs=NUM_PROMPTS, enforce_eager=True,
        kv_cache_memory_bytes=1 << 30, speculative_config=spec, seed=0,
    )  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, greedy, use_tqdm=False)]
    short = llm.generate([TokensPrompt(prompt_token_ids=[1])], SamplingParams(temperature=0.0, max_tokens=8))
    [state] = llm.collective_rpc(_proposer_state)
    run = Run(outputs, list(short[0].outputs[0].token_ids), state, llm.llm_engine.vllm_config)
    del llm
    gc.collect()
    return run


@pytest.fixture(scope="session")
def runs(model_folder, prompts) -> dict[str | None, Run]:
    """Plain decoding (key None) and each proposer in PROPOSERS, one engine each."""
    return {name: generate(model_folder, prompts, name) for name in (None, *PROPOSERS)}
