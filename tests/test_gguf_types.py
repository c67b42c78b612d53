"""Every GGUF type a block kernel holds as stored (`gguf_blocks.HELD`), and what `pack auto` does with the rest.

- Q4_0, Q4_1, Q5_0 and IQ4_NL blocks read as gguf's own dequantizer reads them, in the kernels' forms;
- a Llama file's q and k rows, which transformers reorders on load, are matched to the module's rows, so a
  one-layer Llama's int4 view of a Q4_0 / Q4_1 / Q5_0 / IQ4_NL file moves no weight (each was re-quantized
  to Q4_1's rule before, and moved);
- a file whose layers are of a type no kernel holds (F16, Q5_1) keeps `pack auto` off int4, says so once, and
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
from specdec.backends.torch import gguf_blocks, q4_kernel
from specdec.backends.torch.int4 import has_invariant_int4
from specdec.backends.torch.invariant import kernel_runs_here
from specdec.backends.torch.packed import Columns, pack_of, packed_view, rounded_products
from specdec.models import LoadedModel

gguf = pytest.importorskip("gguf")
SMALL = ["Q4_0", "Q4_1", "Q5_0", "IQ4_NL"]


def file_bytes(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """`kind`'s bytes for random weights of about 0.02: gguf's own quantizer where it has one, else (IQ4_NL)
    random blocks with a small d."""
    rng = np.random.default_rng(seed)
    if kind != "IQ4_NL":
        values = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
    data = rng.integers(0, 256, (rows, cols // 32, 18), dtype=np.uint8)
    data[..., :2] = (rng.random((rows, cols // 32, 1)) * 2e-4 + 1e-5).astype(np.float16).view(np.uint8)
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
    else:
        assert q.dtype == torch.int8 and not minimum.any()
        weight = q4_kernel.dequantize_q8(*q4_kernel.pack_q8(q, scale))
    assert torch.equal(weight, dequantized(raw, kind))


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
               "ffn_gate": "Q4_0", "ffn_up": "Q5_0", "ffn_down": "Q4_1"}


def test_a_llama_files_reordered_q_and_k_rows_are_held_as_stored(tmp_path):
    """transformers' own reordering of a Llama file's q and k rows: the int4 view holds every product's file
    blocks (4-bit or 8-bit), in the module's row order, and says nothing of moved weights."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
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
    assert rounded_products(view) == (0, 4)  # q's part of qkv, o, gate, down; k, v and up on 8-bit blocks
    ours = view.model.layers[0]
    assert isinstance(ours.self_attn.qkv_proj, Columns)
    q, k, v = ours.self_attn.qkv_proj.parts
    for product, module_name in [(q, "self_attn.q_proj"), (k, "self_attn.k_proj"), (v, "self_attn.v_proj"),
                                 *((ours.get_submodule(name), name) for name in
                                   ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))]:
        four = isinstance(product, q4_kernel.Q4Linear)
        assert four == (LLAMA_KINDS[gguf_blocks.LAYER_TENSORS[module_name]] in gguf_blocks.FOUR_BIT), module_name
        weight = q4_kernel.dequantize_q4(*product.blocks()) if four else q4_kernel.dequantize_q8(*product.blocks())
        assert torch.equal(weight, layer.get_submodule(module_name).weight), module_name


@pytest.mark.parametrize(("stored", "unheld"), [({}, ()), ({"attn_q": "F16"}, ("F16",)),
                                                 ({"ffn_up": "Q5_1", "attn_v": "F16"}, ("F16", "Q5_1"))],
                         ids=["held", "f16", "q5_1"])
def test_pack_auto_keeps_a_file_whose_layers_no_kernel_holds(tmp_path, stored, unheld):
    """4 bits would move an F16 or Q5_1 layer: `pack auto` keeps bf16 packing, and its reason names the types;
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
