"""Tree attention alone on its two x86-64 paths in one process, in turn: 30 calls (a SmolLM2 pass's layers),
SmolLM2's heads (9 query, 3 key heads of 64), T rows each seeing `ctx` cached keys and up to 8 of the tree's,
best of 20 rounds, ms. Needs a CPU with AMX-BF16."""

import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch  # noqa: E402

from specdec.kernels import q4_kernel  # noqa: E402

assert q4_kernel.load_extension()
attention = torch.ops.specdec_attention.tree_attention
paths = ("avx512_bf16", "avx512_amx")
torch.manual_seed(0)
for ctx in (128, 512, 1024, 2048):
    cells = []
    for rows in (1, 4, 8, 16):
        q = torch.randn(1, 9, rows, 64).bfloat16()
        k = torch.randn(1, 3, ctx + 64, 64).bfloat16()
        v = torch.randn_like(k)
        start = torch.full((1, rows), ctx, dtype=torch.long)
        count = torch.arange(1, rows + 1).view(1, rows).clamp(max=8)
        tail = (ctx + torch.arange(8)).view(1, 1, 8).expand(1, rows, 8).contiguous()
        best = dict.fromkeys(paths, float("inf"))
        for _round in range(20):
            for path in paths:
                began = time.perf_counter()
                for _ in range(30):
                    attention(q, k, v, start, tail, count, 0.125, path)
                best[path] = min(best[path], time.perf_counter() - began)
        cells.append(f"T{rows} {1e3 * best[paths[0]]:.2f}/{1e3 * best[paths[1]]:.2f}")
    print(f"context {ctx}, ms bf16/amx: " + "  ".join(cells), flush=True)
