# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
# tree_attention alone: 30 layers, 512 cached keys + a chain of M rows, SmolLM2 shapes (9 q heads, 3 kv heads, D 64)
import os
import sys
import time

import torch

sys.path.insert(0, os.environ.get("SRC", str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src")))
from specdec.kernels import q4_kernel

assert q4_kernel.load_extension()
def tm(fn, n=60):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - s)
    ts.sort()
    return ts[n // 2] * 1e3
g = torch.Generator().manual_seed(0)
kv = [(torch.randn(1, 3, 1024, 64, generator=g).bfloat16(), torch.randn(1, 3, 1024, 64, generator=g).bfloat16()) for _ in range(30)]
for M in (1, 4, 8, 16):
    starts = torch.full((1, M), 512)
    tail = torch.arange(512, 512 + M).expand(1, M, M).contiguous()
    counts = torch.arange(1, M + 1)[None].contiguous()
    q = torch.randn(1, 9, M, 64, generator=g).bfloat16()
    def att():
        for k, v in kv:
            torch.ops.specdec_attention.tree_attention(q, k, v, starts, tail, counts, 0.125)
    out = torch.ops.specdec_attention.tree_attention(q, kv[0][0], kv[0][1], starts, tail, counts, 0.125)
    torch.save(out, f"/tmp/specdec-attention-out{M}.pt") if len(sys.argv) > 1 and sys.argv[1] == "save" else None
    print(f"M={M} attention {tm(att):.3f} {tm(att):.3f} ms", flush=True)
