"""A few-row GEMM for 4-bit and 8-bit weights (llama.cpp's Q4_1 and Q8_0 layouts): a small C++ extension
and its reference.

Why: a speculative-decoding verification pass multiplies 1..64 token rows by every weight matrix.
PyTorch's own CPU int4 kernel dequantizes the weight again for every row, and a bf16 weight is four
times the bytes. `csrc/q4_gemm.cpp` reads each 4-bit block once per call, dequantizes it to bf16 once
and multiplies every row with it (bf16 products, fp32 accumulation). It is built on first use with
`torch.utils.cpp_extension` (a C++ compiler and ninja are needed); where it cannot be built,
`load_extension()` says False and `unavailable_reason()` why, and callers keep PyTorch's own int4
kernel (`specdec.backends.torch.int4`). Where the CPU has AVX-512 VNNI or AVX2, `Q4Linear` and `Q8Linear` hold
their blocks in a second form and multiply activations quantized to 8 bits (`q4_i8`, `csrc/q4_gemm_i8.cpp`,
`csrc/q4_gemm_i8_avx2.cpp`, with AVX-VNNI's `vpdpbusd` where the CPU has it; AMX tiles from 10 rows on,
`csrc/q4_gemm_i8_amx.cpp`): about half the instructions; the
ops take that form when `qs` is 3-D.
`SPECDEC_KERNELS` (`kernels_cap`) caps the instruction sets every kernel may use, to compare paths or
rule one out.

The format: for W [N, K], K a multiple of 32, `qs` uint8 [N, K/2] holds each block of 32 as 16 bytes,
byte j's low nibble the q of element j and its high nibble that of element j + 16; `scale` and
`minimum` are float16 [N, K/32] (or float32, exact products; or a Q4_K tensor's own uint8 (scale, min) pairs
[N, K/32, 2] and fp16 (d, dmin) pairs [N, K/256, 2], `q4_k_scales`). The weight multiplied is
    w = bf16(fp32(fp32(q) * fp32(scale)) + fp32(minimum))      (round to nearest even),
what a bf16 model dequantized from a Q4_1 GGUF holds. The 8-bit sibling (`q8_linear`, `Q8Linear`) takes
`qs` int8 [N, K] and `scale` float16 [N, K/32] (Q8_0: w = bf16(fp32(q) * fp32(scale))); a GGUF's output
head is often Q8_0 (the bundled model's is), so the head's weights are the GGUF's own at half bf16's bytes.

Invariants:
- the weight is `dequantize_q4`'s bit for bit (a product with a one-hot row returns it exactly; the
  vector paths compute q * scale + minimum with one FMA, which rounds the same: q * scale, a 4-bit
  integer times an 11-bit fp16 significand, is exact in fp32), and the activations are rounded to
  bf16 first, fp32 ones included: only the summation order differs from `reference_q4_linear`
  (fp32 over the same exact products);
- row independence: an output row's bits do not depend on how many rows share the call or where the
  row sits (threads split the output columns, never K; every tile shape runs the same lanes in the
  same order), so a tree's node gets the same logits whatever the tree's width;
- the C++ paths (`avx512_bf16`, `avx2`, `scalar`, picked at run time for the CPU) agree to rounding,
  not bitwise: one machine always runs the same path unless a caller forces another;
- importing this module never builds or raises; the build is attempted once per process.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from specdec.kernels import q4_i8
from specdec.models.base import default_cache_dir

BLOCK = 32  # weights per (scale, minimum): Q4_1's block
LEVELS = 15  # q in 0..LEVELS
PATHS = ("avx512_bf16", "avx2", "scalar")  # the C++ kernel's paths, fastest first
_SOURCE = Path(__file__).parent / "csrc" / "q4_gemm.cpp"
# One extension: the block products, tree attention, and a decoder layer built from both (`specdec.backends.torch.fused`)
_SOURCES = (_SOURCE, _SOURCE.with_name("q4_gemm_portable.cpp"), _SOURCE.with_name("q4_gemm_i8.cpp"),
            _SOURCE.with_name("q4_gemm_i8_scalar.cpp"), _SOURCE.with_name("q4_gemm_i8_avx2.cpp"), _SOURCE.with_name("q4_gemm_i8_amx.cpp"),
            _SOURCE.with_name("q4_gemm_i8_neon.cpp"), _SOURCE.with_name("quantize_i8.cpp"),
            _SOURCE.with_name("tree_attention.cpp"), _SOURCE.with_name("tree_attention_amx.cpp"),
            _SOURCE.with_name("top_tokens.cpp"), _SOURCE.with_name("kv_paths.cpp"),
            _SOURCE.with_name("decoder_layer.cpp"), _SOURCE.with_name("portable.cpp"))
_EXTENSION = "specdec_kernels"
# -ffp-contract=off: no multiply-add is fused behind the kernel's back (the dequantization and the scalar
# path round where the reference does)
_CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]
_FALLBACK = "PyTorch's own int4 kernel (specdec.backends.torch.int4) is used instead"


def pack_q4(
    q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] in 0..15, scale and minimum [N, K/32] -> (qs uint8 [N, K/2], scale, minimum in `dtype`:
    float16 (Q4_1's), or float32 for scales that are exact products already (`exact_fp32_scales`))."""
    rows, cols = q.shape
    if cols % BLOCK:
        raise ValueError(f"K = {cols} is not a multiple of {BLOCK}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > LEVELS):
        raise ValueError(f"q must lie in 0..{LEVELS}")
    blocks = cols // BLOCK
    if tuple(scale.shape) != (rows, blocks) or tuple(minimum.shape) != (rows, blocks):
        raise ValueError(f"scale and minimum must be [{rows}, {blocks}], got {list(scale.shape)}, "
                         f"{list(minimum.shape)}")
    return _nibbles(q), scale.to(dtype).contiguous(), minimum.to(dtype).contiguous()


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in 0..15 -> qs uint8 [N, K/2], two to a byte in Q4_1's order."""
    rows, cols = q.shape
    halves = q.to(torch.uint8).reshape(rows, cols // BLOCK, 2, BLOCK // 2)  # elements 0..15, then 16..31
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(rows, cols // 2).contiguous()


def q4_k_scales(pairs: torch.Tensor, supers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_K tensor's uint8 (scale, min) pairs [N, K/32, 2] and fp16 (d, dmin) pairs [N, K/256, 2] -> each
    block's scale d * scale and minimum -(dmin * min), fp32 [N, K/32] (exact: an fp16 times a 6-bit integer)."""
    wide = supers.float().repeat_interleave(8, dim=1)  # [N, K/32, 2]: each block's super-block (d, dmin)
    return wide[..., 0] * pairs[..., 0].float(), -(wide[..., 1] * pairs[..., 1].float())


def exact_fp32_scales(scale: torch.Tensor) -> bool:
    """Whether fp32 scales keep q * scale exact in fp32 for every 4-bit q (at most 20 significant bits: the
    low 4 stored bits zero), so the kernel's FMA rounds as `dequantize_q4`'s two steps do. A Q4_K tensor's
    d * scale (an fp16 times a 6-bit integer) has at most 17."""
    return scale.dtype == torch.float32 and not bool((scale.contiguous().view(torch.int32) & 15).any())


def unpack_q4(qs: torch.Tensor) -> torch.Tensor:
    """qs uint8 [N, K/2] -> q uint8 [N, K] in 0..15 (`pack_q4`'s inverse)."""
    rows, half = qs.shape
    pairs = qs.reshape(rows, half // (BLOCK // 2), BLOCK // 2)
    return torch.stack([pairs & 15, pairs >> 4], dim=2).reshape(rows, half * 2)


def dequantize_q4(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """The bf16 weight [N, K] the kernel multiplies by: fp32 q * scale, then + minimum, then to bf16."""
    if scale.dtype == torch.uint8:  # a Q4_K tensor's pairs
        scale, minimum = q4_k_scales(scale, minimum)
    q = unpack_q4(qs).float()
    rows, cols = q.shape
    product = q.reshape(rows, cols // BLOCK, BLOCK) * scale.float()[..., None]  # two ops: no FMA
    weight = product + minimum.float()[..., None]
    return weight.reshape(rows, cols).to(torch.bfloat16)


def reference_q4_linear(
    x: torch.Tensor, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: bf16-rounded x times the bf16 weight, in fp32 (pure PyTorch)."""
    weight = dequantize_q4(qs, scale, minimum).float()
    return (x.to(torch.bfloat16).float() @ weight.T).to(x.dtype)


def pack_q8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] in -128..127 and scale [N, K/32] -> (qs int8 [N, K], scale f16): Q8_0's blocks, unpacked."""
    rows, cols = q.shape
    if cols % BLOCK:
        raise ValueError(f"K = {cols} is not a multiple of {BLOCK}")
    if q.numel() and (int(q.min()) < -128 or int(q.max()) > 127):
        raise ValueError("q must lie in -128..127")
    if tuple(scale.shape) != (rows, cols // BLOCK):
        raise ValueError(f"scale must be [{rows}, {cols // BLOCK}], got {list(scale.shape)}")
    return q.to(torch.int8).contiguous(), scale.to(torch.float16).contiguous()


def quantize_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> Q8_0's blocks (`pack_q8`'s layout) by ggml's rule: per 32 weights d = max|w| / 127
    in fp32, q = w * (1 / d) rounded half away from zero, d kept as fp16 (a block of zeros: d 0, q 0)."""
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"K = {cols} is not a multiple of {BLOCK}")
    blocks = weight.detach().float().reshape(rows, cols // BLOCK, BLOCK)
    d = blocks.abs().amax(-1) / 127
    x = blocks * torch.where(d > 0, 1 / d, 0.0)[..., None]
    q = torch.sign(x) * torch.floor(x.abs() + 0.5)
    return pack_q8(q.reshape(rows, cols), d)


def dequantize_q8(qs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The bf16 weight [N, K] the 8-bit kernel multiplies by: fp32 q * scale, then to bf16. scale: fp16
    [N, K/32] (Q8_0: the product is exact) or fp32 [N, K/16] (a scale per 16 weights: Q6_K's sub-blocks)."""
    rows, cols = qs.shape
    size = BLOCK // 2 if scale.dtype == torch.float32 else BLOCK
    weight = qs.float().reshape(rows, cols // size, size) * scale.float()[..., None]
    return weight.reshape(rows, cols).to(torch.bfloat16)


def reference_q8_linear(x: torch.Tensor, qs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: bf16-rounded x times the bf16 weight, in fp32 (pure PyTorch)."""
    return (x.to(torch.bfloat16).float() @ dequantize_q8(qs, scale).float().T).to(x.dtype)


def cache_dir() -> Path:
    """Where the extension is built: `extensions/<torch version>` in specdec's cache (`default_cache_dir`)."""
    return default_cache_dir() / "extensions" / torch.__version__


def _put_ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; a venv's own ninja is not on it unless the venv is active."""
    if shutil.which("ninja"):
        return
    folders = [Path(sys.executable).parent]
    try:
        import ninja  # the PyPI package: its binary's folder

        folders.insert(0, Path(ninja.BIN_DIR))
    except ImportError:
        pass
    for folder in folders:
        if (folder / "ninja").exists():
            os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
            return


def _one_line(error: BaseException) -> str:
    """The error's type and its most telling line (a compiler's "error:" line before a command line)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    telling = [line for line in lines if "error:" in line.lower()] or lines or [""]
    return f"{type(error).__name__}: {telling[0][:300]}"


def _register_fake() -> None:
    """The op's output shape without running it: what torch.compile traces with."""

    @torch.library.register_fake("specdec_q4::q4_linear")
    def _q4_linear_shape(x: torch.Tensor, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                         path: str | None = None) -> torch.Tensor:
        if qs.dim() == 3:  # the interleaved form (`q4_i8`): [N/16, K/32, 256]
            torch._check(x.shape[1] == q4_i8.BLOCK * qs.shape[1], lambda: "q4_linear: x's K must be 32 x qs's blocks")
            return x.new_empty(x.shape[0], q4_i8.GROUP * qs.shape[0])
        torch._check(x.shape[1] == 2 * qs.shape[1], lambda: "q4_linear: x's K must be twice qs's columns")
        return x.new_empty(x.shape[0], qs.shape[0])

    @torch.library.register_fake("specdec_q4::q8_linear")
    def _q8_linear_shape(x: torch.Tensor, qs: torch.Tensor, scale: torch.Tensor,
                         path: str | None = None) -> torch.Tensor:
        if qs.dim() == 3:  # the interleaved form (`q4_i8.interleave8`): [N/16, K/32, 512]
            torch._check(x.shape[1] == q4_i8.BLOCK * qs.shape[1], lambda: "q8_linear: x's K must be 32 x qs's blocks")
            return x.new_empty(x.shape[0], q4_i8.GROUP * qs.shape[0])
        torch._check(x.shape[1] == qs.shape[1], lambda: "q8_linear: x's K must equal qs's columns")
        return x.new_empty(x.shape[0], qs.shape[0])

    @torch.library.register_fake("specdec_q4::q6_linear")
    def _q6_linear_shape(x: torch.Tensor, qs: torch.Tensor, scale: torch.Tensor, d: torch.Tensor,
                         path: str | None = None) -> torch.Tensor:
        torch._check(x.shape[1] == q4_i8.BLOCK * qs.shape[1], lambda: "q6_linear: x's K must be 32 x qs's blocks")
        return x.new_empty(x.shape[0], q4_i8.GROUP * qs.shape[0])


KERNEL_CAPS = ("auto", "avx512", "avx2", "scalar")  # SPECDEC_KERNELS: the widest instruction set kernels may use


def kernels_cap() -> str:
    """SPECDEC_KERNELS, checked: "auto" (unset: the CPU's best) or the widest instruction set every kernel
    may use ("avx512", "avx2", "scalar"; the C++ side reads the same variable)."""
    value = os.environ.get("SPECDEC_KERNELS") or "auto"
    if value not in KERNEL_CAPS:
        raise ValueError(f"SPECDEC_KERNELS must be one of {', '.join(KERNEL_CAPS)}, got {value!r}")
    return value


@functools.cache
def _build() -> str | None:
    """Builds (or finds in the cache) and loads the extension, once a process: None, or why not."""
    kernels_cap()  # a bad SPECDEC_KERNELS is the user's to fix: raised, not a silent fallback
    if sys.platform == "win32" or not _SOURCE.exists():
        return f"the 4-bit GEMM extension is not available on this platform; {_FALLBACK}"
    try:
        from torch.utils import cpp_extension

        _put_ninja_on_path()
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        # -fopenmp: at::parallel_for is a header template that runs serially unless compiled with OpenMP;
        # the extension then shares the OpenMP runtime libtorch_cpu already loaded (same soname).
        cpp_extension.load(name=_EXTENSION, sources=[str(path) for path in _SOURCES], extra_cflags=_CFLAGS,
                           extra_ldflags=["-fopenmp"], is_python_module=False,
                           build_directory=str(directory), verbose=False)
        _register_fake()
    except Exception as error:  # no compiler, no ninja, a compile error: all mean "not here"
        return f"the 4-bit GEMM extension could not be built ({_one_line(error)}); {_FALLBACK}"
    return None


def is_loaded() -> bool:
    """Whether this process has loaded the extension already (never builds: for callers with a fallback)."""
    return _build.cache_info().currsize > 0 and _build() is None


def load_extension() -> bool:
    """Builds and loads `csrc/q4_gemm.cpp` (registering `torch.ops.specdec_q4`); False where it cannot."""
    return _build() is None


def unavailable_reason() -> str | None:
    """Why the extension cannot be used here (naming the fallback), or None where it loads."""
    return _build()


def kernel_path() -> str | None:
    """The path the kernel runs on this CPU ("avx512_bf16", "avx2" or "scalar"), None without it."""
    return str(torch.ops.specdec_q4.q4_linear_path()) if load_extension() else None


def i8_path() -> str | None:
    """The path the 8-bit-activation products run here ("avx512_amx", "avx512_vnni", "avx_vnni", "avx2",
    "neon_dotprod" or "scalar"), None without the extension."""
    return str(torch.ops.specdec_q4.q4_linear_i8_paths()[0]) if load_extension() else None


def kernels_in_use() -> str | None:
    """The paths an int4 pass takes here, "<block products>+<the fused layer's steps and tree attention>" (e.g.
    "avx512_vnni+avx512_bf16", "avx2+avx2"), None where this process has not loaded the extension."""
    if not is_loaded():
        return None
    products = i8_path() if default_activations() == "int8" else kernel_path()
    return f"{products}+{torch.ops.specdec_attention.steps_path()}"


ACTIVATIONS = ("bf16", "int8")  # what Q4Linear multiplies its 4-bit blocks by


def default_activations() -> str:
    """"int8" where the CPU runs the 8-bit-activation kernel (`q4_i8`; AVX-512 VNNI or AVX2), else "bf16"."""
    return "int8" if load_extension() and bool(torch.ops.specdec_q4.q4_linear_i8_fast()) else "bf16"


def rows_through(layer: torch.nn.Module, x: torch.Tensor, product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A block layer's forward: x [..., in_features] as one contiguous [M, K] matrix through `product`, plus the
    layer's bias, back to [..., out_features]."""
    y = product(x.reshape(-1, layer.in_features).contiguous())
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*x.shape[:-1], layer.out_features)


class Q4Linear(torch.nn.Module):
    """y = x @ W.T + b with W held as Q4_1 blocks (`pack_q4`'s layout), multiplied by the C++ kernel.

    activations: "bf16" (x rounded to bf16, the blocks dequantized to bf16) or "int8" (x quantized per
    row and block of 32, the blocks held interleaved: `q4_i8`); None: `default_activations()`."""

    rounded = False  # made by re-quantizing weights it does not hold exactly (`int4.int4_linear` says)

    def __init__(self, qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                 bias: torch.Tensor | None = None, activations: str | None = None) -> None:
        super().__init__()
        if not load_extension():
            raise RuntimeError(unavailable_reason())
        self.out_features, self.in_features = qs.shape[0], qs.shape[1] * 2
        fits = self.out_features % q4_i8.GROUP == 0  # the interleaved form's column groups
        self.activations = activations or (default_activations() if fits else "bf16")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
        blocks = (self.out_features, self.in_features // BLOCK)
        if scale.dtype == torch.uint8:  # a Q4_K tensor's (scale, min) and (d, dmin) pairs, as the file has them
            if tuple(scale.shape) != (*blocks, 2) or tuple(minimum.shape) != (blocks[0], blocks[1] // 8, 2):
                raise ValueError(f"Q4_K pairs must be [{blocks[0]}, {blocks[1]}, 2] and [{blocks[0]}, {blocks[1] // 8}, 2]")
            dtypes = (torch.uint8, torch.float16)
        elif tuple(scale.shape) != blocks or tuple(minimum.shape) != blocks:
            raise ValueError(f"scale and minimum must be {list(blocks)}")
        elif scale.dtype == torch.float32:  # exact products stay fp32; any other dtype is Q4_1's fp16
            if not exact_fp32_scales(scale):
                raise ValueError("float32 scales must have at most 20 significant bits (q * scale exact in fp32)")
            dtypes = (torch.float32, torch.float32)
        else:
            dtypes = (torch.float16, torch.float16)
        qs, scale, minimum = qs.to(torch.uint8).contiguous(), scale.to(dtypes[0]), minimum.to(dtypes[1])
        if self.activations == "int8":
            qs, scale, minimum = q4_i8.interleave(unpack_q4(qs), scale, minimum)
        self.register_buffer("qs", qs)
        self.register_buffer("scale", scale.contiguous())
        self.register_buffer("minimum", minimum.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach())

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qs, scale, minimum) in the column form (`pack_q4`'s layout), whichever form the layer holds."""
        if self.activations == "bf16":
            return self.qs, self.scale, self.minimum
        q, scale, minimum = q4_i8.deinterleave(self.qs, self.scale, self.minimum)
        return _nibbles(q), scale, minimum

    @classmethod
    def from_q(cls, q: torch.Tensor, step: torch.Tensor, minimum: torch.Tensor,
               bias: torch.Tensor | None = None, activations: str | None = None) -> Q4Linear:
        """From q [N, K] in 0..15 and each block's step and minimum [N, K/32] (w = q * step + minimum)."""
        return cls(*pack_q4(q, step, minimum), bias, activations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] (bf16 or fp32) -> [..., out_features] in x's dtype."""
        return rows_through(self, x, lambda rows: torch.ops.specdec_q4.q4_linear(rows, self.qs, self.scale, self.minimum))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, q4_1 blocks of {BLOCK}"
                + {torch.float32: ", fp32 scales", torch.uint8: ", q4_k scales"}.get(self.scale.dtype, "")
                + f", {self.activations} activations")


class Q8Linear(torch.nn.Module):
    """y = x @ W.T + b with W held as 8-bit blocks of 32, multiplied by the C++ kernel: Q8_0's (`pack_q8`'s
    layout: an fp16 scale a block) or, with an fp32 scale [N, K/16], one scale per 16 weights (Q6_K's)."""

    def __init__(self, qs: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                 activations: str | None = None) -> None:
        super().__init__()
        if not load_extension():
            raise RuntimeError(unavailable_reason())
        self.out_features, self.in_features = qs.shape
        self.per = BLOCK // 2 if scale.dtype == torch.float32 else BLOCK
        if tuple(scale.shape) != (self.out_features, self.in_features // self.per):
            raise ValueError(f"scale must be [{self.out_features}, {self.in_features // self.per}]")
        # 8-bit activations like Q4Linear's (`q4_i8`), a scale per block of 32 or per 16 weights
        fits = self.out_features % q4_i8.GROUP == 0
        self.activations = (activations or default_activations()) if fits else "bf16"
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
        qs = qs.to(torch.int8).contiguous()
        scale = scale.contiguous() if self.per < BLOCK else scale.to(torch.float16).contiguous()
        if self.activations == "int8":
            qs, scale = q4_i8.interleave8(qs, scale)
        self.register_buffer("qs", qs)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> Q8Linear:
        """`linear`'s weight as Q8_0 blocks (`quantize_q8`), its bias kept in fp32."""
        bias = None if linear.bias is None else linear.bias.detach().float()
        return cls(*quantize_q8(linear.weight), bias)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(qs int8 [N, K], scale) in the column form (`pack_q8`'s layout), whichever form the layer holds."""
        return (self.qs, self.scale) if self.activations == "bf16" else q4_i8.deinterleave8(self.qs, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] (bf16 or fp32) -> [..., out_features] in x's dtype."""
        return rows_through(self, x, lambda rows: torch.ops.specdec_q4.q8_linear(rows, self.qs, self.scale))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, 8-bit blocks of {BLOCK}, a scale per {self.per}, "
                f"{self.activations} activations")


def block_head_rows(head: torch.nn.Module, rows: int) -> Q8Linear:
    """A head of 8-bit blocks (`Q8Linear`, `Q6Linear`) cut to its first `rows` output rows, rounded up to a
    whole group of `q4_i8.GROUP` so a Q8_0 head's rows keep their bits and its 8-bit activations' form."""
    rows = min(-(-rows // q4_i8.GROUP) * q4_i8.GROUP, head.out_features)
    qs, scale = head.blocks()
    bias = None if head.bias is None else head.bias[:rows]
    return Q8Linear(qs[:rows], scale[:rows], bias, getattr(head, "activations", None))


def main() -> int:
    """Builds the extension (e.g. at install time) and says which path it runs, or why it cannot."""
    if load_extension():
        print(f"specdec 4-bit GEMM extension: loaded from {cache_dir()}, path {kernel_path()}, "
              f"{default_activations()} activations by default")
    else:
        print(unavailable_reason())
    return 0  # a missing compiler is not an install failure: the fallback runs


if __name__ == "__main__":
    raise SystemExit(main())
