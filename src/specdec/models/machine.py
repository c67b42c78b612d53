"""The machine a model runs on: device, dtype by CPU flags, and a fingerprint for cached timings.

Why this module exists: the right dtype (bf16 only where the CPU or GPU has
native bf16) and the validity of a cached cost curve both depend on the exact
hardware, which `/proc/cpuinfo` and CUDA describe.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import torch

from specdec.models.base import ModelLoadError

DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# The instruction sets specdec's kernels use or plan to (`specdec-hf doctor` shows which are present).
X86_FLAGS = ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
ARM_FLAGS = ("asimd", "asimddp", "i8mm", "bf16", "sve")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpuinfo_field(name: str) -> str:
    """The first `name : value` line of /proc/cpuinfo ("" where there is none, e.g. off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else the platform's word for it)."""
    return _cpuinfo_field("model name") or platform.processor() or "unknown"


def _cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo_field("flags").split())


def machine_fingerprint(device: str | torch.device) -> str:
    """Names the hardware a timing was taken on: the GPU's name, or the CPU model plus a digest of its flags.

    Two machines with the same CPU model name can differ in the instructions a VM
    exposes (AVX-512, AMX), which changes bf16 costs several-fold, hence the flags.
    """
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    flags = " ".join(sorted(_cpu_flags()))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{cpu_model()} ({os.cpu_count()} cpus, flags {digest})"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 where it is fast (CUDA with native bf16, CPUs with AVX512-BF16 or AMX), else float32.

    On CPUs without bf16 instructions, bf16 matmuls are emulated and a multi-token
    forward pass is several times slower than in float32.
    """
    kind = torch.device(device).type
    if kind == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if native else torch.float32
    if kind == "cpu" and _cpu_flags() & CPU_BF16_FLAGS:
        return torch.bfloat16
    return torch.float32


def runs_vector_kernels() -> bool:
    """Whether specdec's vector kernels run on this CPU: x86-64 with AVX2, FMA and F16C, or Arm with the dot-product
    instructions (asimddp: the 8-bit-activation products' NEON path)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return {"avx2", "fma", "f16c"} <= _cpu_flags()
    return machine in ("aarch64", "arm64") and "asimddp" in _cpuinfo_field("Features").split()


def default_dtype_reason(device: str | torch.device, chosen: torch.dtype | None = None) -> str:
    """Why dtype "auto" settled on `chosen` (default: `default_dtype(device)`), in one line (`specdec-hf doctor`).
    bf16 on a CPU without native bf16 is the GGUF rule of `specdec.models.loading.auto_bf16_first`."""
    native = default_dtype(device)
    name = str(chosen or native).removeprefix("torch.")
    kind = torch.device(device).type
    if kind == "cuda":
        return f"{name}: " + ("the GPU has native bf16" if name == "bfloat16" else "no native bf16 on this GPU")
    found = sorted(_cpu_flags() & CPU_BF16_FLAGS) if kind == "cpu" else []
    if found:
        return f"{name}: the CPU has {' and '.join(found)}"
    if chosen == torch.bfloat16 and native == torch.float32:
        return (f"{name}: a GGUF model on specdec's AVX2 or NEON kernels (the fused exact 4-bit pass: 8-bit integer "
                "products, no bf16 arithmetic); no avx512_bf16 or amx_bf16 here, so nothing else runs in bf16")
    hint = ("; a GGUF model gets bf16 here when specdec's fused exact pass runs it (int4 on the AVX2 or NEON kernels)"
            if kind == "cpu" and runs_vector_kernels() else "")
    return f"{name}: no avx512_bf16 or amx_bf16 here (bf16 would be emulated, several times slower){hint}"


def isa_flags() -> dict[str, bool]:
    """Each instruction set of X86_FLAGS (or ARM_FLAGS on Arm): present on this CPU or not."""
    arm = platform.machine().lower() in ("aarch64", "arm64")
    flags = frozenset(_cpuinfo_field("Features").split()) if arm else _cpu_flags()
    return {name: name in flags for name in (ARM_FLAGS if arm else X86_FLAGS)}


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """Turn a user's dtype choice ("auto"/None, "fp32", "bf16", "fp16", long names, a torch.dtype) into a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    choices = ", ".join(["auto", *DTYPE_NAMES])
    raise ModelLoadError(f"unknown dtype {dtype!r}; use one of: {choices}, or a torch.dtype")


