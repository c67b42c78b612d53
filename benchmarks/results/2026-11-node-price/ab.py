"""Methods side by side in one process on held-out turns (Spec-Bench questions 11-20), each prompt's engines in
rotating order, fresh floor a round; decode tokens/s and x plain a round; texts checked equal to plain's."""

import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_turns

from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method

methods = ["plain", *sys.argv[1:]]
rounds = int(os.environ.get("ROUNDS", "2"))
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
turns = held_out_turns(loaded, int(os.environ.get("LAST", "20")))
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for rnd in range(rounds):
    engine.floor = Floor()
    rates = collections.defaultdict(lambda: [0, 0.0])
    cats = collections.defaultdict(lambda: [0, 0.0])
    for i, (cat, prompt) in enumerate(turns):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        texts = {}
        for method in order:
            out = engine.generate(prompt, parse_method(method).build(loaded), config)
            texts[method] = out.token_ids
            rates[method][0] += out.stats.num_new_tokens
            rates[method][1] += out.stats.wall_time_s - out.stats.prefill_s
            cats[method, cat][0] += out.stats.num_new_tokens
            cats[method, cat][1] += out.stats.wall_time_s - out.stats.prefill_s
        assert all(t == texts["plain"] for t in texts.values()), (cat, i)
    base = rates["plain"][0] / rates["plain"][1]
    print(
        f"round {rnd}: "
        + ", ".join(
            f"{m} {rates[m][0] / rates[m][1]:.1f} ({rates[m][0] / rates[m][1] / base:.3f}x)" for m in methods
        ),
        flush=True,
    )
    for m in methods[1:]:
        print(
            "   ",
            m,
            " ".join(
                f"{c[:5]} {cats[m, c][0] / cats[m, c][1] / (cats['plain', c][0] / cats['plain', c][1]):.2f}"
                for c in sorted({c for c, _ in turns})
            ),
            flush=True,
        )
