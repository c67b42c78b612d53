"""Verification passes by tree size at 128-2048 tokens of context on the default model (min/median ms of 16,
sizes in turn ascending and descending; tree attention alone: attention_paths.py).
SRC: the specdec sources to time (a worktree of another commit); CTX: the contexts."""
import os
import statistics
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import probe_times

from specdec.models import load_model

loaded = load_model("smollm2-135m")
sizes = [1, 2, 4, 8, 12, 16]
for c in [int(x) for x in os.environ.get("CTX", "128,512,1024,2048").split(",")]:
    s = probe_times(loaded, c, sizes)
    print(f"ctx {c}: " + " ".join(f"{n}:{1e3*min(v):.2f}/{1e3*statistics.median(v[2:]):.2f}" for n, v in s.items()), flush=True)
