"""`logitspec` against `plain` over the same held-out turns several times in one process: whether what LogitSpec
carries from request to request (acceptance rates shared across requests, the recycled successor table) helps or
hurts as it accumulates. Spec-Bench questions 11-20 of each category (60 first turns, never the reported first 10),
128 new tokens, greedy, the engine's floor on (one `Floor` for the process), each prompt by both methods in turn.

    .venv/bin/python benchmarks/results/2026-11-step-in-cpp/logitspec_passes.py [METHOD] [PASSES]
"""
import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_turns  # Spec-Bench questions 11-20 of each category

from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method

method = sys.argv[1] if len(sys.argv) > 1 else "logitspec"
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 3
loaded = load_model("smollm2-135m")
engine = Engine(loaded, floor=Floor())
turns = [prompt for _, prompt in held_out_turns(loaded, 20)]
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for number in range(1, passes + 1):
    rates: dict = collections.defaultdict(lambda: [0, 0.0, 0])
    for prompt in turns:
        for name in ("plain", method):
            out = engine.generate(prompt, parse_method(name).build(loaded), config)
            rates[name][0] += out.stats.num_new_tokens
            rates[name][1] += out.stats.wall_time_s - out.stats.prefill_s
            rates[name][2] += out.stats.num_decode_steps
    plain, mine = (rates[name][0] / rates[name][1] for name in ("plain", method))
    print(f"pass {number}: plain {plain:.1f} tok/s, {method} {mine:.1f} ({mine / plain:.3f}x), "
          f"{rates[method][0] / rates[method][2]:.2f} tokens a step", flush=True)
