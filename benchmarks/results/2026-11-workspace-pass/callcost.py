"""Python's cost of a decoder_pass call with 30 layers' weights as a list of 450 tensors (the tree before: run with
PYTHONPATH at its worktree) or as one Layers object (NEW=1, this tree): the call is refused at its first check
(29 write tensors for 30 layers), so what is timed is the argument passing, plus the error both pay.
Measured (2026-11-27, Zen 4): old 81.8 us, new 60.2 us a call."""
import os
import time

import torch

from specdec.kernels import q4_kernel

q4_kernel.load_extension()
ts=[torch.zeros(1) for _ in range(450)]
caches=[torch.zeros(1) for _ in range(30)]
op=torch.ops.specdec_layer.decoder_pass
h=torch.zeros(1,1,8,dtype=torch.bfloat16)
new = os.environ.get("NEW") == "1"
if new:
    stack = torch.classes.specdec_layer.Layers(ts, [15]*30, [1]*30)
def call():
    try:
        if new:
            op(h, stack, h, h, caches, caches, caches[:29], h, h, h, 1, 1, 1.0, 1.0, h, 1.0)
        else:
            op(h, ts, [15]*30, [1]*30, h, h, caches, caches, caches[:29], h, h, h, 1, 1, 1.0, 1.0, h, 1.0)
    except RuntimeError:
        pass
call()
t=time.perf_counter()
for _ in range(3000):
    call()
print("new" if new else "old", (time.perf_counter()-t)/3000*1e6, 'us')
