"""Linear layers with 4-bit weights (`pack="int4"`): a third of the bytes a decode step reads.

`int4_linear` picks the product: bf16 layers run specdec's own few-row kernel (`q4_kernel`: each 4-bit
block dequantized once per call and used for every row, the same bits for a row at any number of
rows) where it builds, else PyTorch's int4 kernel (`Int4Linear`, below), with a warning naming why.

Why: on a CPU a one-token verification pass of a small model reads every weight once and does
little arithmetic with it, so the bytes read set its floor. PyTorch's own CPU kernel for 4-bit
weights (`aten._weight_int4pack_mm_for_cpu`, activations in fp32 / bf16 / fp16) reads a quarter of
bf16's bytes (plus a scale and zero per group): about half the decoder's product time of packed bf16
for one row, but it dequantizes again for every row, so from ~16 rows on its products cost more than
bf16's (oneDNN's bf16 kernels use the CPU's bf16 dot-product instructions) and trees get dearer; specdec's
kernel dequantizes once per call.

The quantization is Q4_1's (llama.cpp's): groups of 32 input columns, each with its own minimum and
step, w = q * step + minimum, q in 0..15 (the kernel's form: (q - 8) * scale + zero, zero = minimum +
8 * step). A weight that came from a Q4_1 GGUF (the bundled model) is recovered group for group:
Q4_1 takes each group's minimum and maximum as its ends, so re-quantizing its dequantized values
gives back the same q; only the scale and zero are rounded to the activations' dtype. A Q4_K layer
would move if re-quantized: its blocks are read from the file instead (`blocks`, from
`gguf_blocks.FileBlocks.q4`), on specdec's kernel.

Invariants:
- the model verified is the quantized one: plain decoding and every method run on the same view
  (`specdec.backends.torch.packed.verify_model`), so losslessness is relative to it, not to the unquantized model;
- the kernel computes each row of a product alone (measured: a row's bits do not depend on how
  many rows share the call), so tree width does not change a node's products;
- the decoder's Linear layers only: the output head keeps its precision (a GGUF's head is usually
  stored with more bits than its layers; the bundled model's is Q8_0);
- fp32 views hold the dequantized weights (no fast fp32 kernel): bf16 / fp16 are the fast path;
- CPU only; a Linear whose input size is not a multiple of the group, whose output size is not
  one of 16 (the packing's blocks), or whose weight is not fp32 / bf16 / fp16 keeps its own product.
"""

from __future__ import annotations

import warnings

import torch

from specdec.kernels import q4_kernel

Blocks = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # qs, scale, minimum as `q4_kernel.Q4Linear` takes them
GROUP = 32  # input columns per scale and zero (Q4_1's block)
LEVELS = 15  # q in 0..LEVELS
_INNER_K_TILES = 2  # the packing's inner tiling (the kernel's choice for K a multiple of 64 or 32)
_ROW_BLOCK = 16  # the packing takes output sizes in blocks of this many
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def can_quantize(linear: torch.nn.Module) -> bool:
    """Whether `linear` is a plain CPU Linear this kernel takes."""
    if type(linear) is not torch.nn.Linear:
        return False
    weight = linear.weight
    return (
        weight.device.type == "cpu" and weight.dtype in _DTYPES
        and linear.in_features % GROUP == 0 and linear.out_features % _ROW_BLOCK == 0
    )


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (q [N, K] int32 in 0..LEVELS, step [N, K/GROUP], minimum [N, K/GROUP]), fp32."""
    rows, cols = weight.shape
    groups = weight.detach().float().reshape(rows, cols // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    step = (high - low) / LEVELS
    safe = torch.where(step > 0, step, torch.ones_like(step))  # a constant group: every q is 0
    q = torch.round((groups - low[..., None]) / safe[..., None]).clamp(0, LEVELS).to(torch.int32)
    return q.reshape(rows, cols), step, low


def dequantize(q: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """The weight [N, K] (fp32) that the kernel multiplies by, from q and its `scale_zero` [K/G, N, 2]."""
    rows, cols = q.shape
    scale, zero = scale_zero.float().unbind(-1)  # [K/G, N] each
    groups = (q.reshape(rows, cols // GROUP, GROUP) - 8).float() * scale.T[..., None] + zero.T[..., None]
    return groups.reshape(rows, cols)


class Int4Linear(torch.nn.Module):
    """y = x @ W.T + b with W held as 4-bit groups in PyTorch's CPU int4 layout (inference only)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        if not can_quantize(linear):
            raise ValueError(f"int4 needs a CPU Linear in fp32/bf16/fp16 with in_features a multiple of {GROUP} "
                             f"and out_features one of {_ROW_BLOCK}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, step, low = quantize(linear.weight)
        # [K/G, N, 2] in the activations' dtype: what the kernel reads
        scale_zero = torch.stack([step.T, (low + 8 * step).T], -1).to(linear.weight.dtype).contiguous()
        self.register_buffer("scale_zero", scale_zero)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        # fp32 has no fast kernel here (tens of times slower than a dense product), so an fp32 view
        # multiplies by the dequantized weight: the same quantized model, at fp32's speed.
        fp32 = linear.weight.dtype == torch.float32
        self.register_buffer("dense", dequantize(q, scale_zero) if fp32 else None)
        self.register_buffer("weight", None if fp32 else torch._convert_weight_to_int4pack_for_cpu(q, _INNER_K_TILES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
        rows = x.reshape(-1, self.in_features)
        if self.dense is not None:
            y = rows @ self.dense.T
        else:
            y = torch._weight_int4pack_mm_for_cpu(rows, self.weight, GROUP, self.scale_zero)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


def int4_linear(linear: torch.nn.Linear, blocks: Blocks | None = None) -> torch.nn.Module:
    """`linear` with its weight quantized to 4-bit groups (Q4_1's rule, `quantize`): on specdec's
    few-row kernel for bf16 layers where it builds, else on PyTorch's (`Int4Linear`). blocks: the weight's
    own 4-bit blocks (a GGUF file's, `gguf_blocks.FileBlocks.q4`), taken as they are on specdec's kernel
    instead of quantizing."""
    if linear.weight.dtype == torch.bfloat16 and can_quantize(linear):
        if q4_kernel.load_extension():
            if blocks is not None:
                return q4_kernel.Q4Linear(*blocks, linear.bias)
            packed = q4_kernel.pack_q4(*quantize(linear.weight))
            layer = q4_kernel.Q4Linear(*packed, linear.bias)
            # a Q4_1 file's weights come back exactly; others (F16, Q5, ...) are moved: say so (`rounded`)
            layer.rounded = not torch.equal(q4_kernel.dequantize_q4(*packed), linear.weight)
            return layer
        warnings.warn(q4_kernel.unavailable_reason(), stacklevel=2)
    return Int4Linear(linear)


def has_invariant_int4(dtype: torch.dtype) -> bool:
    """Whether `int4_linear` layers of `dtype` compute each row alone by construction (specdec's kernel),
    which batch-invariant verification (`exact="on"`) needs."""
    return dtype == torch.bfloat16 and q4_kernel.load_extension()
