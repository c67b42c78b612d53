"""The node price on and off (FloorState.node_price -> None), arms in ABBA order in one process, fresh floor an
arm, held-out turns (Spec-Bench questions 11-20); x plain, drafting steps' share, nodes and tokens a drafting step."""

import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_turns

from specdec.engine.floor import Floor, FloorState
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method

method = sys.argv[1] if len(sys.argv) > 1 else "logitspec"
order = os.environ.get("ORDER", "off,on,on,off").split(",")
priced = FloorState.node_price
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
turns = held_out_turns(loaded, 20)
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for arm in order:
    FloorState.node_price = priced if arm == "on" else (lambda self: None)
    engine.floor = Floor()
    rates = collections.defaultdict(lambda: [0, 0.0])
    st = collections.Counter()
    cats = collections.defaultdict(lambda: [0, 0.0])
    for i, (cat, prompt) in enumerate(turns):
        texts = {}
        for m in ["plain", method] if i % 2 else [method, "plain"]:
            out = engine.generate(prompt, parse_method(m).build(loaded), config)
            texts[m] = out.token_ids
            dt = out.stats.wall_time_s - out.stats.prefill_s
            rates[m][0] += out.stats.num_new_tokens
            rates[m][1] += dt
            cats[m, cat][0] += out.stats.num_new_tokens
            cats[m, cat][1] += dt
            if m == method:
                for s in out.stats.steps:
                    st["steps"] += 1
                    if s.tree_size > 1:
                        st["d"] += 1
                        st["nodes"] += s.tree_size
                        st["tok"] += s.num_accepted + 1
        assert texts[method] == texts["plain"]
    base = rates["plain"][0] / rates["plain"][1]
    r = rates[method][0] / rates[method][1]
    d = max(st["d"], 1)
    bycat = " ".join(
        f"{c[:5]} {cats[method, c][0] / cats[method, c][1] / (cats['plain', c][0] / cats['plain', c][1]):.2f}"
        for c in sorted({c for c, _ in turns})
    )
    print(
        f"{arm}: plain {base:.1f}, {method} {r / base:.3f}x; drafting steps {st['d'] / st['steps']:.2f}, nodes {st['nodes'] / d:.2f}, tokens {st['tok'] / d:.2f} | {bycat}",
        flush=True,
    )
