"""Where measured timings are cached, and when a timing is too noisy to cache.

Why a module of its own: the tree-cost curves (`proposers.budget`) and the
attention plans (`attention`) are both timed once per model and machine and
cached as JSON under one key; the attention module must not import the cost
module (which imports the target, which imports the attention plan), so the
key, the file name, the atomic write and the busy test live here, below both.

Invariants: a cache key names everything a timing depends on (model, dtype,
packing, device, machine, the kernels' paths, threads, torch version, the timed shapes, the format),
so a cached timing is used only where it was measured; readers never see half a
file (temp file + rename).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from specdec.backends.torch.packed import is_invariant, pack_of, verify_model
from specdec.choices import BACKENDS
from specdec.kernels.q4_kernel import kernels_in_use
from specdec.models import LoadedModel, machine_fingerprint

FORMAT_VERSION = 17  # 17: the kernels' and PyTorch's paths in the key; 16: int4 products take 8-bit activations on AVX2 CPUs too; 15: fused passes run in one workspace, their weights handed to C++ once; 14: a GGUF's Q6_K and Q8_0 decoder tensors run on the 8-bit kernels (were re-quantized to 4 bits); 13: exact torch passes run every layer and the final norm in one C++ call; 12: sizes timed ascending and descending in turn, exact torch passes through a batch row; 11: Q6_K heads multiplied from their own 6-bit bits; 10: Q6_K heads take 8-bit activations (a scale per 16); 9: tree attention multiplies bf16 probabilities into the values (vdpbf16ps); 8: int4 products take 8-bit activations where the CPU has AVX-512 VNNI; 7: one-token steps on the fused layer run one row, Q6_K heads on the 8-bit kernel; 6: exact int4 passes run one C++ call per decoder layer, timed on the invariant plan; 5: int4 views run a GGUF's Q8_0 head on the block kernel; 4: q, k and v fused
BUSY_CPU_SHARE = 0.85  # see `contended`


def contended(cpu_share: float) -> bool:
    """True when the timed passes got less than BUSY_CPU_SHARE of the CPU time their threads could use.

    An idle machine gives a share near 1, one busy process beside the timing well under the
    threshold. The load average is not used: it missed the test suite's own server process,
    which had left a curve several times too slow in the cache.
    """
    return cpu_share < BUSY_CPU_SHARE


def cost_key(loaded: LoadedModel, sizes: Sequence[int], context_len: int) -> dict:
    model = loaded.model
    gguf = BACKENDS[loaded.backend].gguf  # the pass runs on the GGUF file: no packing, no torch invariance
    int4 = not gguf and pack_of(loaded) == "int4"
    return {
        "format": FORMAT_VERSION,
        "model": loaded.name,
        "source": str(getattr(model.config, "_name_or_path", "")),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        # the engine times what it runs
        "packed": not gguf and verify_model(loaded) is not loaded.model,
        "weights": "int4" if int4 else "as loaded",
        # the paths the pass runs on: specdec's kernels (SPECDEC_KERNELS caps them) and PyTorch's own
        # (ATEN_CPU_CAPABILITY), which the machine's flags alone do not tell
        "kernels": kernels_in_use() if int4 else None,
        "aten": torch.backends.cpu.get_cpu_capability() if loaded.device.type == "cpu" else None,
        "invariant": is_invariant(loaded) if not gguf else loaded.exact == "on",
        "backend": loaded.backend,
        "device": loaded.device.type,
        "machine": machine_fingerprint(loaded.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sizes": list(sizes),
        "context_len": context_len,
    }


def cost_file(costs_dir: Path, key: dict) -> Path:
    # What tells one configuration of a model from another is in the name too (weights, packing, backend,
    # invariance): a model timed int4 and as loaded, packed and not, on torch and on llama.cpp keeps a file
    # for each, instead of each configuration re-timing over the other's (the packed fp32 view once
    # overwrote the unpacked plan, and every server the test suite started timed it again).
    parts = [str(key[f]) for f in ("model", "dtype", "weights", "device", "threads")]
    parts += [str(key[f]) for f in ("kernels",) if key.get(f)]
    if key.get("backend", "torch") != "torch":
        parts.append(str(key["backend"]))
    if key.get("packed") and key.get("weights") != "int4":  # int4 weights always run packed
        parts.append("packed")
    if key.get("invariant"):
        parts.append("exact")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))
    return costs_dir / f"{slug}.json"


def write_json_atomic(path: Path, record: dict) -> None:
    """Write JSON via a temp file + rename, so readers never see half a file; a read-only cache only
    costs a re-measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle, indent=1)
        os.replace(temp, path)
    except OSError:
        pass
