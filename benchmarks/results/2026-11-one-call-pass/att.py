# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""Tree attention alone (specdec's kernel), 1 / 2 / 4 / 8 / 16 query rows of a tree at 512 keys of context:
SmolLM2-135M's heads (9 query, 3 key, 64 wide; 30 layers) and Qwen2.5-Coder-1.5B's (12, 2, 128; 28 layers),
median of 30 calls of every layer, ms. SRC picks the source tree (built extensions differ by tree)."""
import os
import sys
import time

import torch

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.kernels import q4_kernel

q4_kernel.load_extension()
op = torch.ops.specdec_attention.tree_attention
def tm(fn, n=30):
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
out = []
for name, H, KV, D, layers in (("smollm2", 9, 3, 64, 30), ("qwen", 12, 2, 128, 28)):
    kv = [(torch.randn(1, KV, 1024, D, generator=g).bfloat16(), torch.randn(1, KV, 1024, D, generator=g).bfloat16()) for _ in range(layers)]
    for M in (1, 2, 4, 8, 16):
        q = torch.randn(1, H, M, D, generator=g).bfloat16()
        starts = torch.full((1, M), 512)
        tail = torch.arange(512, 512 + M).expand(1, M, M).contiguous()
        counts = torch.arange(1, M + 1)[None].contiguous()
        def att():
            for k, v in kv:
                op(q, k, v, starts, tail, counts, D ** -0.5)
        out.append(f"{name} M={M} {tm(att):.3f}")
print(" | ".join(out))
