"""A GGUF file's Q4_K layers read as the file stores them (`specdec.backends.torch.gguf_blocks`).

Q4_K's blocks (checked against gguf's own dequantizer) run on the 4-bit kernel as the file has them: q,
each block's six-bit (scale, min) and each 8 blocks' fp16 (d, dmin), exactly (the kernel's products with
them equal those with the expanded fp32 scales, bit for bit); an int4 view of a model loaded from such a
file multiplies by the file's weights instead of re-quantizing them (a Q4_K weight re-quantized by Q4_1's
rule moves); a layer whose file tensors mix Q4_K with another type holds fp32 scales (the Q4_K rows exact,
the others re-quantized), and one whose blocks are not the module's weights is re-quantized as before.
Q6_K and Q8_0 layers run from the file's blocks on the 8-bit kernels, in the fused pass too, and so do Q5_K
and Q5_1 layers (8-bit blocks with a minimum, `q5.Q5Linear`).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers import write_gguf
from transformers import Qwen2Config, Qwen2ForCausalLM

from specdec.backends.torch import gguf_blocks
from specdec.backends.torch.packed import packed_view, rounded_products
from specdec.kernels import q4_kernel, q5
from specdec.kernels.q4_kernel import Q4Linear, dequantize_q4, pack_q4

gguf = pytest.importorskip("gguf")
Q4_K = gguf.GGMLQuantizationType.Q4_K
Q6_K = gguf.GGMLQuantizationType.Q6_K
Q8_0 = gguf.GGMLQuantizationType.Q8_0
F16 = gguf.GGMLQuantizationType.F16


def random_q4_k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q4_K bytes [rows, cols / 256 * 144]: any bits are valid blocks once d and dmin are finite fp16."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // 256, gguf_blocks.Q4_K_BYTES), dtype=np.uint8)
    scales = (rng.random((rows, cols // 256, 2)) * 1e-3 + 1e-4).astype(np.float16)
    data[..., 0:4] = scales.view(np.uint8).reshape(rows, cols // 256, 4)
    return data.reshape(rows, -1)


def dequantized(raw: np.ndarray, kind: gguf.GGMLQuantizationType = Q4_K) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, kind))).to(torch.bfloat16)


def test_q4_k_bytes_read_as_gguf_reads_them():
    raw = random_q4_k(6, 512)
    q, pairs, supers = gguf_blocks.q4_k_blocks(raw, 6, 512)
    assert q.dtype == pairs.dtype == torch.uint8 and int(q.max()) <= 15 and int(pairs.max()) <= 63
    assert pairs.shape == (6, 16, 2) and supers.shape == (6, 2, 2) and supers.dtype == torch.float16
    scale, minimum = q4_kernel.q4_k_scales(pairs, supers)
    assert q4_kernel.exact_fp32_scales(scale) and q4_kernel.exact_fp32_scales(minimum)
    qs = pack_q4(q, scale, minimum, torch.float32)[0]
    assert torch.equal(dequantize_q4(qs, scale, minimum), dequantized(raw))
    assert torch.equal(dequantize_q4(qs, pairs, supers), dequantized(raw))
    # Q4_1's rule applied to the same values moves them: why the file's blocks are read, not re-quantized
    from specdec.backends.torch.int4 import quantize

    again, step, low = quantize(dequantized(raw))
    assert not torch.equal(dequantize_q4(pack_q4(again, step, low)[0], step.half(), low.half()), dequantized(raw))


def test_the_kernel_multiplies_by_the_files_q4_k_weights(op_or_skip):
    """The pairs as the file has them: one-hot rows return the file's weights; every row equals the product
    with the expanded fp32 scales, bit for bit, on each path; rows are independent of the batch."""
    from helpers import assert_within_bound, forced_paths

    raw = random_q4_k(37, 512, seed=5)
    q, pairs, supers = gguf_blocks.q4_k_blocks(raw, 37, 512)
    scale, minimum = q4_kernel.q4_k_scales(pairs, supers)
    qs = pack_q4(q, scale, minimum, torch.float32)[0]
    x = torch.randn(9, 512).to(torch.bfloat16)
    for path in forced_paths():
        assert torch.equal(op_or_skip(torch.eye(512)[:64], qs, pairs, supers, path), dequantized(raw)[:, :64].float().T)
        full = op_or_skip(x, qs, pairs, supers, path)
        assert torch.equal(full, op_or_skip(x, qs, scale, minimum, path)), path
        assert torch.equal(op_or_skip(x[3:5].contiguous(), qs, pairs, supers, path), full[3:5]), path
        assert_within_bound(full, x, dequantized(raw))
    with pytest.raises(RuntimeError, match="Q4_K scales must be"):
        op_or_skip(x, qs, pairs[:, :8].contiguous(), supers)
    layer = Q4Linear(qs, pairs, supers, activations="bf16")
    assert "q4_k scales" in repr(layer) and torch.equal(layer(x), op_or_skip(x, qs, pairs, supers))
    with pytest.raises(ValueError, match="Q4_K pairs must be"):
        Q4Linear(qs, pairs, supers[:, :1])


@pytest.fixture
def op_or_skip():
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    return torch.ops.specdec_q4.q4_linear


def test_module_names_map_to_the_files_tensors():
    assert gguf_blocks.gguf_name("layers.3.mlp.up_proj") == "blk.3.ffn_up.weight"
    assert gguf_blocks.gguf_name("layers.0.self_attn.o_proj") == "blk.0.attn_output.weight"
    assert gguf_blocks.gguf_name("layers.0.mlp") is None and gguf_blocks.gguf_name("lm_head") is None


def test_file_blocks_stack_q4_k_parts_and_requantize_the_rest(tmp_path):
    q_raw, k_raw = random_q4_k(16, 256, seed=1), random_q4_k(8, 256, seed=2)
    v_values = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32) * 0.02
    v_raw = gguf.quants.quantize(v_values, gguf.GGMLQuantizationType.Q8_0)
    path = tmp_path / "layers.gguf"
    write_gguf(path, {"blk.0.attn_q.weight": (q_raw, Q4_K), "blk.0.attn_k.weight": (k_raw, Q4_K),
                      "blk.0.attn_v.weight": (v_raw, gguf.GGMLQuantizationType.Q8_0)})
    weight = torch.cat([dequantized(q_raw), dequantized(k_raw), dequantized(v_raw, gguf.GGMLQuantizationType.Q8_0)])
    file = gguf_blocks.FileBlocks.of(path)
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    qs, scale, minimum = file.q4(names, weight)
    assert qs.shape == (32, 128) and scale.shape == (32, 8) and q4_kernel.exact_fp32_scales(scale)
    layer = dequantize_q4(qs, scale, minimum)
    assert torch.equal(layer[:24], weight[:24])  # the Q4_K rows: the file's weights exactly
    # the Q8_0 rows: re-quantized as an int4 view without the file does it (Q4_1's rule, fp16 steps)
    from specdec.backends.torch.int4 import quantize

    assert torch.equal(layer[24:], dequantize_q4(*pack_q4(*quantize(weight[24:]))))
    assert file.q4(names[2:], weight[24:]) is None  # no Q4_K part: the caller quantizes as before
    assert file.q4(["blk.0.attn_q.weight", None], weight) is None  # a module without a tensor
    moved = weight.clone()
    moved[0, 0] += 1
    assert file.q4(names, moved) is None  # blocks that are not the module's weights (e.g. reordered rows)
    assert gguf_blocks.FileBlocks.of(tmp_path / "missing.gguf") is None


def one_layer_qwen2() -> Qwen2ForCausalLM:
    """A one-layer bf16 Qwen2 of 256-wide layers (Q4_K's super-block); skips where the kernel cannot build."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=256)
    return Qwen2ForCausalLM(config).to(torch.bfloat16).eval()


def test_an_int4_view_multiplies_by_the_files_q4_k_weights(tmp_path):
    """A one-layer Qwen2 whose decoder weights are a Q4_K file's: its int4 view's products hold the file's
    blocks (fp32 scales, dequantizing to the module's weights bit for bit); without the file they are
    re-quantized (fp16 scales, moved)."""
    model = one_layer_qwen2()
    layer = model.model.layers[0]
    tensors = {}
    for index, (module_name, tensor) in enumerate(gguf_blocks.LAYER_TENSORS.items()):
        linear = layer.get_submodule(module_name)
        raw = random_q4_k(linear.out_features, linear.in_features, seed=10 + index)
        linear.weight.data = dequantized(raw)
        tensors[f"blk.0.{tensor}.weight"] = (raw, Q4_K)
    path = tmp_path / "model.gguf"
    write_gguf(path, tensors)
    view = packed_view(model, int4=True, gguf_path=path)
    products = {name: module for name, module in view.model.layers[0].named_modules() if isinstance(module, Q4Linear)}
    assert set(products) == {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    qkv = torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight])
    for name, product in products.items():
        expected = qkv if name == "self_attn.qkv_proj" else layer.get_submodule(name).weight
        assert product.scale.dtype == torch.uint8, name  # every part Q4_K: the file's pairs as they are
        assert torch.equal(dequantize_q4(*product.blocks()), expected), name
    plain = packed_view(model, int4=True).model.layers[0].mlp.up_proj
    assert plain.scale.dtype == torch.float16
    assert not torch.equal(dequantize_q4(*plain.blocks()), layer.mlp.up_proj.weight)


def test_an_int4_view_of_a_16_bit_file_says_its_weights_moved(tmp_path):
    """A GGUF storing its layers as F16: 4 bits cannot hold them, so the int4 view (what `pack auto` picks
    for a GGUF in bf16) warns, naming the file's types, and counts every product as moved; a Q4_K file's
    view holds its weights and says nothing."""
    model = one_layer_qwen2()
    layer = model.model.layers[0]
    halves, blocks = {}, {}
    for index, (module_name, tensor) in enumerate(gguf_blocks.LAYER_TENSORS.items()):
        linear = layer.get_submodule(module_name)
        halves[f"blk.0.{tensor}.weight"] = (linear.weight.detach().float().numpy().astype(np.float16), F16)
        raw = random_q4_k(linear.out_features, linear.in_features, seed=10 + index)
        blocks[f"blk.0.{tensor}.weight"] = (raw, Q4_K)
    write_gguf(tmp_path / "f16.gguf", halves)
    with pytest.warns(UserWarning, match=r"re-quantized 5 of 5 decoder products .* F16 x 7"):
        assert rounded_products(packed_view(model, int4=True, gguf_path=tmp_path / "f16.gguf")) == (5, 5)
    for module_name, tensor in gguf_blocks.LAYER_TENSORS.items():
        layer.get_submodule(module_name).weight.data = dequantized(blocks[f"blk.0.{tensor}.weight"][0])
    write_gguf(tmp_path / "q4_k.gguf", blocks)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rounded_products(packed_view(model, int4=True, gguf_path=tmp_path / "q4_k.gguf")) == (0, 5)


def small_q6_k(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q6_K bytes whose weights stay below ~0.5 (d under 1e-4): a random model's layers stay finite."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // 256, gguf_blocks.Q6_K_BYTES), dtype=np.uint8)
    data[..., 208:] = (rng.random((rows, cols // 256, 1)) * 1e-4).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def small_q8_0(rows: int, cols: int, seed: int) -> np.ndarray:
    """Q8_0 bytes of random weights of about 0.02 (gguf's own quantizer)."""
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.02
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)


Q5_1, Q5_K = gguf.GGMLQuantizationType.Q5_1, gguf.GGMLQuantizationType.Q5_K
def small_q5_k(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q5_K bytes with small d and dmin (weights under ~0.1)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // 256, gguf_blocks.Q5_K_BYTES), dtype=np.uint8)
    data[..., 0:4] = (rng.random((rows, cols // 256, 2)) * 5e-5 + 1e-5).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def small_q5_1(rows: int, cols: int, seed: int) -> np.ndarray:
    """Q5_1 bytes of random weights of about 0.02 (gguf's own quantizer)."""
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.02
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q5_1)


def _weight(product: torch.nn.Module) -> torch.Tensor:
    """The bf16 weight an 8-bit-kernel product (`Q8Linear`, `Q6Linear`, `q5.Q5Linear`) multiplies by."""
    blocks = product.blocks()
    return q5.dequantize_q5(*blocks) if len(blocks) == 3 else q4_kernel.dequantize_q8(*blocks)


MIXES = {  # (layer, tensor) -> type; Q4_K where not named
    "q4_k_m": {(0, "attn_v"): Q6_K, (0, "ffn_down"): Q6_K},
    "q8_0": {(layer, tensor): Q8_0 for layer in range(2) for tensor in gguf_blocks.LAYER_TENSORS.values()},
    # Q5_K_M's mix, one q as Q5_1 (a 5-bit file's fallback where a row is not a whole super-block)
    "q5_k_m": {**{(layer, tensor): Q5_K for layer in range(2) for tensor in gguf_blocks.LAYER_TENSORS.values()},
               (0, "attn_v"): Q6_K, (0, "ffn_down"): Q6_K, (1, "attn_q"): Q5_1},
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_8_bit_and_6_bit_layers_run_from_the_files_blocks_on_the_fused_pass(tmp_path, mix):
    """Q4_K_M's mix (layer 0's v and down stored as Q6_K, every other tensor Q4_K) and a Q8_0 file's: the int4
    view runs Q6_K tensors from their own bits (`Q6Linear`) and Q8_0 ones as 8-bit blocks (`Q8Linear`), each
    dequantizing to the module's weights bit for bit, a q, k and v of two types as products side by side
    (`Columns`); the fused pass on it computes what transformers' modules on the same view compute, and a
    prompt's rows get the bits of one-token passes."""
    from specdec.backends.torch.attention_plan import AttentionPlan
    from specdec.backends.torch.invariant import kernel_runs_here
    from specdec.backends.torch.packed import Columns
    from specdec.backends.torch.target import TargetModel
    from specdec.kernels.q5 import Q5Linear
    from specdec.kernels.q6_k import Q6Linear

    if not (q4_kernel.load_extension() and kernel_runs_here() and q4_kernel.default_activations() == "int8"):
        pytest.skip("8-bit and 6-bit layers run on 8-bit activations (AVX-512 VNNI), the fused pass on AVX-512 BF16")
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=256)
    torch.manual_seed(5)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    makers = {Q4_K: random_q4_k, Q6_K: small_q6_k, Q8_0: small_q8_0, Q5_K: small_q5_k, Q5_1: small_q5_1}
    tensors, kinds = {}, {}
    for index, (layer, (module_name, tensor)) in enumerate(
            (layer, item) for layer in range(2) for item in gguf_blocks.LAYER_TENSORS.items()):
        linear = model.model.layers[layer].get_submodule(module_name)
        kind = kinds[layer, module_name] = MIXES[mix].get((layer, tensor), Q4_K)
        raw = makers[kind](linear.out_features, linear.in_features, seed=20 + index)
        linear.weight.data = dequantized(raw, kind)
        tensors[f"blk.{layer}.{tensor}.weight"] = (raw, kind)
    path = tmp_path / f"{mix}.gguf"
    write_gguf(path, tensors)
    view = packed_view(model, int4=True, gguf_path=path)
    expected = {Q4_K: Q4Linear, Q6_K: Q6Linear, Q8_0: q4_kernel.Q8Linear, Q5_K: Q5Linear, Q5_1: Q5Linear}
    for layer, (ours, theirs) in enumerate(zip(view.model.layers, model.model.layers, strict=True)):
        for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            product, kind = ours.get_submodule(name), kinds[layer, name]
            assert type(product) is expected[kind], (layer, name)
            if kind != Q4_K:
                assert torch.equal(_weight(product), theirs.get_submodule(name).weight)
        qkv = ours.self_attn.qkv_proj
        if all(kinds[layer, f"self_attn.{p}_proj"] == Q4_K for p in "qkv"):
            assert isinstance(qkv, Q4Linear)
            continue
        assert isinstance(qkv, Columns)
        wide = [p for p in "qkv" if kinds[layer, f"self_attn.{p}_proj"] != Q4_K]
        for part, p in zip(qkv.parts[-len(wide):], wide, strict=True):
            assert torch.equal(_weight(part), theirs.get_submodule(f"self_attn.{p}_proj").weight)
    plan = AttentionPlan.invariant()
    fused, unfused = TargetModel(view, attention=plan), TargetModel(view, attention=plan)
    unfused._fused = None
    assert fused._fused is not None and fused._fused.parts == {"q4_k_m": [2, 1], "q8_0": [3, 3], "q5_k_m": [3, 3]}[mix]
    prompt = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(6))
    logits = []
    for target in (fused, unfused):
        target.reset()
        logits.append(target.append(prompt).float())
    ours, theirs = logits
    assert (ours - theirs).abs().max() <= 0.02 * theirs.abs().max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95
    fused.reset()
    singles = torch.cat([fused.append(prompt[t : t + 1]).float() for t in range(len(prompt))])
    assert torch.equal(singles, ours)


def test_a_q6_k_layer_without_8_bit_activations_keeps_the_files_values(tmp_path, monkeypatch):
    """Where the CPU runs no 8-bit activations a Q6_K layer is held as 8-bit blocks with a scale per 16: still
    the file's values (not re-quantized to 4 bits); a Q4_K tensor or another weight gets None (`q8` takes
    Q8_0 and Q6_K tensors only)."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    raw, q4_raw = small_q6_k(32, 256, seed=7), random_q4_k(32, 256, seed=8)
    path = tmp_path / "v.gguf"
    write_gguf(path, {"blk.0.attn_v.weight": (raw, gguf.GGMLQuantizationType.Q6_K), "blk.0.attn_k.weight": (q4_raw, Q4_K)})
    weight = dequantized(raw, gguf.GGMLQuantizationType.Q6_K)
    file = gguf_blocks.FileBlocks.of(path)
    monkeypatch.setattr(q4_kernel, "default_activations", lambda: "bf16")
    layer = file.q8("blk.0.attn_v.weight", weight)
    assert isinstance(layer, q4_kernel.Q8Linear)
    assert torch.equal(q4_kernel.dequantize_q8(*layer.blocks()), weight)
    assert file.q8("blk.0.attn_k.weight", dequantized(q4_raw)) is None
    assert file.q8("blk.0.attn_v.weight", weight + 1) is None
