# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""Prefill attention, one layer: SDPA's causal kernel vs stacked-group (grouped.py) vs eager, ms."""
import time

import torch
from grouped import gqa_attention


def t(f, n=10):
    for _ in range(3):
        f()
    s=time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter()-s)/n*1e3
dt = torch.bfloat16
for T in (400, 800, 1400):
    q = torch.randn(1, 9, T, 64, dtype=dt)
    k = torch.randn(1, 3, T, 64, dtype=dt)
    v = torch.randn(1, 3, T, 64, dtype=dt)
    kr = k.repeat_interleave(3, 1)
    vr = v.repeat_interleave(3, 1)
    mask = torch.zeros(1, 1, T, T, dtype=dt).masked_fill_(~torch.ones(T, T, dtype=torch.bool).tril(), torch.finfo(dt).min)
    a = t(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    c = t(lambda: gqa_attention(None, q, k, v, mask, scaling=0.125))
    def eager():
        s = torch.matmul(q, kr.transpose(2, 3)) * 0.125 + mask
        p = torch.softmax(s, -1, dtype=torch.float32).to(dt)
        return torch.matmul(p, vr)
    print(T, f"sdpa {a:.1f} grouped {c:.1f} eager {t(eager):.1f} ms/layer")
