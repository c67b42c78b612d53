"""Per method, on held-out turns (questions 11-12 per category), the engine's floor on: its drafting and plain
steps, and what the drafting steps cost beyond plain steps for the tokens they emitted (negative: they paid).
Methods run in the order given on one engine, so a method named twice runs the second time on what its floor
learned the first time."""
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_prompts

from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method

loaded = load_model("smollm2-135m")
engine = Engine(loaded, floor=Floor())
prompts = held_out_prompts(loaded, 1000)  # Spec-Bench questions 11-12 of each category
for method in sys.argv[1:]:
    engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    d, p = [0, 0, 0.0], [0, 0, 0.0]
    dec, toks = 0.0, 0
    for pr in prompts:
        out = engine.generate(pr, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
        dec += out.stats.wall_time_s - out.stats.prefill_s
        toks += out.stats.num_new_tokens
        for s in out.stats.steps:
            acc = d if s.tree_size > 1 else p
            acc[0] += 1
            acc[1] += s.num_accepted + 1
            acc[2] += s.draft_s + s.verify_s
    prate = p[1] / p[2]
    extra = d[2] - d[1] / prate
    print(f"{method}: {toks/dec:.1f} tok/s; drafting steps {d[0]} ({d[1]} tokens, {1e3*d[2]/max(d[0],1):.2f} ms each), plain steps {p[0]} ({1e3*p[2]/p[0]:.2f} ms each); drafting cost beyond plain {1e3*extra:.0f} ms = {100*extra/dec:.1f}% of decode", flush=True)
