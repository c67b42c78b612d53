"""Our Medusa layout inside vLLM's CPU build: vLLM loads the shipped heads and drafts what we draft.

The Medusa heads shipped for the bundled model (`src/specdec/heads/...-medusa`)
are written again by `specdec.proposers.medusa.head.save_medusa(full_vocab=True)`
(vLLM 0.32 allocates every Medusa head at the full vocabulary, so it cannot
read the shipped reduced-vocabulary folder: its loader asserts on the shape)
and given to vLLM as `speculative_config={"method": "medusa", "model":
FOLDER}`. vLLM must (1) build its Medusa drafter from the folder,
(2) keep greedy output equal to plain decoding, and (3) propose, right after
each prompt's prefill, the heads' top-1 tokens that our own module computes
from the target's last hidden state (transformers): same blocks, same heads,
same token map, same feature.
"""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import MAX_TOKENS, NUM_PROMPTS
from test_eagle3_head import _install_recorder, _take_drafts

CHAIN_PROMPTS = 3
MIN_MARGIN = 1e-2  # a head whose top two logits are closer than this is a near tie: not compared


@pytest.fixture(scope="module")
def target(model_folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def heads_folder(target, tmp_path_factory):
    from specdec.drafters.shipped import HEADS_DIR
    from specdec.proposers.medusa.head import ARCHITECTURE, load_medusa, save_medusa

    folders = [p.parent for p in HEADS_DIR.glob("*/config.json") if ARCHITECTURE in p.read_text()]
    assert folders, "no Medusa heads ship with the package"
    heads = load_medusa(folders[0], target, dtype=torch.float32)
    return save_medusa(heads, tmp_path_factory.mktemp("medusa-full"), full_vocab=True)


@pytest.fixture(scope="module")
def medusa_run(model_folder, prompts, heads_folder):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = {"method": "medusa", "model": str(heads_folder), "num_speculative_tokens": 3}
    llm = LLM(
        model=model_folder, dtype="float32", max_model_len=2048, max_num_seqs=NUM_PROMPTS, enforce_eager=True,
        kv_cache_memory_bytes=1 << 30, speculative_config=spec, seed=0, enable_prefix_caching=False,
    )  # fmt: skip
    [drafter] = llm.collective_rpc(_install_recorder)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, greedy, use_tqdm=False)]
    llm.collective_rpc(_take_drafts)
    tokenizer = llm.get_tokenizer()
    firsts = []
    for prompt in prompts[:CHAIN_PROMPTS]:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(temperature=0.0, max_tokens=2))
        [drafts] = llm.collective_rpc(_take_drafts)
        firsts.append((ids, drafts[0][0]))
    del llm
    gc.collect()
    return {"drafter": drafter, "outputs": outputs, "firsts": firsts}


def test_vllm_builds_its_medusa_drafter_from_our_folder(medusa_run):
    assert "Medusa" in medusa_run["drafter"], medusa_run["drafter"]


def test_greedy_output_with_our_heads_equals_plain_decoding(runs, medusa_run):
    for i, (expected, got) in enumerate(zip(runs[None].outputs, medusa_run["outputs"], strict=True)):
        assert got == expected, f"prompt {i}: Medusa with our heads diverged from plain decoding"


@torch.inference_mode()
def test_vllm_drafts_the_tokens_our_heads_compute(medusa_run, heads_folder, target):
    from specdec.proposers.medusa.head import load_medusa

    heads = load_medusa(heads_folder, target, dtype=torch.float32)
    compared = 0
    for ids, theirs in medusa_run["firsts"]:
        state = target(torch.tensor([ids]), output_hidden_states=True).hidden_states[heads.layer_id][0, -1]
        logits = heads.draft_logits(state)  # [heads, V_d]
        top = logits.topk(2, dim=-1).values
        ours = heads.token_map[logits.argmax(-1)].tolist()
        for head, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if float(top[head, 0] - top[head, 1]) < MIN_MARGIN:
                continue
            assert a == b, f"head {head}: ours {ours}, vLLM's {theirs}"
            compared += 1
    assert compared >= CHAIN_PROMPTS, f"only {compared} heads were clear enough to compare"
