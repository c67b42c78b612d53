"""The 8-bit block kernel (`q8_linear`, `Q8Linear`) against its pure-PyTorch reference, and a GGUF's
Q8_0 or Q6_K head read from the file (`specdec.backends.torch.gguf_blocks`).

The formats are llama.cpp's Q8_0 (checked against gguf's own quantizer and dequantizer) and Q6_K read as
q - 32 with int8 sub-scales and an fp16 d (checked against gguf's dequantizer; multiplied from those bits
on 8-bit activations, `test_q6_k.py`, else as 8-bit blocks with an fp32 scale per 16 weights); the kernel
multiplies by `dequantize_q8`'s weights bit for bit, within the fp32 summation bound of the reference,
and gives every row the same bits whatever the rows beside it, on each C++ path this CPU runs. On the
bundled model the int4 view's head is the GGUF's own Q8_0 blocks, equal to the bf16 model's head.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import assert_i8_within_bound, assert_within_bound, forced_paths

from specdec.backends.torch import gguf_blocks
from specdec.kernels import q4_kernel, q6_k
from specdec.kernels.q4_kernel import BLOCK, Q8Linear, dequantize_q8, pack_q8, reference_q8_linear

# [N, K]: SmolLM2-135M's head (a slice of its 49,152 rows; 999: not a multiple of the 4-column tiles),
# Qwen2.5-Coder-1.5B's (a slice), and a decoder-sized weight.
SHAPES = {"smollm2 head (999 rows)": (999, 576), "qwen head (1000 rows)": (1000, 1536), "down": (576, 1536)}
ROWS = (1, 2, 3, 4, 5, 17, 64)


@pytest.fixture(scope="module")
def op():
    """torch.ops.specdec_q4.q8_linear, or a skip saying why the extension cannot be built here."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    return torch.ops.specdec_q4.q8_linear


def random_q8(rows: int, cols: int, seed: int = 0, per16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 blocks, or (per16) q in -32..31 with an fp32 scale per 16 weights, as a Q6_K tensor reads."""
    generator = torch.Generator().manual_seed(seed)
    if per16:
        q = torch.randint(-32, 32, (rows, cols), generator=generator, dtype=torch.int8)
        return q, torch.rand(rows, cols // 16, generator=generator) * 1e-3 + 1e-5
    q = torch.randint(-128, 128, (rows, cols), generator=generator)
    scale = torch.rand(rows, cols // BLOCK, generator=generator) * 1e-3 + 1e-5
    return pack_q8(q, scale)


def random_q6_k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q6_K bytes [rows, cols / 256 * 210]: any bits are valid blocks once each d is a finite fp16."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // 256, gguf_blocks.Q6_K_BYTES), dtype=np.uint8)
    data[..., 208:] = (rng.random((rows, cols // 256, 1)) * 1e-2).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def test_q6_k_bytes_read_as_gguf_reads_them():
    """A Q6_K tensor's blocks (q - 32 and d * scale) dequantize to gguf's own values for it, in bf16."""
    gguf = pytest.importorskip("gguf")
    raw = random_q6_k(6, 512)
    qs, sub, d = gguf_blocks.q6_k_blocks(raw, 6, 512)
    assert sub.dtype == torch.int8 and sub.shape == (6, 32) and d.dtype == torch.float16 and d.shape == (6, 2)
    scale = q6_k.scales(sub, d)
    assert qs.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (6, 32)
    assert int(qs.min()) >= -32 and int(qs.max()) <= 31
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K)
    assert torch.equal(dequantize_q8(qs, scale), torch.from_numpy(np.ascontiguousarray(expected)).to(torch.bfloat16))


def test_q8_0_bytes_read_as_gguf_writes_and_reads_them():
    """gguf's own Q8_0 quantizer writes the blocks; read back, they dequantize to gguf's values (in bf16)."""
    gguf = pytest.importorskip("gguf")
    weights = np.random.default_rng(0).standard_normal((6, 128)).astype(np.float32)
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    qs, scale = gguf_blocks.q8_0_blocks(raw, 6, 128)
    assert qs.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (6, 4)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(dequantize_q8(qs, scale), torch.from_numpy(np.ascontiguousarray(expected)).to(torch.bfloat16))


def test_quantize_q8_writes_ggufs_q8_0_bytes():
    """`quantize_q8` (the drafting heads' 8-bit blocks) is ggml's Q8_0 rule: gguf's own quantizer's bits,
    a block of zeros and a half-way value included."""
    gguf = pytest.importorskip("gguf")
    weights = np.random.default_rng(1).standard_normal((6, 128)).astype(np.float32)
    weights[1, :32] = 0.0
    weights[3, :32] = np.r_[63.5, np.arange(31) * 0.5 - 7.25].astype(np.float32)  # d 0.5: w / d is x.5 for most
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    qs, scale = q4_kernel.quantize_q8(torch.from_numpy(weights))
    expected_qs, expected_scale = gguf_blocks.q8_0_blocks(raw, 6, 128)
    assert torch.equal(qs, expected_qs) and torch.equal(scale, expected_scale)
    assert int(qs[3, 1]) == -15  # -7.25 / 0.5 = -14.5: half away from zero, not to even


def test_pack_refuses_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_q8(torch.zeros(2, 48, dtype=torch.int64), torch.ones(2, 1))
    with pytest.raises(ValueError, match="-128..127"):
        pack_q8(torch.full((2, 32), 128), torch.ones(2, 1))
    with pytest.raises(ValueError, match="scale must be"):
        pack_q8(torch.zeros(2, 64, dtype=torch.int64), torch.ones(2, 1))


@pytest.mark.parametrize("per16", [False, True], ids=["q8_0", "scale per 16"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_kernel_multiplies_by_the_reference_weights_and_rows_are_independent(op, shape, per16):
    rows, cols = SHAPES[shape]
    qs, scale = random_q8(rows, cols, seed=len(shape), per16=per16)
    weight = dequantize_q8(qs, scale)
    x = torch.randn(max(ROWS), cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for path in forced_paths():
        one_hot = torch.eye(cols, dtype=torch.bfloat16)[: 64]
        assert torch.equal(op(one_hot, qs, scale, path), weight[:, :64].T), path
        full = op(x, qs, scale, path)
        assert_within_bound(full, x, weight)
        for count in ROWS:  # every prefix and a window in the middle: the same bits per row
            assert torch.equal(op(x[:count].contiguous(), qs, scale, path), full[:count]), (path, count)
        assert torch.equal(op(x[5:9].contiguous(), qs, scale, path), full[5:9]), path


def test_fp32_activations_are_rounded_to_bf16_first(op):
    qs, scale = random_q8(40, 96)
    x = torch.randn(3, 96)
    assert torch.equal(op(x, qs, scale).to(torch.bfloat16), op(x.to(torch.bfloat16), qs, scale))  # fp32 out: unrounded
    torch.testing.assert_close(op(x, qs, scale), reference_q8_linear(x, qs, scale), rtol=1e-4, atol=1e-4)


def test_bad_input_gets_a_clear_error(op):
    qs, scale = random_q8(8, 64)
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="qs must be int8"):
        op(x, qs.view(torch.uint8), scale)
    with pytest.raises(RuntimeError, match="float16"):
        op(x, qs, scale.float())  # fp32 scales are one per 16 weights
    with pytest.raises(RuntimeError, match="float16"):
        op(x, qs, scale.double())
    with pytest.raises(RuntimeError, match="need \\[N, K\\]"):
        op(torch.randn(2, 96), qs, scale)
    with pytest.raises(RuntimeError, match="path must be"):
        op(x, qs, scale, "avx9000")


def test_q8_linear_module(op):
    qs, scale = random_q8(48, 96)
    bias = torch.randn(48)
    layer = Q8Linear(qs, scale, bias, activations="bf16")  # the 8-bit-activation form: test_q4_i8.py
    assert "in_features=96, out_features=48" in repr(layer) and "a scale per 32" in repr(layer)
    x = torch.randn(2, 5, 96)
    expected = (op(x.reshape(10, 96), qs, scale) + bias).reshape(2, 5, 48)
    assert torch.equal(layer(x), expected)
    qs16, scale16 = random_q8(48, 96, per16=True)
    layer16 = Q8Linear(qs16, scale16, activations="bf16")
    assert "a scale per 16" in repr(layer16) and layer16.scale.dtype == torch.float32
    assert torch.equal(layer16(x), op(x.reshape(10, 96), qs16, scale16).reshape(2, 5, 48))
    with pytest.raises(ValueError, match="scale must be"):
        Q8Linear(qs16, scale16[:, :3])


@pytest.mark.slow
def test_the_bundled_models_head_is_read_from_its_gguf(op):
    """The bundled GGUF stores its (tied) head as Q8_0: read from the file it equals the bf16 model's head;
    a head that differs, an fp32 head, or no GGUF keeps the module as it was, with the reason. In the full
    tier (~11 s here: a bf16 load and a whole int4 view); the fast tier checks the blocks against gguf's bytes."""
    from specdec.models import load_model

    loaded = load_model("smollm2-135m", dtype="bf16")
    head = loaded.model.get_output_embeddings()
    layer, why = gguf_blocks.head_q8(loaded.gguf_path, head)
    assert isinstance(layer, Q8Linear) and why == ""
    assert torch.equal(dequantize_q8(*layer.blocks()), head.weight)
    other = torch.nn.Linear(576, 49152, bias=False).to(torch.bfloat16)
    assert gguf_blocks.head_q8(loaded.gguf_path, other) == (None, "the GGUF's head blocks are not the model's head weights")
    assert gguf_blocks.head_q8(None, head)[0] is None
    assert gguf_blocks.head_q8(loaded.gguf_path, other.float())[0] is None
    view = q4_kernel_view(loaded)
    assert isinstance(view.get_output_embeddings(), Q8Linear)


def q4_kernel_view(loaded):  # noqa: ANN001, ANN201 - the int4 view the engine verifies on
    from specdec.backends.torch.packed import verify_model
    from specdec.models.state import ModelState

    return verify_model(dataclasses.replace(loaded, pack="int4", state=ModelState()))


def test_a_q6_k_head_is_read_from_its_gguf(op, tmp_path):
    """A GGUF whose head is Q6_K (Q4_K_M files' usual head): read as 8-bit blocks with a scale per 16, it
    equals the bf16 head dequantized from the file and multiplies like it; another weight is refused."""
    gguf = pytest.importorskip("gguf")
    rows, cols = 48, 512
    raw = random_q6_k(rows, cols, seed=3)
    path = tmp_path / "q6_k_head.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("output.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q6_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    head = torch.nn.Linear(cols, rows, bias=False).to(torch.bfloat16)
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K)
    head.weight.data = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
    layer, why = gguf_blocks.head_q8(path, head)
    int8 = q4_kernel.default_activations() == "int8"  # then Q6_K's own bits (`q6_k`), else a scale per 16
    assert isinstance(layer, q6_k.Q6Linear if int8 else Q8Linear) and why == ""
    assert torch.equal(dequantize_q8(*layer.blocks()), head.weight)
    x = torch.randn(3, cols, dtype=torch.bfloat16)
    if int8:
        q, scale = layer.blocks()
        assert_i8_within_bound(layer(x), x, q, scale, torch.zeros_like(scale))
    else:
        assert_within_bound(layer(x), x, head.weight)
    head.weight.data[0, 0] += 1.0
    assert gguf_blocks.head_q8(path, head) == (None, "the GGUF's head blocks are not the model's head weights")
