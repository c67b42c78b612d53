"""Prepacked Linear layers (specdec.backends.torch.packed): exact where `auto` packs, lossless where `on` packs.

bf16 on CPU: the packed view's logits must equal the original model's bit for bit
(prefill, a chain, a tree; SmolLM2 and a tiny Qwen2 whose q/k/v carry biases), its
q/k/v projections fused into one product included.
fp32 with `pack="on"`: not bit-identical (another summation order), so what the
contract asks is checked instead: every method's greedy output equals plain
decoding on the same packed engine. Large bf16 products over fewer than four rows
run padded to four: rows stay independent of each other and of the padding.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from helpers import prompts_by_category, tiny_qwen2

from specdec.backends.timing_cache import cost_file, cost_key
from specdec.backends.torch.packed import (
    PAD_MIN_WEIGHT,
    PAD_ROWS,
    FusedQKVAttention,
    PackedLinear,
    can_pack,
    packed_view,
    wants_packing,
)
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.proposers import parse_method

needs_bf16 = pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="no oneDNN bf16 here")


def _passes(model: torch.nn.Module, prompt: list[int]) -> list[torch.Tensor]:
    """Logits of a prefill, then a 5-token chain, then a 6-node tree below it."""
    target = TargetModel(model)
    out = [target.prefill(prompt)]
    out.append(target.forward_tree(torch.tensor([5, 6, 7, 8, 9]), torch.arange(-1, 4)))
    target.commit([0, 1, 2])
    out.append(target.forward_tree(torch.tensor([3, 4, 5, 6, 7, 8]), torch.tensor([-1, 0, 0, 1, 2, 2])))
    return out


@needs_bf16
@pytest.mark.parametrize("arch", ["smollm2", "qwen2"])
def test_bf16_packed_view_is_bit_identical(arch, default_model):
    model = copy.deepcopy(default_model.model if arch == "smollm2" else tiny_qwen2()).to(torch.bfloat16)
    assert wants_packing("auto", model)
    view = packed_view(model)
    packed = [m for m in view.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 5 * model.config.num_hidden_layers + 1  # qkv (fused) o gate up down, and the head
    fused = [m for m in view.modules() if isinstance(m, FusedQKVAttention)]
    assert len(fused) == model.config.num_hidden_layers
    assert isinstance(view.get_output_embeddings(), PackedLinear)
    assert type(view.get_input_embeddings()) is torch.nn.Embedding
    if arch == "qwen2":
        assert any(m.bias is not None for m in packed)
    prompt = list(range(20, 60))
    for mine, theirs in zip(_passes(view, prompt), _passes(model, prompt), strict=True):
        assert torch.equal(mine, theirs)
    rows = torch.tensor([prompt[:12], prompt[12:24]])  # [2, 12]: the batched engine's padded rows
    with torch.inference_mode():
        assert torch.equal(view(input_ids=rows).logits, model(input_ids=rows).logits)


@needs_bf16
def test_large_bf16_products_over_few_rows_run_padded_and_rows_stay_independent():
    torch.manual_seed(0)
    large = torch.nn.Linear(1024, PAD_MIN_WEIGHT // 1024 + 1, bias=True).to(torch.bfloat16)
    packed = PackedLinear(large)
    assert packed.min_rows == PAD_ROWS
    assert PackedLinear(torch.nn.Linear(64, 32).to(torch.bfloat16)).min_rows == 1  # small: not padded
    assert PackedLinear(torch.nn.Linear(1024, PAD_MIN_WEIGHT // 1024 + 1)).min_rows == 1  # fp32: not padded
    x = torch.randn(1, 3, 1024, dtype=torch.bfloat16)  # [B, T, in]
    others = torch.randn(5, 1024, dtype=torch.bfloat16)
    with torch.inference_mode():
        for rows in (1, 2, 3):
            got = packed(x[:, :rows])
            assert got.shape == (1, rows, large.out_features)
            # the same rows inside an unpadded product of more rows: the same bits
            batch = torch.cat([x[0, :rows], others])  # [rows + 5, in]
            alone = torch.ops.mkldnn._linear_pointwise(batch, packed.packed_weight, packed.bias, "none", [], "")
            assert torch.equal(got[0], alone[:rows])
        assert torch.equal(packed(x[:, :2]), large(x[:, :2]))  # two rows: as the unpacked layer


def test_the_original_model_is_left_alone(default_model):
    model = default_model.model
    before = {name: type(m) for name, m in model.named_modules()}
    view = packed_view(model)
    assert {name: type(m) for name, m in model.named_modules()} == before
    # Everything but the packed Linear weights is shared, not copied.
    assert view.get_input_embeddings().weight is model.get_input_embeddings().weight
    assert view.model.norm.weight is model.model.norm.weight
    assert view.config is not model.config  # the engine switches attention on its own view


def test_auto_leaves_fp32_alone_and_bad_values_are_refused(default_model):
    model = default_model.model
    assert not wants_packing("auto", model) and not wants_packing("off", model)
    assert wants_packing("on", model) == can_pack(torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="pack must be one of"):
        wants_packing("yes", model)
    assert Engine(default_model).target.model is model


@pytest.mark.slow
@pytest.mark.skipif(not can_pack(torch.float32, torch.device("cpu")), reason="no oneDNN here")
def test_fp32_packed_engine_is_lossless(default_model, spec_bench_subset):
    """Over 60 s (~60 s here): plain, pld and logitspec on three categories' prompts (short and long, prose and
    numbers), on the packed fp32 view, which is the only place the packed fp32 products decode whole texts."""
    loaded = dataclasses.replace(default_model, state_scope="packed", pack="on")
    engine = Engine(loaded)
    assert engine.target.model is not default_model.model
    assert type(engine.target.model.get_output_embeddings()) is torch.nn.Linear  # fp32: the target's own head path
    assert Engine(loaded).target.model is engine.target.model  # one view per model
    assert cost_key(loaded, (1,), 8)["packed"] and not cost_key(default_model, (1,), 8)["packed"]
    # each keeps its own file: timing one never overwrites the other's
    assert cost_file(Path("c"), cost_key(loaded, (1,), 8)) != cost_file(Path("c"), cost_key(default_model, (1,), 8))
    prompts = prompts_by_category(default_model.tokenizer, spec_bench_subset, ("mt_bench", "summarization",
                                                                                "math_reasoning"))
    config = GenerationConfig(max_new_tokens=32)
    plain = {name: engine.generate(prompt, parse_method("plain").build(loaded), config).token_ids
             for name, prompt in prompts.items()}  # fmt: skip
    for method in ("pld", "logitspec"):
        for name, prompt in prompts.items():
            got = engine.generate(prompt, parse_method(method).build(loaded), config).token_ids
            assert got == plain[name], (method, name)


@needs_bf16
def test_a_bf16_draft_is_packed_once_like_its_target(default_model):
    from specdec.backends.torch.packed import verify_model
    from specdec.proposers.draft import DraftConfig
    from specdec.proposers.draft_module import last_row_head

    model = copy.deepcopy(default_model.model).to(torch.bfloat16)
    loaded = dataclasses.replace(default_model, model=model, pack="on")  # bf16 packing (auto: int4 here)
    prepared = DraftConfig("self", quantize="none").prepare(loaded, model)
    assert prepared.module is verify_model(loaded)  # the target drafting for itself: one view
    assert any(isinstance(m, PackedLinear) for m in prepared.module.modules())
    assert last_row_head(prepared.module) is not None  # the draft's last-row head path takes the packed head
    # The packed self-draft drafts and is accepted (bf16: identity to plain is the fp32 suite's check).
    engine = Engine(loaded, attention="sdpa")
    prompt = default_model.tokenizer("def fibonacci(n):").input_ids
    proposer = DraftConfig("self", quantize="none", k=3, adaptive=False).build_prepared(loaded, prepared)  # a fixed chain: a self-draft never pays
    out = engine.generate(prompt, proposer, GenerationConfig(max_new_tokens=24))
    assert len(out.token_ids) == 24 and out.stats.mat > 2
    assert DraftConfig("self", quantize="none").prepare(default_model, default_model.model).module is default_model.model


def test_a_bad_pack_setting_is_refused_before_any_work():
    from specdec.bench.config import BenchConfig, BenchConfigError
    from specdec.choices import ModelSpec
    from specdec.models import load_model
    from specdec.serve.app import ServerConfig

    with pytest.raises(ValueError, match="pack must be one of"):
        load_model("no-such-model", pack="always")  # refused before the missing model is looked for
    with pytest.raises(ValueError, match="pack must be one of"):
        ModelSpec(pack="yes")  # what the CLI, BenchConfig, ServerConfig and the demo carry
    with pytest.raises(BenchConfigError, match="must be a ModelSpec"):
        BenchConfig(model="smollm2-135m")
    with pytest.raises(ValueError, match="must be a ModelSpec"):
        ServerConfig(model="smollm2-135m")


def test_exact_on_where_it_cannot_hold_is_a_clear_error(default_model):
    """Batch-invariant verification is shown for packed bf16 / fp16 on CPU only: fp32 asks get a one-line
    reason, as does a value that is not an option."""
    with pytest.raises(ValueError, match="exact=on needs bf16"):
        Engine(dataclasses.replace(default_model, exact="on"), attention="sdpa")
    with pytest.raises(ValueError, match="exact must be one of auto, off, on"):
        Engine(dataclasses.replace(default_model, exact="yes"), attention="sdpa")


def test_exact_auto_is_on_only_where_it_is_free(default_model):
    """auto, the default: on for bf16 where attention runs specdec's kernel, off (never an error) for fp32,
    for a backend that cannot verify invariantly, or where the kernel does not run."""
    from specdec.backends.torch.invariant import kernel_runs_here
    from specdec.backends.torch.packed import is_invariant
    from specdec.models.state import ModelState

    assert default_model.exact == "auto" and not is_invariant(default_model)  # fp32: the reference already
    bf16 = dataclasses.replace(default_model, model=copy.deepcopy(default_model.model).to(torch.bfloat16),
                               state=ModelState())
    assert is_invariant(bf16) == kernel_runs_here()
    assert not is_invariant(dataclasses.replace(bf16, backend="compiled"))
    assert not is_invariant(dataclasses.replace(bf16, exact="off"))
