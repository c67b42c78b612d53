"""Medusa's and Hydra's plain steps with and without the target's state captured: the heads' `features_optional`
off (every pass captures, as before) and on (the floor's plain steps capture nothing unless a try comes next),
in one process, arms in ABBA order, each on a fresh `Floor`; `plain` in every arm for the ratio. Spec-Bench
questions 11-20 of each category (60 first turns, never the reported first 10), 128 new tokens, greedy, every
engine on each prompt in turn; the texts are checked equal to plain's.

    .venv/bin/python benchmarks/results/2026-11-step-in-cpp/head_capture.py
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
from specdec.proposers.medusa.proposer import MedusaProposer

methods = ["plain", "medusa", "hydra"]
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
turns = [prompt for _, prompt in held_out_turns(loaded, 20)]
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for optional in (False, True, True, False):
    MedusaProposer.features_optional = optional  # Hydra's proposer inherits it
    engine.floor = Floor()
    rates: dict = collections.defaultdict(lambda: [0, 0.0])
    for prompt in turns:
        texts = {}
        for method in methods:
            out = engine.generate(prompt, parse_method(method).build(loaded), config)
            texts[method] = out.token_ids
            rates[method][0] += out.stats.num_new_tokens
            rates[method][1] += out.stats.wall_time_s - out.stats.prefill_s
        assert texts["medusa"] == texts["hydra"] == texts["plain"]
    base = rates["plain"][0] / rates["plain"][1]
    print(f"features_optional={optional}: " + ", ".join(
        f"{m} {rates[m][0] / rates[m][1]:.1f} tok/s ({rates[m][0] / rates[m][1] / base:.3f}x)" for m in methods), flush=True)
