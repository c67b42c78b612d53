"""SmolLM2's 4-bit products on the AVX-512 VNNI loop and on AMX tiles, in turn in one process (best of 40 x 5
calls, us), at the row counts MS: where tiles start to pay (`kAmxMinRows`)."""
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch

from specdec.kernels import q4_i8
from specdec.kernels import q4_kernel as K

K.load_extension()
op = torch.ops.specdec_q4.q4_linear
torch.manual_seed(0)
for (n, k) in [(576, 576), (1536, 576), (576, 1536)]:
    q = torch.randint(0, 16, (n, k))
    form = q4_i8.interleave(q, torch.full((n, k // 32), 0.01).half(), torch.full((n, k // 32), -0.08).half())
    out = []
    for m in [int(v) for v in os.environ.get("MS", "2,3,4,6,8,9,10,16").split(",")]:
        x = torch.randn(m, k).bfloat16()
        best = {}
        for _round in range(40):
            for path in ("avx512_vnni", "avx512_amx"):
                t = time.perf_counter()
                for _ in range(5):
                    op(x, *form, path)
                best[path] = min(best.get(path, 9), (time.perf_counter() - t) / 5)
        out.append(f"M{m}:{1e6*best['avx512_vnni']:.0f}/{1e6*best['avx512_amx']:.0f}")
    print(n, k, "vnni/amx us", " ".join(out), flush=True)
