# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""Where a decode step's time goes, by tree size: the pass (single.run), acceptance, commit, proposing,
the rest. SmolLM2 held-out turns (questions 11-12 of each category), 128 new tokens, greedy."""
import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.backends.torch import rows as R
from specdec.data import load_questions
from specdec.engine import verify as V
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

methods = sys.argv[1:] or ["plain", "logitspec"]
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if 11 <= seen[q.category] <= 12:
        held.append(q)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
acc = collections.defaultdict(float)
def timed(name, f):
    def g(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[name] += time.perf_counter() - t
        return r
    return g
V.accept = timed("accept", V.accept)
R.BatchedTarget.commit = timed("commit", R.BatchedTarget.commit)
R.BatchedTarget.verify_trees = timed("verify_trees", R.BatchedTarget.verify_trees)
from specdec.backends.torch import target as T  # noqa: E402  (after the patches above)

T.TargetModel.run = timed("run", T.TargetModel.run)
for method in methods * 2:
    engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    acc.clear()
    by = collections.defaultdict(lambda: [0, 0.0])
    toks = dec = steps = dr = 0
    for p in prompts:
        out = engine.generate(p, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
        st = out.stats
        toks += st.num_new_tokens
        dec += st.wall_time_s - st.prefill_s
        steps += st.num_decode_steps
        dr += sum(s.draft_s for s in st.steps)
        for s in st.steps:
            by[s.tree_size][0] += 1
            by[s.tree_size][1] += s.verify_s
    def ms(x):
        return f"{1e3*x/steps:.3f}"
    print(f"{method}: {toks/dec:.1f} tok/s, {1e3*dec/steps:.3f} ms/step, {toks/steps:.2f} tok/step; draft {ms(dr)}; "
          + " ".join(f"{k} {ms(v)}" for k, v in acc.items()), flush=True)
    print("   verify by nodes: " + ", ".join(f"{n}:{c}x{1e3*t/c:.2f}" for n, (c, t) in sorted(by.items())), flush=True)
