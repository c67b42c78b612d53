"""Does transformers' repeat_kv (copying the KV cache 3x per layer per step) cost the context-dependent
time? A tree pass per context and tree size with the engine's attention plan, SDPA and grouped.py's
stacked-group attention: best/median ms, and the logits' max difference from the plan's."""
import sys
from pathlib import Path

# This checkout's specdec, not the installed one (as benchmarks/step_cost.py does).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import statistics
import sys
import time

import grouped  # noqa: F401  (registers "gqa")
import torch

from specdec.backends.torch.attention import resolve_plan
from specdec.backends.torch.packed import verify_model
from specdec.backends.torch.target import TargetModel
from specdec.models.loading import load_model

loaded = load_model(dtype="bf16")
model = verify_model(loaded)
plans = {"auto": resolve_plan(loaded, "auto"), "sdpa": None, "gqa": None}
torch.manual_seed(0)
V = loaded.model.config.vocab_size
for ctx in (384, 1024, 2048):
    prompt = torch.randint(0, V, (ctx,))
    for n in (1, 8, 12, 16):
        tokens = torch.randint(0, V, (n,))
        parents = torch.tensor([-1] + [0] * (n - 1))  # a star: not a chain, so the tree mask path
        row = []
        for name, plan in plans.items():
            model.set_attn_implementation("sdpa" if name != "gqa" else "gqa")
            t = TargetModel(model, attention=plan)
            t.prefill(prompt)
            times = []
            for _r in range(25):
                s = time.perf_counter()
                logits = t.forward_tree(tokens, parents)
                times.append(time.perf_counter() - s)
                t.trim(ctx)
            row.append(f"{name} {1e3*min(times):.1f}/{1e3*statistics.median(times[2:]):.1f}")
            if name == "auto":
                ref = logits.float()
            else:
                row.append(f"maxdiff {(logits.float()-ref).abs().max():.3f}")
        print(ctx, n, " | ".join(row), flush=True)
model.set_attn_implementation("sdpa")
