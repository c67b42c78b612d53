"""Verification passes by tree size at 128-2048 tokens of context on the default model (min/median ms of 16,
sizes in turn ascending and descending; tree attention alone: attention_paths.py).
SRC: the specdec sources to time (a worktree of another commit); CTX: the contexts."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch

from specdec.engine import costs as C
from specdec.models import load_model

loaded = load_model("smollm2-135m")
sizes = [1, 2, 4, 8, 12, 16]
for c in [int(x) for x in os.environ.get("CTX", "128,512,1024,2048").split(",")]:
    tgt = C.timing_target(loaded)
    vocab = int(tgt.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    tgt.prefill(torch.randint(0, vocab, (c,), generator=g))
    probes = {n: (torch.randint(0, vocab, (n,), generator=g), C._probe_parents(n)) for n in sizes}
    s = {n: [] for n in sizes}
    for rep in range(16):
        for n in (sizes if rep % 2 == 0 else sizes[::-1]):
            t = time.perf_counter()
            tgt.forward_tree(*probes[n])
            s[n].append(time.perf_counter() - t)
            tgt.trim(c)
    if hasattr(tgt, "close"):
        tgt.close()
    print(f"ctx {c}: " + " ".join(f"{n}:{1e3*min(v):.2f}/{1e3*statistics.median(v[2:]):.2f}" for n, v in s.items()), flush=True)
