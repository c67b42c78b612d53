# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""Batched products on a view of a preallocated cache buffer (copied by PyTorch) vs a dense copy vs one product per head."""
import time

import torch


def t(f, n=300):
    for _ in range(20):
        f()
    s=time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter()-s)/n*1e6
dt = torch.bfloat16
for L in (128, 1024, 2048):
    buf = torch.randn(1, 3, 4096, 64, dtype=dt)
    k = buf[:, :, :L]
    kc = k.contiguous()
    vbuf = torch.randn(1, 3, 4096, 64, dtype=dt)
    v = vbuf[:, :, :L]
    vc = v.contiguous()
    q = torch.randn(1, 3, 12, 64, dtype=dt)
    p = torch.randn(1, 3, 12, L, dtype=dt)
    print(L, f"qk view {t(lambda: q @ k.transpose(2,3)):.0f}us  contig {t(lambda: q @ kc.transpose(2,3)):.0f}  "
          f"k@qT {t(lambda: (k @ q.transpose(2,3)).transpose(2,3)):.0f} | pv view {t(lambda: p @ v):.0f} contig {t(lambda: p @ vc):.0f}")
for L in (128, 512, 1024, 2048):
  for Q in (1, 4, 12):
    buf = torch.randn(1, 3, 4096, 64, dtype=dt)
    k = buf[:, :, :L]
    vbuf = torch.randn(1, 3, 4096, 64, dtype=dt)
    v = vbuf[:, :, :L]
    q = torch.randn(1, 3, 3*Q, 64, dtype=dt)
    def bmm():
        s = q @ k.transpose(2, 3)
        return s @ v
    def loop_out():
        s = torch.empty(3, 3*Q, L, dtype=dt)
        o = torch.empty(3, 3*Q, 64, dtype=dt)
        for h in range(3):
            torch.mm(q[0, h], k[0, h].T, out=s[h])
        for h in range(3):
            torch.mm(s[h], v[0, h], out=o[h])
        return o
    print(L, Q, f"QK+PV bmm(copy) {t(bmm):.0f}us  per-head mm {t(loop_out):.0f}")
