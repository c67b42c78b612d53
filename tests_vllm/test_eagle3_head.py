"""Our EAGLE-3 head layout inside vLLM's CPU build: vLLM loads what `save_head` writes and drafts what we draft.

A head with random weights and a reduced, shuffled draft vocabulary (so `d2t`
matters) is written by `specdec.proposers.eagle.head.save_head` for the bundled
model and given to vLLM as `speculative_config={"method": "eagle3", "model":
FOLDER}`. vLLM must (1) build its `Eagle3LlamaForCausalLM` from the folder,
(2) keep greedy output equal to plain decoding, and (3) propose, after each
prompt's prefill, the same 3-token chain as our own head computes from the
target's hidden states (transformers) with `load_head`: same layer ids, same
d2t direction, same norms and rotary positions. One engine for the module.
"""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import MAX_TOKENS, NUM_PROMPTS

DRAFT_VOCAB = 4096
NUM_SPECULATIVE_TOKENS = 3
CHAIN_PROMPTS = 3  # prompts whose first chain is compared, one engine request each
MIN_MARGIN = 1e-3  # a draft step whose top two logits are closer than this is a near tie: not compared


def _install_recorder(worker) -> str:
    """Runs in the engine (collective_rpc): keep a copy of every draft batch vLLM's drafter proposes."""
    drafter = worker.model_runner.drafter
    log: list[list[list[int]]] = []
    original = drafter.propose

    def propose(*args, **kwargs):
        out = original(*args, **kwargs)
        log.append(out.tolist())
        return out

    drafter.propose = propose
    drafter.specdec_draft_log = log
    return type(drafter).__name__


def _take_drafts(worker) -> list[list[list[int]]]:
    log = worker.model_runner.drafter.specdec_draft_log
    taken = [list(batch) for batch in log]
    log.clear()
    return taken


def target_ids(target, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target.name_or_path).encode(prompt, add_special_tokens=False)


@pytest.fixture(scope="module")
def target(model_folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def head_folder(target, prompts, tmp_path_factory):
    """A random head that still drafts varied chains: fc's input columns scaled by the spread of the
    target's features (else the target's outlier dimensions pick the same token everywhere), the layer's
    own output and the logits widened."""
    from specdec.proposers.eagle.head import Eagle3Head, default_layer_ids, head_config, save_head

    torch.manual_seed(0)
    config = head_config(target.config, default_layer_ids(target.config.num_hidden_layers), DRAFT_VOCAB)
    head = Eagle3Head(config, target.get_input_embeddings())
    with torch.inference_mode():
        ids = torch.tensor([target_ids(target, prompts[0])])
        hidden_states = target(ids, output_hidden_states=True).hidden_states
        features = torch.cat([hidden_states[layer][0] for layer in head.layer_ids], dim=-1)
    with torch.no_grad():
        head.fc.weight.div_(features.std(0).clamp_min(1e-3)[None])
        head.midlayer.self_attn.o_proj.weight.mul_(4.0)
        head.midlayer.mlp.down_proj.weight.mul_(4.0)
        head.lm_head.weight.mul_(8.0)  # wider gaps between the top logits: fewer near ties
    head.set_vocab(torch.randperm(config.vocab_size)[:DRAFT_VOCAB])
    return save_head(head, tmp_path_factory.mktemp("eagle3-head"))  # bf16, as the trainer writes it


@pytest.fixture(scope="module")
def eagle_run(model_folder, prompts, head_folder):
    """One vLLM engine drafting with our head: the batch's greedy outputs, then each chain prompt's drafts."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = {"method": "eagle3", "model": str(head_folder), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    llm = LLM(
        model=model_folder, dtype="float32", max_model_len=2048, max_num_seqs=NUM_PROMPTS, enforce_eager=True,
        kv_cache_memory_bytes=1 << 30, speculative_config=spec, seed=0,
        enable_prefix_caching=False,  # each chain prompt's first draft reads its whole prefill
    )  # fmt: skip
    [drafter] = llm.collective_rpc(_install_recorder)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, greedy, use_tqdm=False)]
    [batch_drafts] = llm.collective_rpc(_take_drafts)
    tokenizer = llm.get_tokenizer()
    chains = []
    for prompt in prompts[:CHAIN_PROMPTS]:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        out = llm.generate(
            [TokensPrompt(prompt_token_ids=ids)], SamplingParams(temperature=0.0, max_tokens=2)
        )
        [drafts] = llm.collective_rpc(_take_drafts)
        chains.append((ids, out[0].outputs[0].token_ids[0], drafts[0][0]))  # the draft after the prefill
    del llm
    gc.collect()
    return {"drafter": drafter, "outputs": outputs, "batch_drafts": batch_drafts, "chains": chains}


@torch.inference_mode()
def _our_chain(head, target, ids: list[int], first: int) -> tuple[list[int], list[float]]:
    """The head's greedy 3-token chain after a prefill of `ids` whose sampled token is `first`, and each
    step's top-two logit margin. Position t holds the target's feature at t and token t + 1."""
    hidden_states = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
    features = torch.cat([hidden_states[layer][0] for layer in head.layer_ids], dim=-1)  # [n, 3H]
    n = len(ids)
    hidden = head.fuse(features)[None]
    q, keys, values = head.qkv(hidden, torch.tensor([ids[1:] + [first]]), torch.arange(n)[None])
    mask = torch.arange(n)[:, None] >= torch.arange(n)[None]
    logits, state = head.finish(hidden, q, keys, values, mask[None, None])
    logits, state = logits[:, -1:], state[:, -1:]
    chain, margins = [], []
    for step in range(NUM_SPECULATIVE_TOKENS):
        top = logits[0, 0].topk(2).values
        margins.append(float(top[0] - top[1]))
        chain.append(int(head.draft_ids[logits[0, 0].argmax()]))
        if step + 1 == NUM_SPECULATIVE_TOKENS:
            break
        q, k, v = head.qkv(state, torch.tensor([[chain[-1]]]), torch.tensor([[n + step]]))
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        logits, state = head.finish(
            state, q, keys, values, torch.ones(1, 1, 1, keys.shape[2], dtype=torch.bool)
        )
    return chain, margins


def test_vllm_builds_its_eagle3_drafter_from_our_folder(eagle_run):
    assert eagle_run["drafter"] in ("EagleProposer", "SpecDecodeBaseProposer", "LLMBaseProposer") or (
        "Eagle" in eagle_run["drafter"]
    ), eagle_run["drafter"]
    drafted = [row for batch in eagle_run["batch_drafts"] for row in batch]
    assert drafted and all(len(row) == NUM_SPECULATIVE_TOKENS for row in drafted)


def test_greedy_output_with_our_head_equals_plain_decoding(runs, eagle_run):
    plain = runs[None].outputs
    assert len(eagle_run["outputs"]) == NUM_PROMPTS
    for i, (expected, got) in enumerate(zip(plain, eagle_run["outputs"], strict=True)):
        assert got == expected, f"prompt {i}: EAGLE-3 with our head diverged from plain decoding"


def test_vllm_drafts_the_chain_our_head_computes(eagle_run, head_folder, target):
    from specdec.proposers.eagle.head import load_head

    head = load_head(head_folder, target, dtype=torch.float32)
    compared, chains = 0, []
    for i, (ids, first, theirs) in enumerate(eagle_run["chains"]):
        ours, margins = _our_chain(head, target, ids, first)
        chains.append(ours)
        for step, (a, b, margin) in enumerate(zip(ours, theirs, margins, strict=True)):
            if margin < MIN_MARGIN:
                break  # a near tie: this step and the ones after it may differ by rounding alone
            assert a == b, (
                f"prompt {i}, draft step {step + 1}: ours {ours}, vLLM's {theirs} (margins {margins})"
            )
            compared += 1
    assert compared >= CHAIN_PROMPTS, f"only {compared} draft steps were clear enough to compare"
    assert any(len(set(chain)) > 1 for chain in chains), f"degenerate chains {chains}: steps 2+ test nothing"
