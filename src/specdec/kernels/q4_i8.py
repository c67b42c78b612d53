"""The 4-bit blocks' second form: interleaved 16 columns at a time, multiplied with 8-bit activations.

Why: `csrc/q4_gemm_i8.cpp` multiplies a 4-bit block by activations quantized to int8 per row and block of
32 (llama.cpp's Q8_1 rule: d = max|x| / 127, q = round(x / d), half to even), the block's products summed
exactly in int32 (AVX-512 VNNI's `vpdpbusd`; on AVX2, `vpmaddubsw` and `vpmaddwd`). On the two-core machines we measure, it does about half
the instructions of the bf16 form at every number of rows: the decoder's products of a one-token pass
and of a tree alike cost about half (docs/benchmarks.md). This module holds the form's layout
(`interleave`, `deinterleave`) and its plain PyTorch reference (`reference_linear`); `q4_kernel.Q4Linear`
chooses the form (`default_activations`).

The layout, for W [N, K] (N a multiple of 16, K of 32): qs uint8 [N/16, K/32, 256]; for column group g
and block b, four runs of 64 bytes, byte 4j + k of run i holding column j's element 4i + k in its low
nibble and element 16 + 4i + k in its high one. Scales and minimums [N/16, K/32, 16] (fp16 or fp32), or
a Q4_K tensor's pairs [N/16, K/32, 2, 16] (uint8 scale, min) and [N/16, K/256, 2, 16] (fp16 d, dmin).

Invariants:
- interleaving moves bytes only: `deinterleave(interleave(q, s, m))` gives back q, s and m exactly;
- the product is a different arithmetic from the bf16 form's (activations rounded to 8 bits, not bf16),
  the same bits for a row whatever the rows beside it, on every path (`avx512_amx`, `avx512_vnni`, `avx_vnni`,
  `avx2`, `neon_dotprod`, `scalar`: the integer sums are exact, the rest the same fp32 steps in every lane); a model
  verifies on one form throughout, so losslessness is relative to it;
- nothing here imports the extension: the layout and the reference are plain PyTorch.
"""

from __future__ import annotations

import torch

BLOCK = 32  # activations per scale, weights per (scale, minimum)
GROUP = 16  # columns interleaved together


def interleave(
    q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] in 0..15 with its column form's scales ([N, K/32] fp16 / fp32, or Q4_K's pairs [N, K/32, 2]
    and [N, K/256, 2]) -> (qs [N/16, K/32, 256], scale, minimum) in the interleaved layout."""
    return nibble_runs(q), by_group(scale), by_group(minimum)


def nibble_runs(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in 0..15 -> the interleaved layout's qs [N/16, K/32, 256] (`interleave` without its scales)."""
    rows, cols = q.shape
    if rows % GROUP or cols % BLOCK:
        raise ValueError(f"the interleaved form needs N a multiple of {GROUP} and K of {BLOCK}, got [{rows}, {cols}]")
    blocks = cols // BLOCK
    parts = q.to(torch.uint8).reshape(rows // GROUP, GROUP, blocks, 2, 4, 4)  # g, j, b, half, run, k
    parts = parts.permute(0, 2, 4, 1, 5, 3)  # g, b, run, j, k, half
    return (parts[..., 0] | (parts[..., 1] << 4)).reshape(rows // GROUP, blocks, 4 * 64).contiguous()


def by_group(t: torch.Tensor) -> torch.Tensor:
    """[N, B] -> [N/16, B, 16]; pairs [N, B, 2] -> [N/16, B, 2, 16]."""
    grouped = t.reshape(t.shape[0] // GROUP, GROUP, *t.shape[1:])
    return grouped.movedim(1, -1).contiguous()


def by_column(t: torch.Tensor) -> torch.Tensor:
    """`by_group`'s inverse."""
    column = t.movedim(-1, 1)
    return column.reshape(column.shape[0] * GROUP, *column.shape[2:]).contiguous()


def deinterleave(
    qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`interleave`'s inverse: (q [N, K] uint8 in 0..15, scale, minimum in the column form's shapes)."""
    return from_nibble_runs(qs), by_column(scale), by_column(minimum)


def from_nibble_runs(qs: torch.Tensor) -> torch.Tensor:
    """`nibble_runs`'s inverse: q [N, K] uint8 in 0..15."""
    groups, blocks, _ = qs.shape
    runs = qs.reshape(groups, blocks, 4, GROUP, 4)  # g, b, run, j, k
    parts = torch.stack([runs & 15, runs >> 4], dim=-1)  # g, b, run, j, k, half
    return parts.permute(0, 3, 1, 5, 2, 4).reshape(groups * GROUP, blocks * BLOCK).contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q int8 [M, K], d fp32 [M, K/32], s = d * sum(q) fp32 [M, K/32]): the kernel's rule."""
    rows, cols = x.shape
    blocks = x.float().reshape(rows, cols // BLOCK, BLOCK)
    d = blocks.abs().amax(-1) / 127.0
    inverse = torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), 0.0)
    q = torch.round(blocks * inverse[..., None])  # half to even, like cvtps2dq and nearbyint
    return q.to(torch.int8).reshape(rows, cols), d, d * q.sum(-1)


def reference_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """x [M, K] times W (q [N, K], fp32 scale and minimum [N, K/32], or [N, K/16] a scale per 16 weights with
    no minimum) as the kernel computes it, in float64 after the exact integer sums: [M, N] float64. The
    kernel's fp32 steps differ from it by rounding."""
    dots, d, s = block_dots(x, q, scale.shape[1])
    scaled = dots * scale.double()[None] * d.double()[:, None]
    return (scaled + minimum.double()[None] * s.double()[:, None]).sum(-1)


def block_dots(x: torch.Tensor, q: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact integer sums [M, N, parts] of x's 8-bit activations by q over `parts` equal runs of K (its
    blocks of 32, or their halves), and the activations' d and s (`quantize_activations`) spread alike."""
    xq, d, s = quantize_activations(x)
    rows, cols = xq.shape
    size, spread = cols // parts, parts // (cols // BLOCK)
    xb = xq.to(torch.int64).reshape(rows, parts, size)
    wb = q.to(torch.int64).reshape(q.shape[0], parts, size)
    dots = torch.einsum("mbk,nbk->mnb", xb, wb).double()  # exact
    return dots, d.repeat_interleave(spread, 1), s.repeat_interleave(spread, 1)


def interleave8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit blocks (Q8_0: q [N, K] in -128..127, fp16 scale [N, K/32]; or Q6_K's sub-blocks: an fp32 scale
    [N, K/16] per 16) -> (qs uint8 [N/16, K/32, 512] holding q + 128, byte 4j + k of run i column j's element
    4i + k; scale [N/16, K/32, 16], or [N/16, K/16, 16] per 16)."""
    rows, cols = q.shape
    if rows % GROUP or cols % BLOCK:
        raise ValueError(f"the interleaved form needs N a multiple of {GROUP} and K of {BLOCK}, got [{rows}, {cols}]")
    blocks = cols // BLOCK
    shifted = (q.to(torch.int16) + 128).to(torch.uint8).reshape(rows // GROUP, GROUP, blocks, 8, 4)  # g, j, b, run, k
    qs = shifted.permute(0, 2, 3, 1, 4).reshape(rows // GROUP, blocks, 8 * 64).contiguous()
    return qs, by_group(scale)


def deinterleave8(qs: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`interleave8`'s inverse: (q int8 [N, K], scale [N, K/32])."""
    groups, blocks, _ = qs.shape
    runs = qs.reshape(groups, blocks, 8, GROUP, 4).permute(0, 3, 1, 2, 4)  # g, j, b, run, k
    q = (runs.reshape(groups * GROUP, blocks * BLOCK).to(torch.int16) - 128).to(torch.int8)
    return q.contiguous(), by_column(scale)


def reference_linear8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] times 8-bit blocks (q [N, K] int8, scale [N, K/32]) as the kernel computes it, in float64
    after the exact integer sums: [M, N] float64."""
    zero = torch.zeros_like(scale, dtype=torch.float32)
    return reference_linear(x, q, scale.float(), zero)
