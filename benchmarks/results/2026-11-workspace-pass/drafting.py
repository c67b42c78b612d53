"""A method's decode speed on SmolLM2's held-out turns (questions 11-12 of every category) and its steps' drafting
and verification time. Usage: drafting.py METHOD [MODEL]; PROFILE=1 adds cProfile's top functions (SORT: its order)."""
import collections
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

method = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m"
loaded = load_model(model)
engine = Engine(loaded)
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if 11 <= seen[q.category] <= 12:
        held.append(q)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
def run_all():
    toks = dec = steps = 0
    global dr, ve, nodes
    dr = ve = nodes = 0
    for p in prompts:
        out = engine.generate(p, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
        st = out.stats
        toks += st.num_new_tokens
        dec += st.wall_time_s - st.prefill_s
        steps += st.num_decode_steps
        dr += sum(s.draft_s for s in st.steps)
        ve += sum(s.verify_s for s in st.steps)
        nodes += sum(s.tree_size for s in st.steps)
    return toks, dec, steps
toks, dec, steps = run_all()
print(f"{method}: {toks/dec:.1f} tok/s, {1e3*dec/steps:.3f} ms/step, {toks/steps:.2f} tok/step; draft {1e3*dr/steps:.3f} verify {1e3*ve/steps:.3f} ms/step, {nodes/steps:.2f} nodes", flush=True)
if os.environ.get("PROFILE"):
    pr = cProfile.Profile()
    pr.enable()
    run_all()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats(os.environ.get("SORT","tottime")).print_stats(45)
