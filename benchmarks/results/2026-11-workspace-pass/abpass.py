"""min / median ms of a SmolLM2 exact int4 pass at 512 ctx, 1 and 8 nodes, 300 passes each."""
import statistics
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "benchmarks"))
from step_cost import tree_of

from specdec.backends.registry import verifier
from specdec.models import load_model

loaded = load_model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m", dtype="bf16")
target = verifier(loaded)
target.prefill(torch.randint(0, 49000, (512,), generator=torch.Generator().manual_seed(1)))
out = []
for n in (1, 8):
    tree = tree_of(n)
    past = target.num_cached
    ts = []
    for i in range(330):
        t = time.perf_counter()
        target.forward_tree(tree.tokens, tree.parents)
        target.trim(past)
        if i >= 30:
            ts.append(time.perf_counter() - t)
    out.append(f"{n}: min {1e3*min(ts):.2f} med {1e3*statistics.median(ts):.2f}")
print("  ".join(out))
