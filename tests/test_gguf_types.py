"""Every GGUF type a block kernel holds as stored (`gguf_blocks.HELD`), and what `pack auto` does with the rest.

- Q4_0, Q4_1, Q5_0, Q5_1, Q5_K, Q3_K, IQ4_NL and IQ4_XS blocks read as gguf's own dequantizer reads them, in
  the kernels' forms;
- a Llama file's q and k rows, which transformers reorders on load, are matched to the module's rows, so a
  one-layer Llama's int4 view of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q3_K / IQ4_NL / IQ4_XS file moves no weight
  (each was re-quantized to Q4_1's rule before, and moved);
- a file whose layers are of a type no kernel holds (F16, BF16) keeps `pack auto` off int4, says so once, and
  the reason `specdec-hf doctor` prints names the type.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers import write_gguf
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from specdec.backends.registry import explain
from specdec.backends.torch import gguf_blocks
from specdec.backends.torch.int4 import has_invariant_int4
from specdec.backends.torch.invariant import kernel_runs_here
from specdec.backends.torch.packed import Columns, pack_of, packed_view, rounded_products
from specdec.kernels import q4_kernel, q5
from specdec.models import LoadedModel

gguf = pytest.importorskip("gguf")
SMALL = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]


RANDOM = {"IQ4_NL": (32, 18, 0), "Q3_K": (256, 110, 108), "IQ4_XS": (256, 136, 0)}  # weights, bytes, where d sits


def file_bytes(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """`kind`'s bytes for random weights of about 0.02: gguf's own quantizer where it has one, else (IQ4_NL, Q3_K,
    IQ4_XS) random blocks with a small d."""
    rng = np.random.default_rng(seed)
    if kind not in RANDOM:
        values = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
    weights, size, at = RANDOM[kind]
    data = rng.integers(0, 256, (rows, cols // weights, size), dtype=np.uint8)
    data[..., at : at + 2] = (rng.random((rows, cols // weights, 1)) * 2e-4 + 1e-5).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def dequantized(raw: np.ndarray, kind: str) -> torch.Tensor:
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)


@pytest.mark.parametrize("kind", SMALL)
def test_small_blocks_read_as_gguf_reads_them(kind):
    raw = file_bytes(kind, 16, 256, seed=1)
    q, scale, minimum = gguf_blocks.small_blocks(raw, kind, 16, 256)
    assert scale.dtype == minimum.dtype == torch.float16 and scale.shape == (16, 8)
    if kind in gguf_blocks.FOUR_BIT:
        assert int(q.min()) >= 0 and int(q.max()) <= 15
        weight = q4_kernel.dequantize_q4(*q4_kernel.pack_q4(q, scale, minimum))
    elif kind == "Q5_1":
        assert q.dtype == torch.int8 and int(q.min()) >= 0 and int(q.max()) <= 31
        weight = q5.dequantize_q5(q, scale, minimum)
    else:
        assert q.dtype == torch.int8 and not minimum.any()
        weight = q4_kernel.dequantize_q8(*q4_kernel.pack_q8(q, scale))
    assert torch.equal(weight, dequantized(raw, kind))


def random_q5_k(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q5_K bytes whose weights stay small (d and dmin under ~1e-3): any bits are valid blocks."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // 256, gguf_blocks.Q5_K_BYTES), dtype=np.uint8)
    data[..., 0:4] = (rng.random((rows, cols // 256, 2)) * 1e-3 + 1e-4).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def test_q5_k_blocks_read_as_gguf_reads_them():
    raw = random_q5_k(16, 512, seed=2)
    q, scale, minimum = gguf_blocks.q5_k_blocks(raw, 16, 512)
    assert q.dtype == torch.int8 and int(q.min()) == 0 and int(q.max()) == 31 and scale.dtype == torch.float32
    assert torch.equal(q5.dequantize_q5(q, scale, minimum), dequantized(raw, "Q5_K"))


@pytest.mark.parametrize("kind", ["Q3_K", "IQ4_XS"])
def test_scale_per_16_blocks_read_as_gguf_reads_them(kind):
    raw = file_bytes(kind, 16, 512, seed=4)
    q, scale = (gguf_blocks.q3_k_blocks if kind == "Q3_K" else gguf_blocks.iq4_xs_blocks)(raw, 16, 512)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (16, 32)
    assert (int(q.min()), int(q.max())) == ((-4, 3) if kind == "Q3_K" else (-127, 113))
    assert torch.equal(q4_kernel.dequantize_q8(q, scale), dequantized(raw, kind))


def test_rows_are_matched_by_value_where_they_are_reordered():
    stored = torch.randn(12, 64).to(torch.bfloat16)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(gguf_blocks.row_order(stored, stored), torch.arange(12))
    assert torch.equal(stored[gguf_blocks.row_order(stored, stored[order])], stored[order])
    twice = stored.clone()
    twice[5] = twice[2]  # equal rows: either place serves
    assert torch.equal(twice[gguf_blocks.row_order(twice, twice[order])], twice[order])
    zeros = stored.clone()
    zeros[:, 0] = 0.0
    negative = zeros[order].clone()
    negative[:, 0] = -0.0  # Q4_0's d * (8 - 8) with a negative d
    assert torch.equal(zeros[gguf_blocks.row_order(zeros, negative)], negative)
    moved = stored[order].clone()
    moved[3, 7] += 1
    assert gguf_blocks.row_order(stored, moved) is None and gguf_blocks.row_order(stored, stored[:6]) is None


LLAMA_KINDS = {"attn_q": "Q4_0", "attn_k": "Q5_0", "attn_v": "IQ4_NL", "attn_output": "Q4_1",
               "ffn_gate": "Q3_K", "ffn_up": "IQ4_XS", "ffn_down": "Q5_1"}


def test_a_llama_files_reordered_q_and_k_rows_are_held_as_stored(tmp_path):
    """transformers' own reordering of a Llama file's q and k rows: the int4 view holds every product's file
    blocks (4-bit or 8-bit), in the module's row order, and says nothing of moved weights."""
    if not q5.held():  # Q5_1's blocks run on 8-bit activations
        pytest.skip(q4_kernel.unavailable_reason() or "no 8-bit activations here")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=256)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    layer, reorder = model.model.layers[0], LlamaTensorProcessor()._reverse_permute_weights
    tensors = {}
    for index, (module_name, tensor) in enumerate(gguf_blocks.LAYER_TENSORS.items()):
        linear, kind = layer.get_submodule(module_name), LLAMA_KINDS[tensor]
        raw = file_bytes(kind, linear.out_features, linear.in_features, seed=10 + index)
        weight = dequantized(raw, kind)
        if tensor in ("attn_q", "attn_k"):  # as transformers loads them
            weight = torch.from_numpy(reorder(weight.float().numpy(), 4, 4 if tensor == "attn_q" else 2)).to(torch.bfloat16)
            assert not torch.equal(weight, dequantized(raw, kind))
        linear.weight.data = weight
        tensors[f"blk.0.{tensor}.weight"] = (raw, gguf.GGMLQuantizationType[kind])
    write_gguf(tmp_path / "llama.gguf", tensors, "llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        view = packed_view(model, int4=True, gguf_path=tmp_path / "llama.gguf")
    assert rounded_products(view) == (0, 2)  # q's part of qkv, o; k, v, gate, up and down on 8-bit blocks
    ours = view.model.layers[0]
    assert isinstance(ours.self_attn.qkv_proj, Columns)
    q, k, v = ours.self_attn.qkv_proj.parts
    for product, module_name in [(q, "self_attn.q_proj"), (k, "self_attn.k_proj"), (v, "self_attn.v_proj"),
                                 *((ours.get_submodule(name), name) for name in
                                   ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))]:
        four, kind = isinstance(product, q4_kernel.Q4Linear), LLAMA_KINDS[gguf_blocks.LAYER_TENSORS[module_name]]
        assert four == (kind in gguf_blocks.FOUR_BIT), module_name
        if four:
            weight = q4_kernel.dequantize_q4(*product.blocks())
        elif kind == "Q5_1":
            assert isinstance(product, q5.Q5Linear)
            weight = q5.dequantize_q5(*product.blocks())
        else:
            weight = q4_kernel.dequantize_q8(*product.blocks())
        assert torch.equal(weight, layer.get_submodule(module_name).weight), module_name


@pytest.mark.parametrize(("stored", "unheld"), [({}, ()), ({"attn_q": "F16"}, ("F16",)),
                                                 ({"ffn_up": "BF16", "attn_v": "F16"}, ("BF16", "F16"))],
                         ids=["held", "f16", "bf16"])
def test_pack_auto_keeps_a_file_whose_layers_no_kernel_holds(tmp_path, stored, unheld):
    """4 bits would move an F16 or BF16 layer: `pack auto` keeps bf16 packing, and its reason names the types;
    a file of held types settles on int4 where the fused pass runs here."""
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=256)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    tensors = {}
    for module_name, tensor in gguf_blocks.LAYER_TENSORS.items():
        linear, kind = model.model.layers[0].get_submodule(module_name), stored.get(tensor, "Q4_0")
        values = linear.weight.detach().float().numpy()
        raw = values.astype(np.float16) if kind == "F16" else gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
        tensors[f"blk.0.{tensor}.weight"] = (raw, gguf.GGMLQuantizationType[kind])
    path = tmp_path / "layers.gguf"
    write_gguf(path, tensors)
    assert gguf_blocks.unheld_types(path) == unheld
    loaded = LoadedModel(model, None, "one-layer", gguf_path=path)
    if unheld:
        with pytest.warns(UserWarning, match=f"stores decoder layers as {', '.join(unheld)}.*--pack int4"):
            assert pack_of(loaded) == "auto"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once a loaded model
            why = explain(loaded)["pack"]
        assert f"stores layers as {', '.join(unheld)}" in why, why
    else:
        why = explain(loaded)["pack"]
        runs = has_invariant_int4(torch.bfloat16) and kernel_runs_here()
        assert pack_of(loaded) == ("int4" if runs else "auto") and "stores layers" not in why, why
    assert gguf_blocks.unheld_types(tmp_path / "missing.gguf") == ("unreadable",)



def test_5_bit_values_multiply_alike_on_every_path_and_row_alone():
    """`Q5Linear` (5-bit values in 8-bit blocks with a minimum): the same bits on every path of the 8-bit-activation
    kernel and for a row alone (M = 1..64), within fp32 rounding of the kernel's arithmetic in float64 (exact integer sums),
    fp16 (Q5_1) and fp32 (Q5_K) scales; a minimum left out moves it far past that."""
    from helpers import assert_i8_within_bound

    if not q5.held():
        pytest.skip("5-bit blocks run on 8-bit activations")
    generator = torch.Generator().manual_seed(3)
    q = torch.randint(0, 32, (48, 256), generator=generator)
    for dtype in (torch.float16, torch.float32):
        scale = (torch.rand(48, 8, generator=generator) * 0.01 + 1e-3).to(dtype)
        minimum = (-scale.float() * 16 * torch.rand(48, 8, generator=generator)).to(dtype)
        layer = q5.Q5Linear(q, scale, minimum)
        assert all(torch.equal(a, b) for a, b in zip(layer.blocks(), (q.to(torch.int8), scale, minimum), strict=True))
        x = torch.randn(64, 256).to(torch.bfloat16)
        every = layer(x)
        for rows in (1, 3, 4, 5, 8, 9, 10, 16, 17, 26, 63):  # a row's bits whatever M
            assert torch.equal(layer(x[:rows].contiguous()), every[:rows]), rows
        x, full = x[:11].contiguous(), every[:11]
        for path in torch.ops.specdec_q4.q4_linear_i8_paths():
            assert torch.equal(torch.ops.specdec_q4.q4_linear(x, layer.qs, layer.scale, layer.minimum, path), full), path
        assert torch.equal(layer(x[4:6]), full[4:6])
        assert_i8_within_bound(full, x, q, scale.float(), minimum.float())
        with pytest.raises(AssertionError):
            assert_i8_within_bound(full, x, q, scale.float(), torch.zeros_like(minimum, dtype=torch.float32))



def test_a_5_bit_head_stays_bf16(tmp_path):
    """A head's users (the draft vocabulary's cut rows, the top tokens) take 8-bit blocks' (q, scale): a Q5_1 head is
    left in bf16, said why; a Q3_K head runs as 8-bit blocks with a scale per 16."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    for kind, held in (("Q5_1", False), ("Q3_K", True)):
        raw = file_bytes(kind, 32, 256, seed=6)
        write_gguf(tmp_path / f"{kind}.gguf", {"output.weight": (raw, gguf.GGMLQuantizationType[kind])})
        head = torch.nn.Linear(256, 32, bias=False).to(torch.bfloat16)
        head.weight.data = dequantized(raw, kind)
        layer, why = gguf_blocks.head_q8(tmp_path / f"{kind}.gguf", head)
        if held:
            assert isinstance(layer, q4_kernel.Q8Linear) and why == ""
            assert torch.equal(q4_kernel.dequantize_q8(*layer.blocks()), head.weight)
        else:
            assert layer is None and "Q5_1" in why
