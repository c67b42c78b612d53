# ruff: noqa: E402  (the extension loads before the modules that use it)
"""What `decoder_pass`'s Python overload spent before it dispatched: its search of every argument for fake script
objects (`torch._ops._must_dispatch_in_python`; the op takes a torchbind class), on arguments shaped as a pass's
(the layers' object, three lists of 30 cache tensors, ten more), alone and right after a real decode (caches as the
loop leaves them). The fused pass now calls `Layers.run`, which does not search.

    .venv/bin/python benchmarks/results/2026-11-node-price/dispatch_search.py
"""

import statistics
import sys
import time

import torch
import torch._ops

sys.path.insert(0, "src")
from specdec.kernels.q4_kernel import load_extension

load_extension()
from specdec.engine import loop
from specdec.engine.generation import GenerationConfig
from specdec.models import load_model
from specdec.proposers import parse_method

loaded = load_model("smollm2-135m")
layers = torch.classes.specdec_layer.Layers([], [], [])
caches = [[torch.zeros(1) for _ in range(30)] for _ in range(3)]
args = (
    torch.zeros(1),
    layers,
    torch.zeros(1),
    torch.zeros(1),
    *caches,
    *(torch.zeros(1) for _ in range(3)),
    9,
    3,
    1e-5,
    0.125,
    torch.zeros(1),
    1e-5,
)
alone = []
for _ in range(3):
    start = time.perf_counter()
    for _ in range(10000):
        torch._ops._must_dispatch_in_python(args, {})
    alone.append((time.perf_counter() - start) / 10000)
engine = loop.Engine(loaded)
prompt = loaded.tokenizer("Tell me about the sea, and the ships on it, in a few lines.")["input_ids"]
after = []
for _ in range(100):
    engine.generate(prompt, parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=2))
    start = time.perf_counter()
    torch._ops._must_dispatch_in_python(args, {})
    after.append(time.perf_counter() - start)
print(
    f"the search: alone {1e6 * min(alone):.1f} us, right after a decode median {1e6 * statistics.median(after):.1f} us"
)
