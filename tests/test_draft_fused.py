"""A draft model on the fused 4-bit pass beside a target verified there, and a draft head over fewer token ids.

The bundled GGUF drafts for itself: on the fused pass a row's bits do not depend on the pass around it, so a
draft that is the target's own file computes, pass for pass, the logits the target verifies with, and every
drafted token is accepted (a draft on other weights or another path would miss some). A head cut to its first
rows gives those rows' logits, bit for bit, and the output stays the target's own.
"""

from __future__ import annotations

import pytest
import torch
from helpers import save_fixed_costs, tiny_llama

from specdec.backends.torch.invariant import kernel_runs_here
from specdec.backends.torch.packed import can_pack, packed_view, verify_model
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.kernels import q4_kernel
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers.draft import DraftConfig
from specdec.proposers.draft_module import LastLogitsOnly, with_head_rows
from specdec.proposers.plain import PlainProposer

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def gguf_bf16():
    if not (q4_kernel.load_extension() and kernel_runs_here()):
        pytest.skip("the fused pass needs specdec's extension and a CPU with AVX-512 BF16")
    return save_fixed_costs(load_model("smollm2-135m", dtype="bf16"))


@pytest.fixture(scope="module")
def prompt(gguf_bf16):
    return encode_prompt(gguf_bf16.tokenizer, "Name three rivers of Europe and the seas they flow into.", chat=True)


def _generate(loaded, proposer, prompt):
    return Engine(loaded).generate(prompt, proposer, GenerationConfig(max_new_tokens=NEW_TOKENS))


def test_a_gguf_draft_beside_a_fused_target_runs_the_fused_pass_and_agrees_on_every_token(gguf_bf16, prompt):
    plain = _generate(gguf_bf16, PlainProposer(), prompt).token_ids
    proposer = DraftConfig(draft_model="smollm2-135m", k=3, adaptive=False).build(gguf_bf16)
    assert proposer.runner.runs_fused and not isinstance(proposer.runner.model, LastLogitsOnly)
    out = _generate(gguf_bf16, proposer, prompt)
    assert out.token_ids == plain
    drafted = sum(step.tree_size - 1 for step in out.stats.steps)
    assert drafted > NEW_TOKENS // 2
    assert out.stats.acceptance_rate == 1.0  # the draft's logits are the verifier's, bit for bit


def test_the_servers_preparation_and_later_builds_reuse_one_fused_draft(gguf_bf16):
    config = DraftConfig(draft_model="smollm2-135m", vocab=4096)
    prepared = config.preparation().prepare(gguf_bf16)
    assert prepared.attention is not None and prepared.attention.is_invariant
    assert config.build_prepared(gguf_bf16, prepared).runner.runs_fused
    first, second = config.build(gguf_bf16), config.build(gguf_bf16)  # a proposer a request
    assert first.runner.model is second.runner.model is prepared.module  # the draft and its cut head made once
    first.begin([1, 2, 3])
    second.begin([4, 5, 6])
    assert first.runner.cache is not second.runner.cache and first.cached != second.cached  # each its own KV cache


def test_quantize_other_than_auto_keeps_the_draft_off_the_fused_pass(gguf_bf16):
    proposer = DraftConfig(draft_model="smollm2-135m", quantize="none", k=3, adaptive=False).build(gguf_bf16)
    assert not proposer.runner.runs_fused


def test_a_draft_head_over_fewer_token_ids_keeps_the_output_and_the_target(gguf_bf16, prompt):
    plain = _generate(gguf_bf16, PlainProposer(), prompt).token_ids
    proposer = DraftConfig(draft_model="smollm2-135m", vocab=2048, k=3, adaptive=False).build(gguf_bf16)
    assert proposer.runner.runs_fused
    assert proposer.runner.model.get_output_embeddings().out_features == 2048
    out = _generate(gguf_bf16, proposer, prompt)
    assert out.token_ids == plain
    # the draft is the target's own file, so it misses exactly where the answer's token lies past the cut
    assert any(token >= 2048 for token in plain) and 0 < out.stats.acceptance_rate < 1
    assert verify_model(gguf_bf16).get_output_embeddings().out_features == 49152  # the target's head is whole


def test_a_cut_head_of_8_bit_blocks_gives_its_rows_bits(gguf_bf16):
    view = verify_model(gguf_bf16)
    head = view.get_output_embeddings()
    assert hasattr(head, "blocks")  # the GGUF's own Q8_0 head
    cut = with_head_rows(view, 1000)
    assert cut.get_output_embeddings().out_features == 1008  # whole groups of 16 rows
    hidden = torch.randn(3, head.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(cut.get_output_embeddings()(hidden), head(hidden)[:, :1008])
    assert view.get_output_embeddings() is head


def test_a_cut_linear_head_gives_its_rows():
    model = tiny_llama()
    cut = with_head_rows(model, 7)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        full, part = model(ids).logits, cut(ids).logits
    assert part.shape[-1] == 7 and model.get_output_embeddings().out_features > 7
    torch.testing.assert_close(part, full[..., :7], rtol=0, atol=1e-6)


def test_a_head_that_cannot_be_cut_is_refused_clearly():
    model = tiny_llama()
    with pytest.raises(ValueError, match="vocab: 0 token ids"):
        with_head_rows(model, 0)
    with pytest.raises(ValueError, match="vocab: 100000 token ids"):
        with_head_rows(model, 100_000)
    with pytest.raises(ValueError, match="greater than or equal to 0|>= 0"):
        DraftConfig(draft_model="x", vocab=-1)


@pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="oneDNN packs no bf16 here (AVX2 only)")
def test_a_packed_head_is_refused_clearly():
    packed = packed_view(tiny_llama().to(torch.bfloat16))
    with pytest.raises(ValueError, match="PackedLinear cannot be cut"):
        with_head_rows(packed, 4)
