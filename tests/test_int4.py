"""pack="int4": 4-bit decoder weights (specdec.backends.torch.int4), the quantized model verified by every method.

The products equal x @ W_q.T for the dequantized weight W_q; a weight already on a Q4_1 grid (the
bundled model's decoder) comes back group for group; a row's bits do not depend on how many rows
share a call; plain decoding and the methods give the same tokens on the quantized model (fp32),
single and batched; settings that cannot hold are refused with a clear error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from helpers import assert_i8_within_bound, fixed_attention_plan, save_fixed_costs, tiny_llama

from specdec.backends.timing_cache import cost_file, cost_key
from specdec.backends.torch import attention, packed
from specdec.backends.torch.int4 import (
    GROUP,
    Int4Linear,
    dequantize,
    has_invariant_int4,
    int4_linear,
    quantize,
)
from specdec.backends.torch.packed import PackedLinear, is_invariant, packed_view, verify_model
from specdec.backends.torch.target import TargetModel
from specdec.engine import costs
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine, generate_batch
from specdec.kernels import q4_kernel
from specdec.models import LoadedModel, ModelState, load_model
from specdec.proposers import parse_method


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_equal_the_dequantized_weights_and_rows_stay_independent(dtype):
    """bf16 runs PyTorch's int4 kernel; fp32 multiplies by the dequantized weight."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 48, bias=True).to(dtype)
    layer = Int4Linear(linear)
    assert (layer.weight is None) == (dtype == torch.float32)
    x = torch.randn(16, 96).to(dtype)
    weight = dequantize(*_unpacked(linear, layer))
    expected = (x.float() @ weight.T + linear.bias.float()).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(layer(x), expected, atol=tolerance, rtol=tolerance)
    # 4 bits: the weight moves by at most half a step (1/30 of its group's range)
    groups = linear.weight.detach().float().reshape(48, -1, GROUP)
    rounding = 4e-3 if dtype == torch.bfloat16 else 1e-6  # bf16: the scale and zero are rounded too
    limit = (groups.amax(-1) - groups.amin(-1)) / 30 + rounding * groups.abs().amax(-1)
    assert ((weight - linear.weight.float()).abs().reshape(48, -1, GROUP) <= limit[..., None]).all()
    if dtype == torch.bfloat16:  # the kernel computes each row alone
        for rows in (1, 2, 3, 5, 8):
            assert torch.equal(layer(x[:rows]), layer(x)[:rows])


def _unpacked(linear: torch.nn.Linear, layer: Int4Linear) -> tuple[torch.Tensor, torch.Tensor]:
    q, _, _ = quantize(linear.weight)
    return q, layer.scale_zero


def test_q4_1_weights_come_back_group_for_group(default_model):
    """The bundled model's decoder came from Q4_1: re-quantizing it finds the same grid, to the bit."""
    layers = [m for m in default_model.model.model.layers.modules() if type(m) is torch.nn.Linear]
    assert len(layers) == 210
    for linear in layers[:14] + layers[-7:]:  # the first two and the last decoder layers
        weight = linear.weight.detach()
        q, step, low = quantize(weight)
        back = q.reshape(*step.shape, GROUP).float() * step[..., None] + low[..., None]
        assert torch.equal(back.reshape(weight.shape), weight)
    # A weight off any 4-bit grid does not (the check above can fail).
    weight = torch.randn(8, 64)
    q, step, low = quantize(weight)
    assert not torch.equal((q.reshape(8, 2, GROUP).float() * step[..., None] + low[..., None]).reshape(8, 64), weight)


def test_the_view_quantizes_the_decoder_and_keeps_the_head():
    model = tiny_llama()
    view = packed_view(model, int4=True)
    kinds = {type(m).__name__ for m in view.model.layers.modules()}
    assert "Int4Linear" in kinds and "Linear" not in kinds
    assert type(view.lm_head) in (torch.nn.Linear, PackedLinear) and view.lm_head.weight is model.lm_head.weight
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear  # the original is left alone
    prompt = list(range(10, 40))
    reference, quantized = TargetModel(model).prefill(prompt), TargetModel(view).prefill(prompt)
    assert 0 < (reference - quantized).abs().max() < 0.1 * reference.abs().max()  # another model, close by


def test_layers_the_kernel_cannot_take_keep_their_own_product():
    odd = torch.nn.Linear(48, 16)  # 48 input columns: not a whole number of groups
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Linear(odd)
    with pytest.raises(ValueError, match="out_features one of 16"):
        Int4Linear(torch.nn.Linear(64, 40))
    holder = torch.nn.Sequential(odd)
    assert packed_view(holder, int4=True)[0] is not odd and type(packed_view(holder, int4=True)[0]) is torch.nn.Linear


def test_bad_int4_settings_are_refused_before_loading():
    with pytest.raises(ValueError, match="pack must be one of auto, on, off, int4"):
        load_model("no-such-model", pack="int3")


needs_kernel = pytest.mark.skipif(not q4_kernel.load_extension(), reason=str(q4_kernel.unavailable_reason()))


@needs_kernel
def test_bf16_layers_run_the_few_row_kernel_on_the_same_grid():
    """bf16: specdec's kernel, multiplying by the weight on the 4-bit grid `quantize` found (rounded to
    bf16); fp32 keeps the dequantized weight (the suite's exact reference)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 48, bias=True).to(torch.bfloat16)
    layer = int4_linear(linear)
    assert type(layer) is q4_kernel.Q4Linear and type(int4_linear(linear.float())) is Int4Linear
    q, step, low = quantize(linear.weight)
    grid = (q.reshape(48, -1, GROUP).float() * step.half().float()[..., None] + low.half().float()[..., None])
    assert layer.activations == q4_kernel.default_activations()
    weight = q4_kernel.dequantize_q4(*layer.blocks())
    assert torch.equal(weight, grid.reshape(48, 96).to(torch.bfloat16))
    x = torch.randn(16, 96).to(torch.bfloat16)
    if layer.activations == "int8":  # the product before the bias
        y = torch.ops.specdec_q4.q4_linear(x, layer.qs, layer.scale, layer.minimum)
        assert_i8_within_bound(y, x, q, step.half().float(), low.half().float())
    else:
        expected = (x.float() @ weight.float().T + linear.bias.float()).to(torch.bfloat16)
        torch.testing.assert_close(layer(x), expected, atol=2e-2, rtol=2e-2)
    for rows in (1, 2, 3, 5, 8):  # each row computed alone
        assert torch.equal(layer(x[:rows]), layer(x)[:rows])


def test_without_the_kernel_bf16_layers_fall_back_and_say_so(monkeypatch):
    monkeypatch.setattr(q4_kernel, "load_extension", lambda: False)
    monkeypatch.setattr(q4_kernel, "unavailable_reason", lambda: "no compiler here; PyTorch's own int4 kernel is used")
    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="PyTorch's own int4 kernel is used"):
        layer = int4_linear(linear)
    assert type(layer) is Int4Linear
    assert not has_invariant_int4(torch.bfloat16)


def test_exact_on_int4_needs_the_kernel(monkeypatch):
    loaded = LoadedModel(tiny_llama().to(torch.bfloat16), None, "tiny-llama", pack="int4", exact="on")
    monkeypatch.setattr(packed, "has_invariant_int4", lambda dtype: False)
    with pytest.raises(ValueError, match="pack 'int4' and exact 'on' cannot be combined here"):
        is_invariant(loaded)


@pytest.fixture(scope="module")
def on_int4(default_model):
    """The default model (fp32) verified on 4-bit weights: a state of its own, the suite's cost curve."""
    loaded = dataclasses.replace(default_model, pack="int4", state=ModelState())
    attention.save_plan(loaded, fixed_attention_plan())
    key = cost_key(loaded, costs.DEFAULT_SIZES, costs.DEFAULT_CONTEXT)
    plain_key = cost_key(default_model, (1,), 8)
    assert key["weights"] == "int4" and plain_key["weights"] == "as loaded"
    # each configuration keeps its own curve file: neither re-times over the other's
    assert cost_file(Path("costs"), key) != cost_file(Path("costs"), plain_key)
    return save_fixed_costs(loaded)


def test_a_cost_curve_is_named_by_the_paths_it_was_timed_on(default_model):
    """An emulated CPU (SPECDEC_KERNELS, ATEN_CPU_CAPABILITY) times its own curve: the machine's flags are the same."""
    loaded = dataclasses.replace(default_model, pack="int4", state=ModelState())
    key = cost_key(loaded, (1,), 8)
    assert key["kernels"] == q4_kernel.kernels_in_use() and key["aten"] == torch.backends.cpu.get_cpu_capability()
    assert cost_key(default_model, (1,), 8)["kernels"] is None  # not int4: PyTorch's products alone
    capped = {**key, "kernels": "scalar+scalar" if key["kernels"] == "avx2+avx2" else "avx2+avx2"}  # another path
    assert key["kernels"].replace("+", "_") in cost_file(Path("c"), key).name
    assert cost_file(Path("c"), capped) != cost_file(Path("c"), key)


def _run(engine: Engine, prompts: list[list[int]], method: str, tokens: int = 32) -> list[list[int]]:
    loaded, settings = engine.loaded, GenerationConfig(max_new_tokens=tokens)
    if len(prompts) == 1:
        return [engine.generate(prompts[0], parse_method(method).build(loaded), settings).token_ids]
    outs = generate_batch(engine, prompts, lambda: parse_method(method).build(loaded), settings, max_batch=len(prompts))
    return [out.token_ids for out in outs]


def test_the_bundled_model_on_int4_is_itself(default_model, bench_prompts):
    """Its decoder is Q4_1 already: in fp32 the 4-bit view rebuilds the very weights (q, scale and zero
    give them back to the bit), so its logits are the model's own."""
    prompt = bench_prompts["qa"]
    own = TargetModel(default_model.model).prefill(prompt)
    view = packed_view(default_model.model, int4=True)
    assert any(type(m) is Int4Linear for m in view.modules())
    assert torch.equal(TargetModel(view).prefill(prompt), own)


def test_methods_are_lossless_on_int4_weights(on_int4, bench_prompts):
    engine = Engine(on_int4)
    assert any(type(m) is Int4Linear for m in engine.target.model.modules())
    assert verify_model(on_int4) is engine.target.model  # one view per model
    prompt = bench_prompts["summarization"][-320:]  # the article's end and the request: it still copies
    plain = _run(engine, [prompt], "plain")[0]
    assert _run(engine, [prompt], "logitspec")[0] == plain  # prompt lookup: the batched test below


@pytest.fixture(scope="module")
def int4_plain_40(on_int4, bench_prompts) -> list[list[int]]:
    """Plain decoding of three prompts on the int4 view, 40 tokens each: once for every method below."""
    engine = Engine(on_int4)
    return [_run(engine, [bench_prompts[name]], "plain", 40)[0] for name in ("qa", "math_reasoning", "translation")]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "logitspec", "eagle"])
def test_methods_are_lossless_on_int4_weights_batched(on_int4, int4_plain_40, bench_prompts, method):
    engine = Engine(on_int4)
    prompts = [bench_prompts[name] for name in ("qa", "math_reasoning", "translation")]
    plain = int4_plain_40
    assert _run(engine, prompts[:1], method, 40)[0] == plain[0]
    assert _run(engine, prompts, method, 40) == plain


@pytest.fixture(scope="module")
def exact_int4():
    """The bundled model in bf16 on 4-bit weights with exact verification: specdec's kernel."""
    if not q4_kernel.load_extension():
        pytest.skip(str(q4_kernel.unavailable_reason()))
    loaded = load_model("smollm2-135m", dtype="bf16", pack="int4", exact="on")
    return save_fixed_costs(loaded)


def test_exact_int4_methods_equal_plain_in_bf16(exact_int4, bench_prompts):
    """Rows computed alone by the kernel and the invariant attention: in bf16 a tree's nodes get the bits
    of one-token passes, so every method's greedy text is plain decoding's, single and batched."""
    engine = Engine(exact_int4)
    assert any(type(m) is q4_kernel.Q4Linear for m in engine.target.model.modules())
    prompts = [bench_prompts[name] for name in ("summarization", "math_reasoning")]
    plain = [_run(engine, [p], "plain", 48)[0] for p in prompts]
    for method in ("pld", "logitspec"):
        assert _run(engine, prompts[:1], method, 48)[0] == plain[0], method
        assert _run(engine, prompts, method, 48) == plain, method
