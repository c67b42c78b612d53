"""One fused pass timed with a kernel switch at each of its values in turn, in one process: bundled SmolLM2 in
bf16, 512 tokens of context, trees of the cost curve's shape (`_probe_parents`), the switch and the tree size
alternated pass by pass (ascending and descending in turn). The switch is an `extern "C"` variable that one of this
folder's diffs adds to the extension (`run.sh` applies it); every value's logits are checked equal.

Usage: python switch_ab.py VARIABLE int|long VALUES SIZES REPEATS   (e.g. specdec_dynamic int 0,2,4,8 1,2,4,8 30)
Prints, per tree size and value: the fastest pass, the lower quartile and the median, ms."""

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


def main(variable: str, ctype: str, values: list[int], sizes: list[int], repeats: int) -> None:
    loaded = load_model("smollm2-135m", dtype="bf16")
    target = timing_target(loaded)
    library = ctypes.CDLL(str(Path(q4_kernel.cache_dir()) / "specdec_kernels.so"))
    switch = (ctypes.c_long if ctype == "long" else ctypes.c_int).in_dll(library, variable)
    generator = torch.Generator().manual_seed(0)
    target.prefill(torch.randint(0, 49152, (CONTEXT,), generator=generator))
    probes = {n: (torch.randint(0, 49152, (n,), generator=generator), _probe_parents(n)) for n in sizes}
    samples = {(n, v): [] for n in sizes for v in values}
    logits = {}
    for repeat in range(repeats):
        for n in sizes if repeat % 2 == 0 else sizes[::-1]:
            for v in values if repeat % 2 == 0 else values[::-1]:
                switch.value = v
                start = time.perf_counter()
                out = target.forward_tree(*probes[n])
                elapsed = time.perf_counter() - start
                target.trim(CONTEXT)
                if repeat >= 2:  # the first two rounds warm up
                    samples[(n, v)].append(elapsed)
                logits.setdefault((n, v), out.clone())
    switch.value = values[0]
    print(f"{variable}: {len(samples[(sizes[0], values[0])])} passes a cell, ms (fastest / lower quartile / median)")
    for n in sizes:
        cells = []
        for v in values:
            s = sorted(samples[(n, v)])
            cells.append(f"{v}: {s[0] * 1e3:.3f} / {s[len(s) // 4] * 1e3:.3f} / {s[len(s) // 2] * 1e3:.3f}")
        same = all(torch.equal(logits[(n, values[0])], logits[(n, v)]) for v in values)
        print(f"{n:3d} nodes | " + " | ".join(cells) + (" | logits equal" if same else " | LOGITS DIFFER"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(v) for v in sys.argv[3].split(",")], [int(s) for s in sys.argv[4].split(",")],
         int(sys.argv[5]))
