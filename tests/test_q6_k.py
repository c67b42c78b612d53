"""Q6_K tensors multiplied from their own bits (specdec.kernels.q6_k, `q6_linear` in csrc/q4_gemm_i8.cpp).

The 6-bit layout moves bits only; the product is, bit for bit, the 8-bit form's with fp32 scales per 16 (the
same integer sums and the same exact scales) on every path and at any number of rows, within the float64
reference's bound; a layout that misplaces the high bits fails. A GGUF's Q6_K head takes this form where the
CPU runs 8-bit activations. Kernel tests skip, with the reason, where the extension cannot be built.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_i8_within_bound

from specdec.kernels import q4_i8, q4_kernel, q6_k


@pytest.fixture(scope="module")
def op():
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    return torch.ops.specdec_q4.q6_linear


def paths() -> list[str]:
    return list(torch.ops.specdec_q4.q4_linear_i8_paths())


def random_q6(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q in -32..31, int8 sub-scales and fp16 d as a Q6_K tensor holds them (every value of each field)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(-32, 32, (rows, cols), generator=generator, dtype=torch.int8)
    sub = torch.randint(-128, 128, (rows, cols // 16), generator=generator, dtype=torch.int8)
    d = (torch.rand(rows, cols // 256, generator=generator) * 1e-3 + 1e-6).half()
    return q, sub, d


def test_interleaving_moves_bits_only():
    q, sub, d = random_q6(48, 512)
    qs, grouped, supers = q6_k.interleave6(q, sub, d)
    assert qs.shape == (3, 16, 384) and grouped.shape == (3, 32, 16) and supers.shape == (3, 2, 16)
    back = q6_k.deinterleave6(qs, grouped, supers)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, sub, d), strict=True))
    # the low 4 bits sit where the 4-bit form puts its q; the high 2 in the last 128 bytes
    low = q4_i8.deinterleave(qs[..., :256].contiguous(), torch.zeros(3, 16, 16), torch.zeros(3, 16, 16))[0]
    assert torch.equal(low, ((q.to(torch.int16) + 32) & 15).to(torch.uint8))


def test_interleave_refuses_bad_input():
    q, sub, d = random_q6(16, 256)
    with pytest.raises(ValueError, match="multiple of 16"):
        q6_k.interleave6(q[:8], sub[:8], d[:8])
    with pytest.raises(ValueError, match=r"sub-scales must be \[16, 16\]"):
        q6_k.interleave6(q, sub[:, :8], d)
    with pytest.raises(ValueError, match="-32..31"):
        q6_k.interleave6(q.clamp(min=0) * 2, sub, d)


@pytest.mark.parametrize("shape", [(1008, 512), (256, 1536)], ids=["head-like", "qwen k/v"])
def test_the_same_bits_as_the_8_bit_form(op, shape):
    """q6_linear gives q8_linear's bits for the same weights held with fp32 scales per 16, on every path and
    at every M = 1..64; both are within the float64 reference's bound."""
    rows, cols = shape
    q, sub, d = random_q6(rows, cols, seed=rows)
    qs, grouped, supers = q6_k.interleave6(q, sub, d)
    scale = q6_k.scales(sub, d)
    qs8, grouped8 = q4_i8.interleave8(q, scale)
    x = torch.randn(64, cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    full = torch.ops.specdec_q4.q8_linear(x, qs8, grouped8)
    for path in paths():
        assert torch.equal(op(x, qs, grouped, supers, path), full), path
    for count in range(1, 65):  # every M of a verification pass: the same bits as the 64-row call
        assert torch.equal(op(x[:count].contiguous(), qs, grouped, supers), full[:count]), count
    assert torch.equal(op(x[5:7].contiguous(), qs, grouped, supers), full[5:7])
    assert_i8_within_bound(full, x, q, scale, torch.zeros_like(scale))
    fp32 = x.float()
    assert torch.equal(op(fp32, qs, grouped, supers), torch.ops.specdec_q4.q8_linear(fp32, qs8, grouped8))


def test_misplaced_high_bits_fail(op):
    """Swapping the two runs of high bits (quads 0-3 with 4-7) changes the product: the test above can fail."""
    q, sub, d = random_q6(64, 256, seed=5)
    qs, grouped, supers = q6_k.interleave6(q, sub, d)
    swapped = torch.cat([qs[..., :256], qs[..., 320:], qs[..., 256:320]], dim=-1).contiguous()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    for path in paths():
        assert not torch.equal(op(x, swapped, grouped, supers, path), op(x, qs, grouped, supers, path)), path


def test_q6_linear_refuses_bad_scales(op):
    q, sub, d = random_q6(32, 512)
    qs, grouped, supers = q6_k.interleave6(q, sub, d)
    x = torch.randn(2, 512).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"int8 sub-scales \[N/16, K/16, 16\]"):
        op(x, qs, grouped.float(), supers)
    with pytest.raises(RuntimeError, match=r"int8 sub-scales"):
        op(x, qs, grouped, supers[:, :1].contiguous())
    with pytest.raises(RuntimeError, match=r"\[N/16, K/32, 384\]"):
        op(x, qs[..., :256].contiguous(), grouped, supers)


def test_module_matches_the_8_bit_module(op):
    q, sub, d = random_q6(96, 512, seed=9)
    bias = torch.randn(96).to(torch.bfloat16)
    layer = q6_k.Q6Linear(q, sub, d, bias)
    assert "q6_k blocks" in repr(layer)
    back_q, back_scale = layer.blocks()
    assert torch.equal(back_q, q) and torch.equal(back_scale, q6_k.scales(sub, d))
    x = torch.randn(2, 3, 512).to(torch.bfloat16)
    assert torch.equal(layer(x), q4_kernel.Q8Linear(q, q6_k.scales(sub, d), bias, activations="int8")(x))
    assert layer(x).shape == (2, 3, 96)
