"""SmolLM2 one-node exact int4 passes at 512 tokens of context in a loop, for `perf record -g -p PID` (profile.txt)."""
import sys
import time

import torch

sys.path.insert(0, "src")
sys.path.insert(0, "benchmarks")
from step_cost import time_pass, tree_of

from specdec.backends.registry import verifier
from specdec.models import load_model

loaded = load_model("smollm2-135m", dtype="bf16")
target = verifier(loaded)
target.prefill(torch.randint(0, 49000, (512,), generator=torch.Generator().manual_seed(1)))
tree = tree_of(1)
time_pass(target, tree, 50)
print("go", flush=True)
t = time.time()
while time.time() - t < 12:
    time_pass(target, tree, 20)
