"""The floor's try budget (`specdec.engine.floor.TRY_SHARE`) on held-out turns: each method under the current
share and a smaller one, in one process, arms in ABBA order, each arm on a fresh `Floor` (what a method learned
carries from turn to turn within the arm, as in a server or a benchmark). Spec-Bench questions 11-20 of each
category (60 first turns: never the reported first 10), 128 new tokens, greedy; every engine on each prompt in
turn. Per arm and method: decode tokens/s and x `plain` in the same arm, overall and by category.

    .venv/bin/python benchmarks/results/2026-11-step-in-cpp/try_share.py 0.02 0.005
"""
import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_turns  # Spec-Bench questions 11-20 of each category

from specdec.engine import floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method

shares = [float(x) for x in sys.argv[1:3]]
methods = os.environ.get("METHODS", "plain,hydra,pld,logitspec").split(",")
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
turns = held_out_turns(loaded, 20)
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for share in [shares[0], shares[1], shares[1], shares[0]]:
    floor.TRY_SHARE = share
    engine.floor = floor.Floor()
    rates: dict = collections.defaultdict(lambda: [0, 0.0])
    for category, prompt in turns:
        for method in methods:
            out = engine.generate(prompt, parse_method(method).build(loaded), config)
            for key in (method, (method, category)):
                rates[key][0] += out.stats.num_new_tokens
                rates[key][1] += out.stats.wall_time_s - out.stats.prefill_s
    base = rates["plain"][0] / rates["plain"][1]
    line = []
    for method in methods:
        rate = rates[method][0] / rates[method][1]
        cats = " ".join(f"{c[:5]} {rates[(method, c)][0] / rates[(method, c)][1] / (rates[('plain', c)][0] / rates[('plain', c)][1]):.3f}"
                        for c in dict.fromkeys(c for c, _ in turns))
        line.append(f"  {method}: {rate:.1f} tok/s, {rate / base:.3f}x plain ({cats})")
    print(f"TRY_SHARE {share}:\n" + "\n".join(line), flush=True)
