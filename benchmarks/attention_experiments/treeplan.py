"""Per (context, size): the best attention implementation (sdpa, eager, grouped.py's "gqa") for chains
and for trees (a star below the root), best of 6 passes each."""
import sys
from pathlib import Path

# This checkout's specdec, not the installed one (as benchmarks/step_cost.py does).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import time

import grouped  # noqa: F401  (registers "gqa")
import torch

from specdec.backends.torch.packed import verify_model
from specdec.backends.torch.target import TargetModel
from specdec.models.loading import load_model

IMPLEMENTATIONS = ("sdpa", "eager", "gqa")
loaded = load_model(dtype="bf16")
model = verify_model(loaded)
target = TargetModel(model)
V = model.config.vocab_size
g = torch.Generator().manual_seed(0)
for ctx in (128, 512, 1024, 2048):
    target.prefill(torch.randint(0, V, (ctx,), generator=g))
    for size in (4, 8, 16, 32):
        out = []
        for shape in ("chain", "star"):
            parents = torch.arange(-1, size - 1) if shape == "chain" else torch.tensor([-1] + [0] * (size - 1))
            tokens = torch.arange(size)
            best = {i: 1e9 for i in IMPLEMENTATIONS}
            for a in range(7):
                for impl in IMPLEMENTATIONS:
                    model.set_attn_implementation(impl)
                    s = time.perf_counter()
                    target.forward_tree(tokens, parents)
                    e = time.perf_counter() - s
                    target.trim(ctx)
                    if a:
                        best[impl] = min(best[impl], e)
            out.append(shape + " " + " ".join(f"{k} {1e3*v:.1f}" for k, v in best.items()))
        print(ctx, size, " | ".join(out), flush=True)
model.set_attn_implementation("sdpa")
