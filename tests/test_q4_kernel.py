"""The 4-bit GEMM extension (specdec.kernels.q4_kernel) against its pure-PyTorch reference.

The packing is llama.cpp's Q4_1 (checked against gguf's own dequantizer); the kernel multiplies by
`dequantize_q4`'s weights bit for bit, agrees with `reference_q4_linear` within the fp32 summation
bound below, and gives every row the same bits whatever the rows beside it, on each C++ path this CPU
runs. Kernel tests skip, with the reason, where the extension cannot be built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_within_bound, forced_paths

from specdec.kernels import q4_kernel
from specdec.kernels.q4_kernel import (
    BLOCK,
    Q4Linear,
    dequantize_q4,
    pack_q4,
    reference_q4_linear,
    unpack_q4,
)

# [N, K] of every product of SmolLM2-135M (q/o, k/v, gate/up, down, head) and Qwen2.5-Coder-1.5B; the
# heads' N is cut to a random subset of columns (1000: not a multiple of the kernel's 4-column tiles).
SHAPES = {
    "smollm2 q/o": (576, 576), "smollm2 k/v": (192, 576), "smollm2 gate/up": (1536, 576),
    "smollm2 down": (576, 1536), "smollm2 head (1000 of 49152)": (1000, 576),
    "qwen q/o": (1536, 1536), "qwen k/v": (256, 1536), "qwen gate/up": (8960, 1536),
    "qwen down": (1536, 8960), "qwen head (1000 of 151936)": (1000, 1536),
}
ROWS = (1, 3, 4, 5, 17, 64)


@pytest.fixture(scope="module")
def op():
    """torch.ops.specdec_q4.q4_linear, or a skip saying why the extension cannot be built here."""
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    return torch.ops.specdec_q4.q4_linear


def random_q4(rows: int, cols: int, seed: int = 0, wide: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1 blocks spread like a small model's weights (minimum about -7.5 steps); wide: fp32 scales
    and minimums as a Q4_K tensor's read (an fp16 times a 6-bit integer, exact in fp32)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), generator=generator)
    if wide:
        d = (torch.rand(rows, 1, generator=generator) * 1e-3 + 1e-4).half().float()
        step = d * torch.randint(1, 64, (rows, cols // BLOCK), generator=generator)
        minimum = -d * torch.randint(0, 64, (rows, cols // BLOCK), generator=generator) * 8
        return pack_q4(q, step, minimum, torch.float32)
    step = torch.rand(rows, cols // BLOCK, generator=generator) * 0.02 + 1e-3
    minimum = -step * (7.5 + torch.randn(rows, cols // BLOCK, generator=generator))
    return pack_q4(q, step, minimum)


# ----------------------------------------------------------------- the format (no extension needed)


def test_pack_unpack_round_trip_and_llama_cpp_nibble_order():
    q = torch.randint(0, 16, (6, 96))
    scale, minimum = torch.rand(6, 3), -torch.rand(6, 3)
    qs, scale16, minimum16 = pack_q4(q, scale, minimum)
    assert qs.dtype == torch.uint8 and qs.shape == (6, 48)
    assert scale16.dtype == minimum16.dtype == torch.float16
    assert torch.equal(unpack_q4(qs), q.to(torch.uint8))
    # block b's byte j: element 32b + j in the low nibble, element 32b + j + 16 in the high one
    assert torch.equal(qs[:, 16:32] & 15, q[:, 32:48].to(torch.uint8))
    assert torch.equal(qs[:, 16:32] >> 4, q[:, 48:64].to(torch.uint8))


def test_dequantize_matches_gguf_q4_1():
    """Raw Q4_1 blocks (d, m, 16 bytes) through gguf's numpy dequantizer, then bf16: the same weights."""
    gguf = pytest.importorskip("gguf")
    qs, scale, minimum = random_q4(8, 128, seed=1)
    rows, blocks = scale.shape
    halves = [t.view(torch.uint8).reshape(rows, blocks, 2) for t in (scale, minimum)]
    raw = torch.cat([*halves, qs.reshape(rows, blocks, 16)], dim=-1)  # llama.cpp's block_q4_1
    weight = gguf.quants.dequantize(raw.reshape(rows, blocks * 20).numpy(), gguf.GGMLQuantizationType.Q4_1)
    expected = torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32)).to(torch.bfloat16)
    assert torch.equal(dequantize_q4(qs, scale, minimum), expected)


def test_pack_refuses_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_q4(torch.zeros(2, 48, dtype=torch.int64), torch.ones(2, 1), torch.ones(2, 1))
    with pytest.raises(ValueError, match="0..15"):
        pack_q4(torch.full((2, 32), 16), torch.ones(2, 1), torch.ones(2, 1))


def test_unavailable_reason_names_the_fallback(monkeypatch):
    monkeypatch.setattr(q4_kernel, "_SOURCE", Path("/nonexistent/q4_gemm.cpp"))
    reason = q4_kernel._build.__wrapped__()
    assert "int4" in reason


# ----------------------------------------------------------------- the kernel


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_kernel_matches_reference_on_model_shapes(op, shape):
    packed = random_q4(*shape)
    weight = dequantize_q4(*packed)
    x = torch.randn(max(ROWS), shape[1])
    assert torch.equal(reference_q4_linear(x, *packed), x.to(torch.bfloat16).float() @ weight.float().T)
    for dtype in (torch.bfloat16, torch.float32):
        for rows in ROWS:
            y = op(x[:rows].to(dtype), *packed)
            assert y.dtype == dtype and y.shape == (rows, shape[0])
            assert_within_bound(y, x[:rows].to(dtype), weight)


@pytest.mark.parametrize("wide", [False, True], ids=["fp16 scales", "fp32 scales"])
def test_kernel_multiplies_by_the_reference_weights_bit_for_bit(op, wide):
    """One-hot rows pick single weights: every path returns dequantize_q4's values exactly."""
    packed = random_q4(37, 128, seed=2, wide=wide)
    weight = dequantize_q4(*packed)
    eye = torch.eye(128)
    for path in forced_paths():
        for start in (0, 64):
            y = op(eye[start:start + 64], *packed, path)
            assert torch.equal(y, weight[:, start:start + 64].float().T), path


@pytest.mark.parametrize("shape", [(576, 576), (7, 1536), (13, 512)], ids=["576x576", "7x1536", "13x512 fp32 scales"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_do_not_depend_on_the_batch(op, shape, dtype):
    """For every M in 1..64, kernel(x[:M]) == kernel(x)[:M]; a row alone, or moved, keeps its bits."""
    packed = random_q4(*shape, seed=3, wide=shape[1] == 512)
    x = torch.randn(64, shape[1]).to(dtype)
    for path in forced_paths():
        full = op(x, *packed, path)
        for rows in range(1, 65):
            assert torch.equal(op(x[:rows], *packed, path), full[:rows]), (path, rows)
        for row in range(64):
            assert torch.equal(op(x[row:row + 1], *packed, path), full[row:row + 1]), (path, row)
        assert torch.equal(op(x.flip(0), *packed, path), full.flip(0)), path


@pytest.mark.parametrize("path", ["avx2", "scalar"])
def test_forced_paths_match_reference(op, path):
    if path not in forced_paths():
        pytest.skip(f"this CPU does not run the {path} path")
    for shape, wide in [((192, 576), False), ((65, 1536), False), ((65, 1536), True)]:
        packed = random_q4(*shape, seed=4, wide=wide)
        x = torch.randn(9, shape[1])
        for dtype in (torch.bfloat16, torch.float32):
            assert_within_bound(op(x.to(dtype), *packed, path), x.to(dtype), dequantize_q4(*packed))


def test_bad_input_gets_a_clear_error(op):
    qs, scale, minimum = random_q4(8, 64)
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        op(torch.randn(2, 48), qs[:, :24].contiguous(), *(t[:, :1].contiguous() for t in (scale, minimum)))
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        op(x.half(), qs, scale, minimum)
    with pytest.raises(RuntimeError, match="qs must be uint8"):
        op(x, qs.to(torch.int32), scale, minimum)
    with pytest.raises(RuntimeError, match="float16"):
        op(x, qs, scale.float(), minimum)  # fp32 scales come with fp32 minimums
    with pytest.raises(RuntimeError, match="need \\[N, K/2\\]"):
        op(torch.randn(2, 96), qs, scale, minimum)
    with pytest.raises(RuntimeError, match="contiguous"):
        op(torch.randn(64, 2).T, qs, scale, minimum)
    with pytest.raises(RuntimeError, match="path must be"):
        op(x, qs, scale, minimum, "avx9000")


def test_q4_linear_module(op):
    q = torch.randint(0, 16, (48, 96))
    step, minimum, bias = torch.rand(48, 3) * 0.1, -torch.rand(48, 3), torch.randn(48)
    layer = Q4Linear.from_q(q, step, minimum, bias, activations="bf16")  # the 8-bit form: test_q4_i8.py
    assert "in_features=96, out_features=48" in repr(layer) and "bf16 activations" in repr(layer)
    x = torch.randn(2, 5, 96)
    packed = (layer.qs, layer.scale, layer.minimum)
    assert torch.equal(layer(x), op(x.reshape(10, 96), *packed).reshape(2, 5, 48) + bias)
    assert_within_bound(layer(x).reshape(10, 48) - bias, x.reshape(10, 96), dequantize_q4(*packed))
    assert torch.equal(layer(x[:, ::2]), layer(x[:, ::2].contiguous()))  # a strided input is copied first
    exact = Q4Linear(*pack_q4(q, step.half().float(), minimum, torch.float32), bias, "bf16")  # fp16 values: exact
    assert exact.scale.dtype == torch.float32 and "fp32 scales" in repr(exact)
    assert_within_bound(exact(x).reshape(10, 48) - bias, x.reshape(10, 96), dequantize_q4(exact.qs, exact.scale, exact.minimum))
    with pytest.raises(ValueError, match="20 significant bits"):  # q * scale would round: the FMA would differ
        Q4Linear(*pack_q4(q, step, minimum, torch.float32), bias)


def test_compiled_graph_gives_eager_bits(op):
    """A torch.compile'd function calling Q4Linear traces the op (its fake implementation) and runs it."""
    torch.manual_seed(0)
    first = Q4Linear.from_q(torch.randint(0, 16, (64, 96)), torch.rand(64, 3) * 0.1, -torch.rand(64, 3) * 0.8,
                            activations="int8")
    second = Q4Linear(*random_q4(32, 64, seed=5), torch.randn(32), "bf16")

    def block(x: torch.Tensor) -> torch.Tensor:
        return second(torch.nn.functional.silu(first(x)))

    x = torch.randn(3, 96)
    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), block(x))
