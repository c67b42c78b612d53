"""Prefill rates of the default model at 64-1024 prompt tokens (best of 3, a fresh throwaway target each).
SRC: the specdec sources to time."""
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch

from specdec.engine import costs as C
from specdec.models import load_model

loaded = load_model("smollm2-135m")
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 49152, (1024,), generator=g)
for n in (64, 128, 256, 512, 1024):
    ts = []
    for _ in range(3):
        tgt = C.timing_target(loaded)
        t = time.perf_counter()
        tgt.prefill(ids[:n])
        ts.append(time.perf_counter() - t)
        if hasattr(tgt, "close"):
            tgt.close()
    print(f"prefill {n}: {1e3*min(ts):.1f} ms, {n/min(ts):.0f} tok/s", flush=True)
