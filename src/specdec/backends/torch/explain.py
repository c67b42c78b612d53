"""Why the torch backend settles `pack`, `exact` and the kernels as it does for a loaded model: the reasons
`specdec-hf doctor` prints beside the path (`registry.describe_path`).

Why: `auto` decides from the CPU's flags, the extension's build, the model's source and its dtype, and a
user whose decoding is slow (fp32 on an AVX2 laptop, no compiler, a model the fused pass does not fit)
should read why in one line, not in the code. Each reason is built from the same predicates the
decisions use (`packed.pack_of`, `packed.is_invariant`, `invariant.wants_invariance`), in their order;
tests/test_doctor.py checks that each reason's verdict is the value settled.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.backends.torch import fused
from specdec.backends.torch.gguf_blocks import unheld_types
from specdec.backends.torch.int4 import has_invariant_int4
from specdec.backends.torch.invariant import kernel_runs_here
from specdec.backends.torch.packed import is_invariant, pack_of, wants_packing
from specdec.kernels import q4_kernel
from specdec.models import LoadedModel


def kernels_reason(used: bool) -> str:
    """The C++ extension: built and which ISA path its block products take, or why not (and the fallback)."""
    why = q4_kernel.unavailable_reason()
    if why is not None:
        return why
    products, steps = (q4_kernel.kernels_in_use() or "+").split("+")
    if not used:
        return f"built (paths {products}+{steps}), unused: the weights are not int4"
    attention = "tree attention runs here" if kernel_runs_here() else "tree attention does not run here"
    return f"block products on the {products} path, the fused layer's steps on the {steps} path, {attention}"


def pack_reason(loaded: LoadedModel) -> str:
    """Why `pack_of(loaded)` is what it is."""
    pack = pack_of(loaded)
    if loaded.pack != "auto":
        return f"{pack}: as asked"
    unheld = unheld_types(Path(loaded.gguf_path)) if loaded.gguf_path is not None else ()
    blockers = [
        (loaded.gguf_path is None, "the model has no GGUF source (int4 runs a GGUF's own blocks)"),
        (loaded.backend != "torch", f"backend {loaded.backend} verifies on its own weights"),
        (loaded.exact == "off", "exact is off (int4 is the fused exact pass's weights)"),
        (loaded.dtype != torch.bfloat16, f"dtype {str(loaded.dtype).removeprefix('torch.')} (int4 runs in bf16)"),
        (loaded.device.type != "cpu", f"device {loaded.device.type} (int4 is a CPU kernel)"),
        (not fused.fits(loaded.model.config), "the fused pass does not fit this architecture"),
        (bool(unheld), f"the file stores layers as {', '.join(unheld)}, which 4-bit blocks would move (--pack "
                       "int4 runs the fused pass on a 4-bit copy of them)"),
        (not has_invariant_int4(loaded.dtype), f"specdec's kernel is not loaded: {q4_kernel.unavailable_reason()}"),
        (not kernel_runs_here(), "specdec's tree attention does not run here"),
    ]
    why = next((text for blocked, text in blockers if blocked), None)
    if why is None:
        return f"{pack}: a GGUF source in bf16 verifies on the file's own 4- and 8-bit blocks on the fused exact pass"
    packing = "packed" if wants_packing(pack, loaded.model) else "not packed"
    return f"{pack} ({packing}): not int4, {why}"


def exact_reason(loaded: LoadedModel) -> str:
    """Why verification is, or is not, batch-invariant."""
    on = "on" if is_invariant(loaded) else "off"
    if loaded.exact != "auto":
        return f"{on}: as asked"
    if on == "on":
        return "on: bf16 on a CPU with specdec's tree attention and packed weights, where it costs nothing"
    blockers = [
        (loaded.device.type != "cpu", f"device {loaded.device.type}"),
        (loaded.dtype != torch.bfloat16, f"dtype {str(loaded.dtype).removeprefix('torch.')} (auto turns it on in bf16)"),
        (not kernel_runs_here(), "specdec's tree attention does not run here (x86-64 and the extension)"),
        (not wants_packing(pack_of(loaded), loaded.model), "the weights are not packed (pack off)"),
    ]
    why = next((text for blocked, text in blockers if blocked), "this backend's pass cannot be batch-invariant")
    return f"off: {why}"


def reasons(loaded: LoadedModel) -> dict[str, str]:
    """setting -> why, for the torch backend."""
    used = pack_of(loaded) == "int4"
    return {"pack": pack_reason(loaded), "exact": exact_reason(loaded), "kernels": kernels_reason(used)}
