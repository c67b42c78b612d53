"""`specdec-hf doctor`: what this machine runs for a model, every `auto` settled, each with its reason.

Why: dtype, packing, exact verification and the kernels' path are settled from the CPU's flags, the
compiler found, the extension's build and the model's source. A user whose decoding is slow (fp32 on an
AVX2 laptop, a missing compiler, a model the fused pass does not fit) should learn why from one command.
The path is `registry.describe_path`'s, the one `generate --stats` prints; the reasons come from the
backend (`registry.explain`) and from `models.machine` for the dtype.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import torch

from specdec.backends.registry import describe_path, explain, load_model
from specdec.choices import ModelSpec
from specdec.extras import installed_version
from specdec.models.machine import cpu_model, default_dtype_reason, isa_flags

# Which reason stands beside which line of the path.
REASON_OF = {"dtype": "dtype", "weights": "pack", "exact": "exact", "kernels": "kernels"}


def _compiler() -> str:
    """The C++ compiler torch's extension builder would call (`CXX`, else c++), with its version line."""
    name = shutil.which(os.environ.get("CXX", "c++"))
    if name is None:
        return "none found: specdec's kernels cannot be built (install g++ or clang++)"
    try:
        version = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"{name} (its version could not be read: {err})"
    return version.splitlines()[0] if version else name


def machine_facts() -> dict[str, str]:
    """The CPU, its instruction sets that matter here, torch, the compiler and ninja."""
    flags = isa_flags()
    present = " ".join(name for name, here in flags.items() if here) or "none of those specdec uses"
    absent = " ".join(name for name, here in flags.items() if not here)
    return {
        "cpu": f"{cpu_model()} ({os.cpu_count()} cpus, {platform.machine()})",
        "isa": present + (f" (absent: {absent})" if absent else ""),
        "torch": f"{torch.__version__}, {torch.get_num_threads()} threads",
        "compiler": _compiler(),
        "ninja": installed_version("ninja") or "not installed",
    }


def report(spec: ModelSpec) -> dict[str, dict[str, object]]:
    """{"machine": facts, "path": the settled path, "why": setting -> reason} for `spec` on this machine."""
    loaded = load_model(spec)
    why = {"dtype": default_dtype_reason(loaded.device, loaded.dtype) if spec.dtype in (None, "auto") else "as asked"}
    why.update(explain(loaded))
    return {"machine": machine_facts(), "path": describe_path(loaded), "why": why}


def format_report(result: dict[str, dict[str, object]], model: str) -> str:
    """The report as aligned text: the machine, then each line of the path with its reason."""
    lines = ["machine"] + [f"  {key:<12} {value}" for key, value in result["machine"].items()]
    lines.append(f"path ({model})")
    shown = {key: ("on" if value else "off") if isinstance(value, bool) else ("none" if value is None else str(value))
             for key, value in result["path"].items()}
    width = max(map(len, shown.values()))
    for key, value in shown.items():
        reason = result["why"].get(REASON_OF.get(key, ""), "")
        lines.append((f"  {key:<12} {value:<{width}}" + (f"  <- {reason}" if reason else "")).rstrip())
    return "\n".join(lines)
