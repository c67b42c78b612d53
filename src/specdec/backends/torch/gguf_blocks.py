"""A GGUF file's quantized blocks, read as the file stores them, for specdec's block kernels.

Why: a model loaded from a GGUF runs on a safetensors copy whose weights are the file's dequantized
values; in bf16 each is bf16(q * scale). The block kernels (`q4_kernel`) multiply by exactly those
weights while reading the file's few bits instead of bf16's 16. Today the output head is read this
way: a GGUF's head (or the token embedding a tied head shares) is usually Q8_0, as the bundled
model's is, or Q6_K, as Q4_K_M files' are (Qwen2.5-Coder's), and it is the largest single product of a
small model's pass (SmolLM2-135M: 49,152 x 576; Qwen2.5-Coder-1.5B: 151,936 x 1,536). A Q6_K tensor runs
from its own bits (`q6_k.Q6Linear`: q - 32, int8 sub-scales, fp16 d) on 8-bit activations, else as 8-bit
blocks with an fp32 scale per 16 weights (d * sub-scale): both hold its exact values.

The decoder's layers under `pack="int4"` are Q4_1 blocks; where the file stores a layer as Q4_K (Q4_K_M
files' usual type), `FileBlocks.q4` takes its blocks as they are (each 32 weights' d * scale and
-dmin * min, exact in fp32) instead of re-quantizing the dequantized weights, which moves them; where it
stores one as Q6_K (Q4_K_M files' `attn_v` and `ffn_down` in about half the layers) or Q8_0 (Q8_0
files' every layer), `FileBlocks.q8` runs it on the 8-bit kernels as the head runs (a Q6_K tensor from
its own bits, or as 8-bit blocks with a scale per 16 where the CPU runs no 8-bit-activation kernel), so the view holds the
file's weights instead of 4-bit copies of them.

Q4_0 and Q4_1 layers are held as 4-bit blocks too (Q4_0's d * (q - 8) as scale d and minimum -8 * d, exact
in fp16), Q5_0 and IQ4_NL ones as 8-bit blocks (q - 16, or IQ4_NL's table value, each with the block's fp16 d:
Q8_0's form), and Q5_1 and Q5_K ones, where 8-bit activations run, as 8-bit blocks with a minimum a block
(`q5.Q5Linear`), and Q3_K and IQ4_XS ones as 8-bit blocks with an fp32 scale per 16 weights (q - 4, or the
IQ4_NL table value; d times the six-bit scale, exact). `held_types()` names every type a block kernel holds as
stored here; a file whose layers are of another type (F16, BF16, Q2_K, IQ2/IQ3, ...) is not lowered to 4 bits by
`pack auto` (`unheld_types`).

transformers reorders a Llama-family file's q and k rows on load (each head's rotary halves, as llama.cpp
stores them interleaved), so the file's rows are matched to the module's by value (`row_order`) and its
blocks taken in the module's order.

Invariants:
- a block layer is used only when its dequantized weights equal, bit for bit, the module it stands
  in for (checked at load), so the model verified is the model loaded, only read in fewer bytes;
- anything else (another tensor type, a shape that does not match, weights that differ, a file
  `gguf` cannot read) leaves the module as it was: `head_q8` says None, and why, to its caller.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from specdec.kernels import q4_i8, q4_kernel, q5, q6_k

HEAD_NAMES = ("output.weight", "token_embd.weight")  # the head, else the embedding a tied head shares
Q8_0_BYTES = 2 + q4_kernel.BLOCK  # a Q8_0 block: its fp16 scale, then 32 int8
Q4_K_BYTES = 2 + 2 + 12 + 128  # a Q4_K super-block of 256: fp16 d and dmin, 8 six-bit scales and mins, 4-bit q
Q6_K_BYTES = 128 + 64 + 16 + 2  # a Q6_K super-block of 256: low 4 bits, high 2 bits, 16 int8 scales, fp16 d
SMALL_BYTES = {"Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16, "Q5_0": 2 + 4 + 16, "Q5_1": 2 + 2 + 4 + 16, "IQ4_NL": 2 + 16}
Q5_K_BYTES = 2 + 2 + 12 + 32 + 128  # a Q5_K super-block of 256: fp16 d, dmin, Q4_K's scales and mins, high bits, low
# IQ4_NL's 16 levels (ggml's kvalues_iq4nl): w = d * IQ4_NL_VALUES[q]
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
Q3_K_BYTES = 32 + 64 + 12 + 2  # a Q3_K super-block of 256: high bits, low 2 bits, 16 six-bit scales, fp16 d
IQ4_XS_BYTES = 2 + 2 + 4 + 128  # an IQ4_XS super-block of 256: fp16 d, six-bit scales (high 2 bits, low 4), nibbles
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # held by the 4-bit kernel as stored (`FileBlocks.q4`)
# held by the 8-bit kernels as stored (`FileBlocks.q8`); Q3_K and IQ4_XS with an fp32 scale per 16 weights
EIGHT_BIT = ("Q8_0", "Q6_K", "Q5_0", "IQ4_NL", "Q3_K", "IQ4_XS")
HELD = FOUR_BIT + EIGHT_BIT
FIVE_BIT = ("Q5_1", "Q5_K")  # held as 8-bit blocks with a minimum where 8-bit activations run (`q5.held`)
# transformers' module names in a Llama-family decoder layer -> llama.cpp's tensor names
LAYER_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def q8_0_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's bytes [rows, cols / 32 * 34] -> (qs int8 [rows, cols], scale f16 [rows, cols / 32])."""
    blocks = cols // q4_kernel.BLOCK
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, blocks, Q8_0_BYTES)
    scale = torch.from_numpy(data[..., :2].copy().view(np.float16).reshape(rows, blocks))
    qs = torch.from_numpy(data[..., 2:].copy().view(np.int8).reshape(rows, cols))
    return qs, scale


def q6_k_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q6_K tensor's bytes [rows, cols / 256 * 210] -> (q - 32 int8 [rows, cols], sub-scales int8 [rows, cols / 16],
    d fp16 [rows, cols / 256]): w = d * sub * q (`q6_k.scales` gives each 16 weights' exact fp32 scale).

    Element order as ggml's dequantize_row_q6_K: each half of a super-block takes 64 bytes of low bits (the
    low nibbles, then the high ones) and 32 bytes of high bits (four 2-bit fields each)."""
    count = rows * (cols // 256)
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(count, Q6_K_BYTES)
    low, high = data[:, :128], data[:, 128:192]
    sub = data[:, 192:208].copy().view(np.int8).reshape(rows, cols // 16)
    d = data[:, 208:].copy().view(np.float16).reshape(rows, cols // 256)
    low = (low.reshape(count, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 15
    high = (high.reshape(count, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(count, 8, 32) | (high.reshape(count, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    qs = torch.from_numpy(np.ascontiguousarray(q.reshape(rows, cols)))
    return qs, torch.from_numpy(sub), torch.from_numpy(d)


def q4_k_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K tensor's bytes [rows, cols / 256 * 144] -> (q uint8 [rows, cols] in 0..15, (scale, min) uint8
    [rows, cols / 32, 2], (d, dmin) fp16 [rows, cols / 256, 2]): w = q * (d * scale) - dmin * min, the
    4-bit kernel's Q4_K form (`q4_kernel.q4_k_scales` gives each block's fp32 scale and minimum).

    Element order as ggml's dequantize_row_q4_K: each 64 weights take 32 bytes, the low nibbles first."""
    count = rows * (cols // 256)
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(count, Q4_K_BYTES)
    supers = data[:, 0:4].copy().view(np.float16).reshape(rows, cols // 256, 2)  # (d, dmin)
    packed = data[:, 4:16].reshape(count, 3, 4)
    first, second, both = packed[:, 0], packed[:, 1], packed[:, 2]  # six-bit fields, two bits of four spread
    sc = np.concatenate([first & 63, (both & 15) | ((first >> 2) & 48)], axis=-1)
    mins = np.concatenate([second & 63, (both >> 4) | ((second >> 2) & 48)], axis=-1)
    pairs = np.stack([sc, mins], axis=-1).reshape(rows, cols // 32, 2)
    q = (data[:, 16:].reshape(count, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 15
    return (torch.from_numpy(np.ascontiguousarray(q.reshape(rows, cols))), torch.from_numpy(np.ascontiguousarray(pairs)),
            torch.from_numpy(np.ascontiguousarray(supers)))


def q5_k_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q5_K tensor's bytes [rows, cols / 256 * 176] -> (q int8 [rows, cols] in 0..31, scale, minimum fp32
    [rows, cols / 32]): w = q * (d * scale) - dmin * min, each product exact in fp32 (Q4_K's six-bit pairs).

    Element order as ggml's dequantize_row_q5_K: each 64 weights take 32 bytes of low bits, the low nibbles
    first, and bits 2c and 2c + 1 (the c-th 64's two halves) of the super-block's 32 high-bit bytes."""
    count = rows * (cols // 256)
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(count, Q5_K_BYTES)
    as_q4_k = np.concatenate([data[:, :16], data[:, 48:]], axis=1)  # Q4_K's bytes: the high bits left out
    low, pairs, supers = q4_k_blocks(as_q4_k, rows, cols)
    high = (data[:, 16:48].reshape(count, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = low.numpy().astype(np.int8) | (high.reshape(rows, cols).astype(np.int8) << 4)
    scale, minimum = q4_kernel.q4_k_scales(pairs, supers)
    return torch.from_numpy(np.ascontiguousarray(q)), scale, minimum


def q3_k_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q3_K tensor's bytes [rows, cols / 256 * 110] -> (q int8 [rows, cols] in -4..3, fp32 scale [rows, cols / 16]):
    w = q * d * (scale - 32), the product exact in fp32 (an fp16 times a six-bit integer).

    Element order as ggml's dequantize_row_q3_K: each 128 weights take 32 bytes of low bits, 2 bits at a time
    (shifts 0, 2, 4, 6 for its four 32s, the first 16 from bytes 0..15, the next from 16..31), and the high bit
    4h + j of the 32 hmask bytes (set: +0, clear: -4); the 16 six-bit scales unpacked from 12 bytes as ggml does."""
    count = rows * (cols // 256)
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(count, Q3_K_BYTES)
    aux = data[:, 96:108].copy().view("<u4")  # [count, 3]
    low, high = aux & 0x0F0F0F0F, (aux >> 4) & 0x0F0F0F0F
    top = [((aux[:, 2] >> (2 * t)) & 0x03030303) << 4 for t in range(4)]
    packed = np.stack([low[:, 0] | top[0], low[:, 1] | top[1], high[:, 0] | top[2], high[:, 1] | top[3]], axis=1)
    sub = packed.astype("<u4").view(np.int8).reshape(count, 16).astype(np.float32) - 32
    d = data[:, 108:110].copy().view(np.float16).reshape(count, 1).astype(np.float32)
    shift = np.arange(4, dtype=np.uint8).reshape(1, 1, 4, 1, 1)  # the 32s of a 128
    lowbits = (data[:, 32:96].reshape(count, 2, 1, 2, 16) >> (2 * shift)) & 3  # 128s, 32s, 16s, l
    highbit = (data[:, :32].reshape(count, 1, 1, 2, 16) >> (np.arange(2, dtype=np.uint8).reshape(1, 2, 1, 1, 1) * 4 + shift)) & 1
    q = lowbits.astype(np.int8) - np.where(highbit == 1, 0, 4).astype(np.int8)
    return (torch.from_numpy(np.ascontiguousarray(q.reshape(rows, cols))),
            torch.from_numpy(np.ascontiguousarray((d * sub).reshape(rows, cols // 16))))


def iq4_xs_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An IQ4_XS tensor's bytes [rows, cols / 256 * 136] -> (q int8 [rows, cols], IQ4_NL's table values, fp32 scale
    [rows, cols / 16]): w = q * d * (scale - 32) per 32 weights (each 16's scale that of its 32), exact in fp32.

    As ggml's dequantize_row_iq4_xs: 32 weights k take scale bits 4 (k % 2) .. +3 of low byte k / 2 and bits
    2k, 2k + 1 of the 16-bit high word; their 16 bytes hold weights 0..15 low nibbles first, then 16..31."""
    count = rows * (cols // 256)
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(count, IQ4_XS_BYTES)
    d = data[:, 0:2].copy().view(np.float16).reshape(count, 1).astype(np.float32)
    high = data[:, 2:4].copy().view("<u2").reshape(count, 1).astype(np.int32)
    k = np.arange(8)
    scales = ((data[:, 4 + k // 2].astype(np.int32) >> (4 * (k % 2))) & 15) | (((high >> (2 * k)) & 3) << 4)
    nibbles = data[:, 8:].reshape(count, 8, 16)
    q = IQ4_NL_VALUES[np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)]
    scale = np.repeat(d * (scales - 32).astype(np.float32), 2, axis=1)
    return (torch.from_numpy(np.ascontiguousarray(q.reshape(rows, cols))),
            torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, cols // 16))))


def small_blocks(raw: np.ndarray, kind: str, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL tensor's bytes [rows, cols / 32 * size] -> (q [rows, cols], scale,
    minimum fp16 [rows, cols / 32]), w = q * scale + minimum: Q4_0 q in 0..15 with minimum -8 * d; Q4_1 its
    (d, m); Q5_1 q in 0..31 (int8) and its (d, m); Q5_0 q - 16 and IQ4_NL its table value as int8, minimum 0
    (the 8-bit kernels' form, which has none).

    Element order as ggml's dequantizers: a block's low nibbles are its weights 0..15, the high ones 16..31
    (Q5_0's fifth bit of weight i is bit i of the block's 32-bit qh)."""
    blocks = cols // q4_kernel.BLOCK
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, blocks, SMALL_BYTES[kind])
    d = data[..., :2].copy().view(np.float16).reshape(rows, blocks)
    low = data[..., -16:]
    q = np.concatenate([low & 15, low >> 4], axis=-1)  # [rows, blocks, 32]
    minimum = np.zeros_like(d)
    if kind == "Q4_0":
        minimum = d * np.float16(-8)  # a power of two: exact in fp16
    elif kind == "Q4_1":
        minimum = data[..., 2:4].copy().view(np.float16).reshape(rows, blocks)
    elif kind in ("Q5_0", "Q5_1"):
        at = 2 if kind == "Q5_0" else 4
        qh = data[..., at : at + 4].copy().view("<u4").reshape(rows, blocks, 1)
        fifth = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        q = (q | fifth).astype(np.int8) - np.int8(16 if kind == "Q5_0" else 0)
        if kind == "Q5_1":
            minimum = data[..., 2:4].copy().view(np.float16).reshape(rows, blocks)
    else:
        q = IQ4_NL_VALUES[q]
    return (torch.from_numpy(np.ascontiguousarray(q.reshape(rows, cols))), torch.from_numpy(d),
            torch.from_numpy(np.ascontiguousarray(minimum)))


def row_order(stored: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """Indices with stored[order] equal to weight bit for bit: the rows in order where they are (a file's usual
    case), else matched by value (a Llama file's q and k rows, which transformers reorders on load). None where
    a row of `weight` is not among `stored`'s."""
    if stored.shape != weight.shape:
        return None
    if torch.equal(stored, weight):
        return torch.arange(len(weight))
    width = torch.int16 if stored.element_size() == 2 else torch.int32

    def bits(values: torch.Tensor) -> np.ndarray:  # -0.0 + 0.0 is +0.0: zeros of either sign match, as in torch.equal
        return (values.detach() + 0.0).contiguous().view(width).numpy()

    places: dict[bytes, list[int]] = {}
    for index, row in enumerate(bits(stored)):
        places.setdefault(row.tobytes(), []).append(index)
    order = []
    for row in bits(weight):
        matches = places.get(row.tobytes())
        if not matches:
            return None
        order.append(matches.pop())
    return torch.tensor(order)


def held_types() -> tuple[str, ...]:
    """The GGUF types a block kernel holds as stored in this process: `HELD`, and `FIVE_BIT` on 8-bit activations."""
    return HELD + (FIVE_BIT if q5.held() else ())


def unheld_types(path: Path) -> tuple[str, ...]:
    """The types of `path`'s decoder products (`LAYER_TENSORS`) that no block kernel holds as stored here (F16,
    BF16, Q2_K, ...: 4 bits would move them), sorted; ("unreadable",) where gguf cannot read the file."""
    try:
        changed = path.stat().st_mtime_ns
    except OSError:
        return ("unreadable",)
    return _unheld_types(path, changed, held_types())


@functools.lru_cache(maxsize=8)
def _unheld_types(path: Path, changed: int, held: tuple[str, ...]) -> tuple[str, ...]:  # noqa: ARG001 - `changed` keys the cache
    try:
        import gguf

        tensors = gguf.GGUFReader(str(path)).tensors
    except Exception:  # noqa: BLE001 - any file gguf cannot read
        return ("unreadable",)
    products = {f".{name}.weight" for name in LAYER_TENSORS.values()}
    return tuple(sorted({t.tensor_type.name for t in tensors if t.name.startswith("blk.")
                         and t.name[t.name.index(".", 4):] in products} - set(held)))


def gguf_name(module_name: str) -> str | None:
    """A decoder module's tensor in the file: 'layers.3.mlp.up_proj' -> 'blk.3.ffn_up.weight' (else None)."""
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", module_name)
    if match is None or match[2] not in LAYER_TENSORS:
        return None
    return f"blk.{match[1]}.{LAYER_TENSORS[match[2]]}.weight"


class FileBlocks:
    """A GGUF file's tensors, read for 4-bit views (`FileBlocks.q4`)."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(str(path)).tensors}

    @classmethod
    def of(cls, path: Path | None) -> FileBlocks | None:
        """The file's tensors, or None without a file or where gguf cannot read it."""
        if path is None:
            return None
        try:
            return cls(Path(path))
        except Exception:  # noqa: BLE001 - a file gguf cannot read: the layers are quantized as before
            return None

    def q4(self, names: Sequence[str | None], weight: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """weight [N, K]'s 4-bit blocks as `Q4Linear` takes them (qs packed two to a byte, scale, minimum),
        the named tensors' rows stacked in order: every part Q4_K, the file's own (scale, min) and (d, dmin)
        pairs (`q4_k_blocks`); Q4_0 and Q4_1 parts, fp16 scales and minimums (`small_blocks`), fp32 beside Q4_K
        ones; a part of another type, re-quantized by Q4_1's rule (`int4.quantize`, steps rounded to fp16 as
        Q4_1 stores them). None where no named tensor is of a `FOUR_BIT` type, a name is missing, or a part's
        blocks are not `weight`'s values in some row order (`row_order`): then the caller re-quantizes."""
        from specdec.backends.torch.int4 import quantize

        tensors = [self.tensors.get(name) if name else None for name in names]
        if any(t is None for t in tensors):
            return None
        kinds = [t.tensor_type.name for t in tensors]
        if not any(kind in FOUR_BIT for kind in kinds):
            return None
        dtype = torch.float32 if "Q4_K" in kinds else torch.float16
        keep_pairs = set(kinds) == {"Q4_K"}
        parts, start = [], 0
        for tensor, kind in zip(tensors, kinds, strict=True):
            rows = int(tensor.data.shape[0])
            part = weight[start : start + rows]
            if kind in FOUR_BIT:
                blocks = _four_bit(tensor, kind, part, dtype, keep_pairs)
                if blocks is None:
                    return None
                parts.append(blocks)
            else:
                q, step, low = quantize(part)
                parts.append(q4_kernel.pack_q4(q, step.half().float(), low.half().float(), dtype))
            start += rows
        if start != weight.shape[0]:
            return None
        return tuple(torch.cat(items) for items in zip(*parts, strict=True))  # type: ignore[return-value]

    def q8(self, name: str | None, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Module | None:
        """The named `EIGHT_BIT` tensor holding exactly `weight`'s values on the 8-bit kernels: `Q8Linear` for
        Q8_0, Q5_0 and IQ4_NL (int8 values, the block's fp16 d); `q6_k.Q6Linear` for Q6_K (its own bits, 8-bit
        activations), else, where the CPU runs no 8-bit activations, `Q8Linear` with a scale per 16. None
        where it is of another type, the shapes do not fit, or its values are not `weight`'s in any row order."""
        tensor = self.tensors.get(name) if name else None
        if tensor is None or tensor.tensor_type.name not in EIGHT_BIT + FIVE_BIT or not q4_kernel.load_extension():
            return None
        return _from_tensor(tensor, weight, bias, str(name))[0]


def head_q8(gguf_path: Path | None, head: torch.nn.Module, file: FileBlocks | None = None
            ) -> tuple[torch.nn.Module | None, str]:
    """The head over the GGUF's own blocks (`Q8Linear` for Q8_0, `q6_k.Q6Linear` for Q6_K on 8-bit activations,
    else `Q8Linear` with a scale per 16), or (None, why not). `file`: the file's tensors where the caller has
    read them already (reading a GGUF parses all its metadata, a large vocabulary's too: once a view)."""
    weight = getattr(head, "weight", None)
    if gguf_path is None or weight is None or weight.dtype != torch.bfloat16:
        return None, "the head is not a bf16 weight of a GGUF model"
    if not q4_kernel.load_extension():
        return None, str(q4_kernel.unavailable_reason())
    try:
        tensors = (file if file is not None else FileBlocks(Path(gguf_path))).tensors
    except Exception as error:  # a file gguf cannot read keeps the bf16 head
        return None, f"{Path(gguf_path).name} could not be read ({type(error).__name__}: {error})"
    tensor = next((tensors[name] for name in HEAD_NAMES if name in tensors), None)
    if tensor is None:
        return None, "the GGUF has no head tensor"
    if tensor.tensor_type.name in FIVE_BIT:  # a head's users take 8-bit blocks' (q, scale): the bf16 head
        return None, f"the GGUF's head is {tensor.tensor_type.name}, which a head does not run as"
    return _from_tensor(tensor, weight, getattr(head, "bias", None), "head")


def _four_bit(tensor, kind: str, part: torch.Tensor, dtype: torch.dtype,  # noqa: ANN001 - a gguf ReaderTensor
              keep_pairs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A Q4_0, Q4_1 or Q4_K tensor's blocks, packed (scales in `dtype`, or Q4_K's pairs where `keep_pairs`), in
    `part`'s row order; None where its shape or values are not `part`'s."""
    rows, cols = part.shape
    size = Q4_K_BYTES * cols // 256 if kind == "Q4_K" else SMALL_BYTES[kind] * cols // q4_kernel.BLOCK
    if (kind == "Q4_K" and cols % 256) or tuple(tensor.data.shape) != (rows, size):
        return None
    if kind == "Q4_K":
        q, pairs, supers = q4_k_blocks(tensor.data, rows, cols)
        scale, minimum = q4_kernel.q4_k_scales(pairs, supers)
    else:
        q, scale, minimum = small_blocks(tensor.data, kind, rows, cols)
    qs, scale, minimum = q4_kernel.pack_q4(q, scale, minimum, dtype)
    order = row_order(q4_kernel.dequantize_q4(qs, scale, minimum), part)
    if order is None:
        return None
    if keep_pairs:
        scale, minimum = pairs, supers  # kept as the file has them
    return qs[order], scale[order], minimum[order]


def _from_tensor(tensor, weight: torch.Tensor, bias: torch.Tensor | None, what: str  # noqa: ANN001 - a gguf ReaderTensor
                 ) -> tuple[torch.nn.Module | None, str]:
    """An `EIGHT_BIT` tensor holding exactly `weight` [N, K]'s values (in some row order: `row_order`) as a
    module on the block kernels, or (None, why not); `what` names the tensor in the reasons."""
    rows, cols = weight.shape
    kind = tensor.tensor_type.name
    if kind in FIVE_BIT:
        return _five_bit(tensor, weight, bias, what)
    if kind not in EIGHT_BIT or cols % (q4_kernel.BLOCK if kind in ("Q8_0", "Q5_0", "IQ4_NL") else 256):
        return None, f"the GGUF's {what} is {kind}, not one of {', '.join(EIGHT_BIT + FIVE_BIT)}"
    supers = {"Q6_K": Q6_K_BYTES, "Q3_K": Q3_K_BYTES, "IQ4_XS": IQ4_XS_BYTES}  # bytes a super-block of 256
    block = Q8_0_BYTES if kind == "Q8_0" else SMALL_BYTES.get(kind, 0)
    width = cols // 256 * supers[kind] if kind in supers else cols // q4_kernel.BLOCK * block
    if tuple(tensor.data.shape) != (rows, width):
        return None, f"the GGUF's {what} is {tuple(tensor.data.shape)} bytes, the model's {rows} x {cols}"
    if kind == "Q8_0":
        qs, scale = q8_0_blocks(tensor.data, rows, cols)
    elif kind == "Q6_K":
        qs, sub, d = q6_k_blocks(tensor.data, rows, cols)
        scale = q6_k.scales(sub, d)
    elif kind in ("Q3_K", "IQ4_XS"):
        qs, scale = (q3_k_blocks if kind == "Q3_K" else iq4_xs_blocks)(tensor.data, rows, cols)
    else:
        qs, scale, _ = small_blocks(tensor.data, kind, rows, cols)
    order = row_order(q4_kernel.dequantize_q8(qs, scale), weight)
    if order is None:
        return None, f"the GGUF's {what} blocks are not the model's {what} weights"
    if kind == "Q6_K" and rows % q4_i8.GROUP == 0 and q4_kernel.default_activations() == "int8":
        return q6_k.Q6Linear(qs[order], sub[order], d[order], bias), ""  # the file's own bits, the 8-bit form's arithmetic
    return q4_kernel.Q8Linear(qs[order], scale[order], bias), ""


def _five_bit(tensor, weight: torch.Tensor, bias: torch.Tensor | None, what: str  # noqa: ANN001 - a gguf ReaderTensor
              ) -> tuple[torch.nn.Module | None, str]:
    """A Q5_1 or Q5_K tensor holding exactly `weight`'s values (in some row order) as a `q5.Q5Linear`, or (None,
    why not): where 8-bit activations run, N is a multiple of 16 and the shapes fit."""
    rows, cols = weight.shape
    kind = tensor.tensor_type.name
    width = cols // 256 * Q5_K_BYTES if kind == "Q5_K" else cols // q4_kernel.BLOCK * SMALL_BYTES[kind]
    if not q5.held() or rows % q4_i8.GROUP or cols % (256 if kind == "Q5_K" else q4_kernel.BLOCK):
        return None, f"the GGUF's {what} is {kind}, which 8-bit activations with N a multiple of 16 hold"
    if tuple(tensor.data.shape) != (rows, width):
        return None, f"the GGUF's {what} is {tuple(tensor.data.shape)} bytes, the model's {rows} x {cols}"
    if kind == "Q5_K":
        q, scale, minimum = q5_k_blocks(tensor.data, rows, cols)
    else:
        q, scale, minimum = small_blocks(tensor.data, kind, rows, cols)
    order = row_order(q5.dequantize_q5(q, scale, minimum), weight)
    if order is None:
        return None, f"the GGUF's {what} blocks are not the model's {what} weights"
    return q5.Q5Linear(q[order], scale[order], minimum[order], bias), ""
