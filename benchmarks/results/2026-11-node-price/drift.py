"""The same method over the same held-out turns, arm after arm in one process (fresh floor an arm): does it drift?
Per arm: x plain, tokens a step, drafting steps' share, nodes a drafting step, tokens a drafting step."""

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

method = sys.argv[1]
arms = int(os.environ.get("ARMS", "4"))
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
turns = held_out_turns(loaded, 20)
config = GenerationConfig(max_new_tokens=128)
engine.generate(turns[0][1], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
for arm in range(arms):
    if os.environ.get("KEEP_FLOOR") != "1":
        engine.floor = Floor()
    rates = collections.defaultdict(lambda: [0, 0.0])
    st = collections.Counter()
    for i, (_, prompt) in enumerate(turns):
        texts = {}
        for m in ["plain", method] if i % 2 else [method, "plain"]:
            out = engine.generate(prompt, parse_method(m).build(loaded), config)
            texts[m] = out.token_ids
            rates[m][0] += out.stats.num_new_tokens
            rates[m][1] += out.stats.wall_time_s - out.stats.prefill_s
            if m == method:
                for s in out.stats.steps:
                    st["steps"] += 1
                    if s.tree_size > 1:
                        st["dsteps"] += 1
                        st["nodes"] += s.tree_size
                        st["dacc"] += s.num_accepted + 1
                        st["dtime"] += s.draft_s + s.verify_s
                    else:
                        st["ptime"] += s.draft_s + s.verify_s
        assert texts[method] == texts["plain"]
    base = rates["plain"][0] / rates["plain"][1]
    r = rates[method][0] / rates[method][1]
    d = max(st["dsteps"], 1)
    p = max(st["steps"] - st["dsteps"], 1)
    print(
        f"arm {arm}: plain {base:.1f}, {method} {r / base:.3f}x; drafting steps {st['dsteps'] / st['steps']:.2f}, "
        f"nodes {st['nodes'] / d:.2f}, tokens {st['dacc'] / d:.2f}, ms a drafting step {1e3 * st['dtime'] / d:.2f}, plain step {1e3 * st['ptime'] / p:.2f}",
        flush=True,
    )
