"""A GGUF file's quantized blocks, read as the file stores them, for specdec's block kernels.

Why: a model loaded from a GGUF runs on a safetensors copy whose weights are the file's dequantized
values; in bf16 each is bf16(q * scale). The block kernels (`q4_kernel`) multiply by exactly those
weights while reading the file's few bits instead of bf16's 16. Today the output head is read this
way: a GGUF's head (or the token embedding a tied head shares) is usually Q8_0, as the bundled
model's is, and it is the largest single product of a small model's pass (SmolLM2-135M: 49,152 x 576).

Invariants:
- a block layer is used only when its dequantized weights equal, bit for bit, the module it stands
  in for (checked at load), so the model verified is the model loaded, only read in fewer bytes;
- anything else (another tensor type, a shape that does not match, weights that differ, a file
  `gguf` cannot read) leaves the module as it was: `head_q8` says None, and why, to its caller.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specdec.backends.torch import q4_kernel

HEAD_NAMES = ("output.weight", "token_embd.weight")  # the head, else the embedding a tied head shares
Q8_0_BYTES = 2 + q4_kernel.BLOCK  # a Q8_0 block: its fp16 scale, then 32 int8


def q8_0_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's bytes [rows, cols / 32 * 34] -> (qs int8 [rows, cols], scale f16 [rows, cols / 32])."""
    blocks = cols // q4_kernel.BLOCK
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, blocks, Q8_0_BYTES)
    scale = torch.from_numpy(data[..., :2].copy().view(np.float16).reshape(rows, blocks))
    qs = torch.from_numpy(data[..., 2:].copy().view(np.int8).reshape(rows, cols))
    return qs, scale


def _read_tensor(path: Path, names: tuple[str, ...]):  # noqa: ANN202 - a gguf ReaderTensor or None
    import gguf  # transformers' GGUF loading needs it too

    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(str(path)).tensors}
    return next((tensors[name] for name in names if name in tensors), None)


def head_q8(gguf_path: Path | None, head: torch.nn.Module) -> tuple[torch.nn.Module | None, str]:
    """The head as a `Q8Linear` over the GGUF's own Q8_0 blocks, or (None, why not)."""
    weight = getattr(head, "weight", None)
    if gguf_path is None or weight is None or weight.dtype != torch.bfloat16:
        return None, "the head is not a bf16 weight of a GGUF model"
    if not q4_kernel.load_extension():
        return None, str(q4_kernel.unavailable_reason())
    try:
        tensor = _read_tensor(Path(gguf_path), HEAD_NAMES)
    except Exception as error:  # a file gguf cannot read keeps the bf16 head
        return None, f"{Path(gguf_path).name} could not be read ({type(error).__name__}: {error})"
    rows, cols = weight.shape
    if tensor is None or tensor.tensor_type.name != "Q8_0" or cols % q4_kernel.BLOCK:
        return None, "the GGUF's head is not Q8_0"
    if tuple(tensor.data.shape) != (rows, cols // q4_kernel.BLOCK * Q8_0_BYTES):
        return None, f"the GGUF's head is {tuple(tensor.data.shape)} bytes, the model's {rows} x {cols}"
    qs, scale = q8_0_blocks(tensor.data, rows, cols)
    if not torch.equal(q4_kernel.dequantize_q8(qs, scale), weight):
        return None, "the GGUF's head blocks are not the model's head weights"
    return q4_kernel.Q8Linear(qs, scale, getattr(head, "bias", None)), ""
