# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""One layer's attention (SmolLM2 shapes: 3 key heads, 3 query heads each) in isolation, µs per call."""
import time

import torch


def t(f, n=200):
    for _ in range(10):
        f()
    s=time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter()-s)/n*1e6
for L in (384, 1024, 2048):
  for q in (1, 12):
    for dt in (torch.bfloat16, torch.float32):
        qq = torch.randn(1, 3, 3*q, 64, dtype=dt)
        k = torch.randn(1, 3, L, 64, dtype=dt)
        v = torch.randn(1,3,L,64,dtype=dt)
        kt = k.transpose(2,3)
        a = t(lambda: torch.matmul(qq, kt))
        sc = torch.matmul(qq, kt)
        b = t(lambda: torch.softmax(sc, -1, dtype=torch.float32).to(dt))
        p = torch.softmax(sc, -1, dtype=torch.float32).to(dt)
        c = t(lambda: torch.matmul(p, v))
        q9 = torch.randn(1, 9, q, 64, dtype=dt)
        d = t(lambda: torch.matmul(q9, k[:, :, None].expand(1,3,3,L,64).reshape(1,9,L,64).transpose(2,3)))
        e = t(lambda: torch.nn.functional.scaled_dot_product_attention(q9, k, v, enable_gqa=True))
        f = t(lambda: torch.nn.functional.scaled_dot_product_attention(q9, k[:, :, None].expand(1,3,3,L,64).reshape(1,9,L,64), v[:, :, None].expand(1,3,3,L,64).reshape(1,9,L,64)))
        print(L, q, str(dt)[6:], f"qk {a:.0f}us softmax {b:.0f} pv {c:.0f} | rep-qk {d:.0f} | sdpa-gqa {e:.0f} sdpa-rep {f:.0f}  (x30 layers)")
