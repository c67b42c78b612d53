# ruff: noqa: E402  (the timers wrap functions before the engine is built)
"""Where a decode step's time goes outside C++: each function's exclusive wall time per step.

Held-out turns (Spec-Bench questions 11-12 of each category), 128 new tokens, greedy, the engine's floor on,
each method twice in one process (the second round is the one to read: prompts come from the prompt cache).
`C:layers` is the fused pass's C++ call (`decoder_pass`), `C:head` the head's product; every other entry is a
Python function's time less the timed functions it called. SRC=<checkout>/src runs another checkout.
"""
import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
import torch
import torch._ops
from batch_steps import held_out_prompts

from specdec.kernels.q4_kernel import load_extension

load_extension()
from specdec.backends.torch import batch_cache, fused, rows, target
from specdec.engine import accept, batch, generation, loop
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.kernels import q4_kernel
from specdec.models import load_model
from specdec.proposers import parse_method

spent: collections.Counter = collections.Counter()
inner: list[float] = []


def timed(name, function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        inner.append(0.0)
        try:
            return function(*args, **kwargs)
        finally:
            took, nested = time.perf_counter() - start, inner.pop()
            spent[name] += took - nested
            if inner:
                inner[-1] += took
    return wrapper


torch._ops.TorchBindOpOverload.__call__ = timed("C:layers", torch._ops.TorchBindOpOverload.__call__)
torch.ops.specdec_q4.q8_linear = timed("C:head", torch.ops.specdec_q4.q8_linear)
for owner, names in [
    (batch.Batch, ["step", "_propose", "_advance"]), (rows.BatchedTarget, ["verify_trees", "commit"]),
    (target.TargetModel, ["run"]), (fused.FusedDecoder, ["run"]), (generation.Emitter, ["emit"]),
    (batch_cache.BatchedLayer, ["claim"]), (torch.nn.Embedding, ["forward"]),
]:
    for name in names:
        setattr(owner, name, timed(f"{owner.__name__}.{name}", getattr(owner, name)))
for module, name in [(batch, "verify"), (accept, "accept_greedy"), (q4_kernel, "rows_through")]:
    setattr(module, name, timed(name, getattr(module, name)))
fused.FusedDecoder.angles = timed("FusedDecoder.angles", fused.FusedDecoder.angles)

loaded = load_model("smollm2-135m")
engine = loop.Engine(loaded, floor=Floor())
prompts = held_out_prompts(loaded, 1000)  # Spec-Bench questions 11-12 of each category
for method in (sys.argv[1:] or ["plain", "logitspec"]) * 2:
    engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    spent.clear()
    tokens = steps = 0
    for prompt in prompts:
        out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
        tokens += out.stats.num_new_tokens
        steps += out.stats.num_decode_steps
    outside = sum(v for k, v in spent.items() if not k.startswith("C:"))
    print(f"{method}: {steps} steps, {tokens / steps:.2f} tokens a step, Python {1e3 * outside / steps:.3f} ms a step: "
          + ", ".join(f"{k} {1e3 * v / steps:.3f}" for k, v in sorted(spent.items())), flush=True)
