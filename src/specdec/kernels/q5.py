"""5-bit GGUF blocks (Q5_1, Q5_K) multiplied as 8-bit blocks with a minimum: the file's weights, exactly.

Why: Q5_1 and Q5_K store each block of 32 as w = scale * q + minimum, q in 0..31 (Q5_1: fp16 d and m; Q5_K:
d * a 6-bit scale and -(dmin * a 6-bit min), exact in fp32). No 4-bit block holds that, and an 8-bit block
without a minimum holds it only where the minimum is a multiple of the scale, so an int4 view re-quantized such
a layer to 4 bits and `pack auto` kept those files off the fused pass (several times slower). Here q is held
as an 8-bit block (u = q + 128, `q4_i8.interleave8`'s layout) with the block's scale and minimum in the 4-bit
form's layout (fp16 or fp32 [N/16, K/32, 16]); the kernel (`csrc/q4_gemm_i8.cpp`, its 8-bit path with
`wide_min`) takes the offset back exactly, then adds minimum * d * sum(q_x) as the 4-bit form does: 8 bits a
weight read instead of ~5.5, the file's values instead of moved ones.

Invariants:
- `blocks()` gives back q, scale and minimum exactly; the weight multiplied is
  bf16(fp32(fp32(q) * scale) + minimum), what a bf16 model dequantized from the file holds (gguf's rule);
- a row's bits do not depend on the rows beside it, on every path of the 8-bit-activation kernel (the integer
  sums are exact, the fp32 steps the same in every lane);
- it runs only on 8-bit activations (a CPU with AVX-512 VNNI, AVX2 or Arm's dot product): `held()` says where.
"""

from __future__ import annotations

import torch

from specdec.kernels import q4_i8
from specdec.kernels.q4_kernel import (
    BLOCK,
    default_activations,
    load_extension,
    rows_through,
    unavailable_reason,
)

LEVELS = 31  # q in 0..LEVELS


def held() -> bool:
    """Whether this process multiplies 5-bit blocks (the extension loads and runs 8-bit activations)."""
    return load_extension() and default_activations() == "int8"


def dequantize_q5(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """The bf16 weight [N, K] the kernel multiplies by: fp32 q * scale, then + minimum, then to bf16."""
    rows, cols = q.shape
    product = q.float().reshape(rows, cols // BLOCK, BLOCK) * scale.float()[..., None]  # two ops: no FMA
    return (product + minimum.float()[..., None]).reshape(rows, cols).to(torch.bfloat16)


class Q5Linear(torch.nn.Module):
    """y = x @ W.T + b with W held as 8-bit blocks with a minimum a block (5-bit files' q in 0..31)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not held():
            raise RuntimeError(unavailable_reason() or "5-bit blocks run on 8-bit activations, which this CPU lacks")
        self.out_features, self.in_features = q.shape
        blocks = (self.out_features, self.in_features // BLOCK)
        if tuple(scale.shape) != blocks or tuple(minimum.shape) != blocks or scale.dtype != minimum.dtype:
            raise ValueError(f"scale and minimum must be [{blocks[0]}, {blocks[1]}] of one dtype")
        if q.numel() and (int(q.min()) < 0 or int(q.max()) > LEVELS):
            raise ValueError(f"q must lie in 0..{LEVELS}")
        dtype = torch.float16 if scale.dtype == torch.float16 else torch.float32
        qs, scale = q4_i8.interleave8(q.to(torch.int8), scale.to(dtype))
        self.register_buffer("qs", qs)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", q4_i8.by_group(minimum.to(dtype)))
        self.register_buffer("bias", None if bias is None else bias.detach())

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q int8 [N, K] in 0..31, scale, minimum [N, K/32]), the column form."""
        q, scale = q4_i8.deinterleave8(self.qs, self.scale)
        return q, scale, q4_i8.by_column(self.minimum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] (bf16 or fp32) -> [..., out_features] in x's dtype."""
        return rows_through(self, x, lambda rows: torch.ops.specdec_q4.q4_linear(rows, self.qs, self.scale, self.minimum))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, 5-bit values in 8-bit blocks with a minimum, int8 activations")
