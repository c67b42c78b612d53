"""The 4-bit blocks with 8-bit activations (specdec.kernels.q4_i8, csrc/q4_gemm_i8.cpp).

The interleaved layout moves bytes only; the activations are quantized by the stated rule bit for bit;
the kernel agrees with the float64 reference within the bound of its fp32 steps on every product shape
of both models, its AVX-512 VNNI path gives the scalar path's bits, and a row's bits do not depend on
the rows beside it. Kernel tests skip, with the reason, where the extension cannot be built.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from helpers import assert_i8_within_bound

from specdec.kernels import q4_i8, q4_kernel
from specdec.kernels.q4_kernel import Q4Linear, pack_q4, q4_k_scales, unpack_q4

# [N, K] of every product of SmolLM2-135M and Qwen2.5-Coder-1.5B (the heads cut to 1008 columns)
SHAPES = {
    "smollm2 q/o": (576, 576), "smollm2 k/v": (192, 576), "smollm2 qkv": (960, 576),
    "smollm2 gate/up": (1536, 576), "smollm2 down": (576, 1536), "smollm2 head (1008)": (1008, 576),
    "odd block count": (64, 608), "qwen q/o": (1536, 1536), "qwen k/v": (256, 1536), "qwen gate/up": (8960, 1536), "qwen down": (1536, 8960),
}


@pytest.fixture(scope="module")
def op():
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    return torch.ops.specdec_q4.q4_linear


def paths() -> list[str]:
    return list(torch.ops.specdec_q4.q4_linear_i8_paths())


def random_blocks(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] and fp16-valued step and minimum [N, K/32] spread like a small model's weights."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), generator=generator)
    step = (torch.rand(rows, cols // 32, generator=generator) * 0.02 + 1e-3).half().float()
    minimum = (-step * (7.5 + torch.randn(rows, cols // 32, generator=generator))).half().float()
    return q, step, minimum


def test_interleaving_moves_bytes_only():
    q, step, minimum = random_blocks(48, 256, seed=1)
    for scale, low in ((step.half(), minimum.half()), (step, minimum)):
        qs, s, m = q4_i8.interleave(q, scale, low)
        assert qs.shape == (3, 8, 256) and s.shape == (3, 8, 16)
        back = q4_i8.deinterleave(qs, s, m)
        assert torch.equal(back[0], q.to(torch.uint8)) and torch.equal(back[1], scale) and torch.equal(back[2], low)
    pairs = torch.randint(0, 64, (48, 8, 2), dtype=torch.uint8)
    supers = torch.rand(48, 1, 2).half()
    qs, s, m = q4_i8.interleave(q, pairs, supers)
    assert s.shape == (3, 8, 2, 16) and m.shape == (3, 1, 2, 16)
    back = q4_i8.deinterleave(qs, s, m)
    assert torch.equal(back[1], pairs) and torch.equal(back[2], supers)
    # byte 4j + k of run i: column j's element 4i + k (low nibble) and 16 + 4i + k (high nibble)
    assert qs[0, 0, 64 * 2 + 4 * 5 + 3] == q[5, 11] | (q[5, 27] << 4)
    with pytest.raises(ValueError, match="multiple of 16"):
        q4_i8.interleave(q[:40], step[:40], minimum[:40])


def test_activations_are_quantized_by_the_rule(op):
    x = torch.randn(7, 96) * 3
    x[1, :32] = 0  # an all-zero block: d = 0, q = 0
    x[2, :32] = torch.arange(32) - 15.5  # max 16.5: x / d lands on halves (ties go to even)
    for rows in (x, x.to(torch.bfloat16)):
        expected = q4_i8.quantize_activations(rows)
        for path in paths():
            got = torch.ops.specdec_q4.quantize_activations(rows, path)
            for a, b in zip(got, expected, strict=True):
                assert torch.equal(a, b), path
    assert q4_i8.quantize_activations(x)[0].abs().max() == 127


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_within_bound_on_every_path_and_rows_alone(op, name):
    rows, cols = SHAPES[name]
    q, step, minimum = random_blocks(rows, cols, seed=len(name))
    form = q4_i8.interleave(q, step.half(), minimum.half())
    many = torch.randn(64, cols).to(torch.bfloat16)
    every = op(many, *form)
    for rows in (1, 3, 4, 5, 8, 9, *range(10, 18), 26, 64):  # a row's bits whatever M (AMX tiles of each R = 9..16)
        assert torch.equal(op(many[:rows].contiguous(), *form), every[:rows]), rows
    x = many[:17].contiguous()
    full = every[:17]
    assert_i8_within_bound(full[:5], x[:5], q, step, minimum)
    for path in paths():
        assert torch.equal(op(x, *form, path), full), path  # the paths compute the same bits
    for lo, hi in ((0, 1), (3, 5), (4, 12), (16, 17)):  # any rows, alone or in any company
        assert torch.equal(op(x[lo:hi].contiguous(), *form), full[lo:hi]), (lo, hi)
    wide = op(x.float(), *form)  # fp32 activations and outputs: the same sums before the output's rounding
    assert wide.dtype == torch.float32 and torch.equal(wide.to(torch.bfloat16), full)


def test_q4_k_pairs_give_the_fp32_scales_bits(op):
    generator = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (32, 512), generator=generator)
    pairs = torch.randint(0, 64, (32, 16, 2), dtype=torch.uint8, generator=generator)
    supers = (torch.rand(32, 2, 2, generator=generator) * 1e-2).half()
    scale, minimum = q4_k_scales(pairs, supers)
    x = torch.randn(6, 512).to(torch.bfloat16)
    for path in paths():
        from_pairs = op(x, *q4_i8.interleave(q, pairs, supers), path)
        assert torch.equal(from_pairs, op(x, *q4_i8.interleave(q, scale, minimum), path)), path
    assert_i8_within_bound(from_pairs, x, q, scale, minimum)


def test_the_module_holds_either_form(op):
    q, step, minimum = random_blocks(48, 96, seed=4)
    bias = torch.randn(48).to(torch.bfloat16)
    column = pack_q4(q, step, minimum)
    layer = Q4Linear(*column, bias, activations="int8")
    assert layer.qs.shape == (3, 3, 256) and "int8 activations" in repr(layer)
    assert all(torch.equal(a, b) for a, b in zip(layer.blocks(), column, strict=True))
    x = torch.randn(2, 5, 96).to(torch.bfloat16)
    assert torch.equal(layer(x), (op(x.reshape(10, 96), layer.qs, layer.scale, layer.minimum) + bias).reshape(2, 5, 48))
    bf16 = Q4Linear(*column, bias, activations="bf16")
    assert bf16.qs.shape == (48, 48) and not torch.equal(bf16(x), layer(x))  # two arithmetics
    assert torch.equal(unpack_q4(bf16.blocks()[0]), q.to(torch.uint8))
    with pytest.raises(ValueError, match="activations must be one of"):
        Q4Linear(*column, bias, activations="int4")


def test_bad_input_is_refused_with_its_reason(op):
    q, step, minimum = random_blocks(32, 64)
    qs, scale, low = q4_i8.interleave(q, step.half(), minimum.half())
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="take path auto, avx512_amx, avx512_vnni, avx_vnni, avx2, neon_dotprod or scalar, got sse9"):
        op(x, qs, scale, low, "sse9")
    with pytest.raises(RuntimeError, match="x has K = 96"):
        op(torch.randn(2, 96), qs, scale, low)
    with pytest.raises(RuntimeError, match="both be float16 or float32"):
        op(x, qs, scale.float(), low)
    with pytest.raises(RuntimeError, match=r"\[N/16, K/32, 256\]"):
        op(x, qs[..., :128].contiguous(), scale, low)


def test_eight_bit_blocks_take_the_same_arithmetic(op):
    """Q8_0's blocks (the bundled model's head), held as q + 128: the offset is taken back exactly in int32."""
    generator = torch.Generator().manual_seed(6)
    q = torch.randint(-128, 128, (1008, 576), generator=generator, dtype=torch.int8)
    scale = (torch.rand(1008, 18, generator=generator) * 1e-2).half()
    qs, grouped = q4_i8.interleave8(q, scale)
    back = q4_i8.deinterleave8(qs, grouped)
    assert qs.shape == (63, 18, 512) and torch.equal(back[0], q) and torch.equal(back[1], scale)
    x = torch.randn(9, 576).to(torch.bfloat16)
    full = torch.ops.specdec_q4.q8_linear(x, qs, grouped)
    for path in paths():
        assert torch.equal(torch.ops.specdec_q4.q8_linear(x, qs, grouped, path), full), path
    assert torch.equal(torch.ops.specdec_q4.q8_linear(x[4:6].contiguous(), qs, grouped), full[4:6])
    assert_i8_within_bound(full, x, q, scale.float(), torch.zeros(1008, 18))
    layer = q4_kernel.Q8Linear(q, scale, activations="int8")
    assert "int8 activations" in repr(layer) and torch.equal(layer(x), full)
    assert all(torch.equal(a, b) for a, b in zip(layer.blocks(), (q, scale), strict=True))
    with pytest.raises(RuntimeError, match=r"\[N/16, K/32, 512\]"):
        torch.ops.specdec_q4.q8_linear(x, qs[..., :256].contiguous(), grouped)


def test_a_scale_per_16_sums_each_half_alone(op):
    """Q6_K's sub-blocks (an fp32 scale per 16 weights, Qwen2.5's head): each half of a block is summed and
    scaled alone, the same bits on every path and at any number of rows, within the reference's bound."""
    generator = torch.Generator().manual_seed(7)
    q = torch.randint(-32, 32, (1008, 576), generator=generator, dtype=torch.int8)
    scale = torch.rand(1008, 36, generator=generator) * 1e-2
    qs, grouped = q4_i8.interleave8(q, scale)
    assert grouped.shape == (63, 36, 16)
    back = q4_i8.deinterleave8(qs, grouped)
    assert torch.equal(back[0], q) and torch.equal(back[1], scale)
    x = torch.randn(9, 576).to(torch.bfloat16)
    full = torch.ops.specdec_q4.q8_linear(x, qs, grouped)
    for path in paths():
        assert torch.equal(torch.ops.specdec_q4.q8_linear(x, qs, grouped, path), full), path
    for rows in (1, 4, 8):
        assert torch.equal(torch.ops.specdec_q4.q8_linear(x[:rows].contiguous(), qs, grouped), full[:rows]), rows
    assert_i8_within_bound(full, x, q, scale, torch.zeros(1008, 36))
    layer = q4_kernel.Q8Linear(q, scale)
    assert layer.activations == q4_kernel.default_activations() and layer.per == 16
    if layer.activations == "int8":
        assert torch.equal(layer(x), full)
    with pytest.raises(RuntimeError, match=r"float32 \[N/16, K/16, 16\]"):
        torch.ops.specdec_q4.q8_linear(x, qs, grouped[:, :18].contiguous())


def test_extreme_weights_and_activations_give_the_scalar_bits_on_every_path(op):
    """The largest products each form can hold (4-bit u = 15, 6-bit u = 63, 8-bit u = 0 and 255) by activations
    quantized to +-127: AVX2's 16-bit pair sums (`vpmaddubsw`) must not saturate, so every path gives the
    scalar path's bits."""
    x = torch.ones(4, 64).to(torch.bfloat16)
    x[1] = -1
    x[2, ::2] = -1  # alternating signs: +-127 next to each other
    x[3, 32:] = -3
    q4 = torch.full((32, 64), 15)
    q4[1::2, ::3] = 0
    step = torch.full((32, 2), 0.01)
    form4 = q4_i8.interleave(q4, step.half(), (-step * 7.5).half())
    q8 = torch.full((32, 64), 127, dtype=torch.int8)
    q8[::2] = -128
    q8[3, ::2] = -128
    form8 = q4_i8.interleave8(q8, step.half())
    form16 = q4_i8.interleave8(q8, torch.full((32, 4), 0.01))  # a scale per 16: each half alone
    for path in paths():
        assert torch.equal(op(x, *form4, path), op(x, *form4, "scalar")), path
        for form in (form8, form16):
            assert torch.equal(torch.ops.specdec_q4.q8_linear(x, *form, path),
                               torch.ops.specdec_q4.q8_linear(x, *form, "scalar")), path


@pytest.mark.slow  # ~20 s: three new processes, each loading torch and the extension
def test_specdec_kernels_caps_every_op_s_path(op):
    """SPECDEC_KERNELS caps the instruction sets every op may use (read once per process: a new one here): the
    bf16 block products, the 8-bit-activation ones, and tree attention with the fused layer's steps."""
    probe = ("import torch; from specdec.kernels import q4_kernel; assert q4_kernel.load_extension(); "
             "ops = torch.ops; print(ops.specdec_q4.q4_linear_path(), list(ops.specdec_q4.q4_linear_i8_paths()), "
             "ops.specdec_attention.steps_path())")

    def run(value: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "SPECDEC_KERNELS": value}
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)

    assert run("scalar").stdout.split() == ["scalar", "['scalar']", "scalar"]
    if "avx2" in paths():  # with AVX-VNNI (VEX) where the CPU has it: a 256-bit extension, within the cap
        i8 = ["avx_vnni", "avx2", "scalar"] if "avx_vnni" in paths() else ["avx2", "scalar"]
        assert run("avx2").stdout.strip() == f"avx2 {i8} avx2"
    if "avx512_amx" in paths():  # "avx512": AVX-512 without AMX tiles
        assert run("avx512").stdout.split()[1] == "['avx512_vnni',"
    bad = run("sse9")
    assert bad.returncode != 0 and "SPECDEC_KERNELS must be one of auto, avx512, avx2, scalar, got 'sse9'" in bad.stderr
