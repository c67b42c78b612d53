"""A Q6_K tensor multiplied from its own bits: 6-bit values, int8 sub-scales and an fp16 scale a super-block.

Why: Q4_K_M files store the output head as Q6_K (Qwen2.5's 151,936 x 1,536 head is a quarter of a
one-token pass of Qwen2.5-Coder-1.5B), and a one-token pass reads every byte of it. Held as 8-bit blocks
with an fp32 scale per 16 weights (`q4_kernel.Q8Linear`) it takes 10 bits a weight; held as the file has it,
6.6. `csrc/q4_gemm_i8.cpp` (`q6_linear`) rebuilds each value in registers (4 low bits and 2 high bits, ORed)
and each scale as d * sub-scale, then runs the 8-bit form's arithmetic: the same bits, fewer bytes.

The layout (`interleave6`), for W [N, K] (N a multiple of 16, K of 256): qs uint8 [N/16, K/32, 384]; for
column group g and block b, the 4-bit form's 256 bytes (`q4_i8.interleave`) holding the low 4 bits of
u = q + 32, then two runs of 64 bytes, byte 4j + k of run h holding, in bits 2t and 2t + 1, the high 2 bits
of column j's element 4 (4h + t) + k. Sub-scales int8 [N/16, K/16, 16]; d fp16 [N/16, K/256, 16].

Invariants:
- interleaving moves bits only: `deinterleave6(interleave6(q, sub, d))` gives back q, sub and d exactly;
- `Q6Linear` computes, bit for bit, what `Q8Linear` computes from the same tensor's fp32 scales per 16
  (d * sub-scale is exact in fp32), on every path of the 8-bit-activation kernel and at any number of rows;
- it runs only on 8-bit activations: where the CPU runs no 8-bit-activation kernel (neither AVX-512 VNNI nor AVX2), `head_q8` keeps `Q8Linear`'s bf16 form.
"""

from __future__ import annotations

import torch

from specdec.kernels import q4_i8
from specdec.kernels.q4_kernel import load_extension, rows_through, unavailable_reason

SUPER = 256  # weights per d
SUB = 16  # weights per sub-scale


def scales(sub: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """int8 sub-scales [N, K/16] and fp16 d [N, K/256] -> each 16 weights' scale d * sub, fp32 (exact)."""
    return d.float().repeat_interleave(SUPER // SUB, dim=1) * sub.float()


def interleave6(q: torch.Tensor, sub: torch.Tensor, d: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] in -32..31, sub int8 [N, K/16], d fp16 [N, K/256] -> (qs [N/16, K/32, 384], sub, d) grouped."""
    rows, cols = q.shape
    if rows % q4_i8.GROUP or cols % SUPER:
        raise ValueError(f"6-bit blocks need N a multiple of {q4_i8.GROUP} and K of {SUPER}, got [{rows}, {cols}]")
    if tuple(sub.shape) != (rows, cols // SUB) or tuple(d.shape) != (rows, cols // SUPER):
        raise ValueError(f"sub-scales must be [{rows}, {cols // SUB}] and d [{rows}, {cols // SUPER}]")
    if q.numel() and (int(q.min()) < -32 or int(q.max()) > 31):
        raise ValueError("q must lie in -32..31")
    u = (q.to(torch.int16) + 32).to(torch.uint8)
    low = q4_i8.nibble_runs(u & 15)
    parts = (u >> 4).reshape(rows // q4_i8.GROUP, q4_i8.GROUP, cols // q4_i8.BLOCK, 2, 4, 4)  # g, j, b, h, t, k
    parts = parts.permute(0, 2, 3, 1, 5, 4)  # g, b, h, j, k, t
    high = (parts[..., 0] | (parts[..., 1] << 2) | (parts[..., 2] << 4) | (parts[..., 3] << 6))
    qs = torch.cat([low, high.reshape(*low.shape[:2], 128)], dim=-1).contiguous()
    return qs, q4_i8.by_group(sub.to(torch.int8)), q4_i8.by_group(d.to(torch.float16))


def deinterleave6(qs: torch.Tensor, sub: torch.Tensor, d: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`interleave6`'s inverse: (q int8 [N, K], sub int8 [N, K/16], d fp16 [N, K/256])."""
    groups, blocks, _ = qs.shape
    low = q4_i8.from_nibble_runs(qs[..., :256].contiguous())
    high = qs[..., 256:].reshape(groups, blocks, 2, q4_i8.GROUP, 4)  # g, b, h, j, k
    fields = torch.stack([(high >> (2 * t)) & 3 for t in range(4)], dim=-1)  # g, b, h, j, k, t
    top = fields.permute(0, 3, 1, 2, 5, 4).reshape(groups * q4_i8.GROUP, blocks * q4_i8.BLOCK)
    q = (low.to(torch.int16) | (top.to(torch.int16) << 4)) - 32
    return q.to(torch.int8).contiguous(), q4_i8.by_column(sub), q4_i8.by_column(d)


class Q6Linear(torch.nn.Module):
    """y = x @ W.T + b with W held as Q6_K's bits (`interleave6`), multiplied on 8-bit activations."""

    def __init__(self, q: torch.Tensor, sub: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not load_extension():
            raise RuntimeError(unavailable_reason())
        self.out_features, self.in_features = q.shape
        qs, sub, d = interleave6(q, sub, d)
        self.register_buffer("qs", qs)
        self.register_buffer("sub", sub)
        self.register_buffer("d", d)
        self.register_buffer("bias", None if bias is None else bias.detach())

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [N, K], fp32 scale [N, K/16]): `Q8Linear`'s column form of the same weights."""
        q, sub, d = deinterleave6(self.qs, self.sub, self.d)
        return q, scales(sub, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] (bf16 or fp32) -> [..., out_features] in x's dtype."""
        return rows_through(self, x, lambda rows: torch.ops.specdec_q4.q6_linear(rows, self.qs, self.sub, self.d))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, q6_k blocks of {SUPER}, int8 activations")
