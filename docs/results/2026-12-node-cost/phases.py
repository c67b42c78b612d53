"""Where a fused pass's time goes, by tree size, in one process: the phase timers of `phase-timers.diff` (each step
of a layer, summed over the 30 layers; the activations' quantization inside the products; the whole layer stack;
the 8-bit head), the tree sizes alternated pass by pass. Bundled SmolLM2, bf16, 512 tokens of context.

Usage: python phases.py SIZES REPEATS   (`run.sh` applies the diff first). Prints medians, ms a pass."""

import ctypes
import sys
import time
from pathlib import Path

import torch

from specdec.backends.registry import timing_target
from specdec.engine.costs import _probe_parents
from specdec.kernels import q4_kernel
from specdec.models import load_model

CONTEXT = 512
NAMES = {0: "input norm", 1: "qkv product", 2: "rotary, cache writes", 3: "attention", 4: "o product",
         5: "residual add", 6: "post norm", 7: "gate+up product", 9: "SiLU x up", 10: "down product",
         11: "residual add", 12: "(quantizing, in the products)", 13: "layer stack", 14: "8-bit head"}


def main(sizes: list[int], repeats: int) -> None:
    loaded = load_model("smollm2-135m", dtype="bf16")
    target = timing_target(loaded)
    library = ctypes.CDLL(str(Path(q4_kernel.cache_dir()) / "specdec_kernels.so"))
    phase = (ctypes.c_double * 16).in_dll(library, "specdec_phase")
    generator = torch.Generator().manual_seed(0)
    target.prefill(torch.randint(0, 49152, (CONTEXT,), generator=generator))
    probes = {n: (torch.randint(0, 49152, (n,), generator=generator), _probe_parents(n)) for n in sizes}
    totals = {n: [] for n in sizes}
    parts = {n: {i: [] for i in NAMES} for n in sizes}
    for repeat in range(repeats):
        for n in sizes if repeat % 2 == 0 else sizes[::-1]:
            for i in range(16):
                phase[i] = 0.0
            start = time.perf_counter()
            target.forward_tree(*probes[n])
            elapsed = time.perf_counter() - start
            target.trim(CONTEXT)
            if repeat >= 2:
                totals[n].append(elapsed)
                for i in NAMES:
                    parts[n][i].append(phase[i])

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2] * 1e3

    print(f"medians of {len(totals[sizes[0]])} passes a size, ms; {CONTEXT} tokens of context")
    print(f"{'nodes':30s}" + "".join(f"{n:>8d}" for n in sizes))
    print(f"{'whole pass':30s}" + "".join(f"{median(totals[n]):8.3f}" for n in sizes))
    for i, name in NAMES.items():
        print(f"{name:30s}" + "".join(f"{median(parts[n][i]):8.3f}" for n in sizes))
    rest = [median(totals[n]) - median(parts[n][13]) - median(parts[n][14]) for n in sizes]
    print(f"{'the rest (Python, inputs)':30s}" + "".join(f"{r:8.3f}" for r in rest))


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1].split(",")], int(sys.argv[2]))
