"""Decode tokens/s, ms a step and tokens a step of methods on held-out Spec-Bench first turns, 128 new tokens,
greedy, after one warm-up generation; one JSON line. SRC picks the source tree (before / after a change), so
`run.sh` alternates processes. Usage: ab.py MODEL METHODS FIRST LAST [CATEGORIES] (questions FIRST..LAST of
each category, 1-based; the first 10 are the reported ones, so A/B runs take 11 onwards). `h`: a digest of
every generated token, equal across trees when the texts are."""
import collections
import hashlib
import json
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

model = sys.argv[1]
methods = sys.argv[2].split(",")
lo, hi = int(sys.argv[3]), int(sys.argv[4])
cats = sys.argv[5].split(",") if len(sys.argv) > 5 else None
loaded = load_model(model)
engine = Engine(loaded)
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if lo <= seen[q.category] <= hi and (cats is None or q.category in cats):
        held.append(q)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
engine.generate(prompts[0], parse_method(methods[0]).build(loaded), GenerationConfig(max_new_tokens=16))
res = {}
for m in methods:
    toks = 0
    dec = 0.0
    steps = 0
    h = hashlib.sha1()
    for p in prompts:
        out = engine.generate(p, parse_method(m).build(loaded), GenerationConfig(max_new_tokens=128))
        st = out.stats
        toks += st.num_new_tokens
        dec += st.wall_time_s - st.prefill_s
        steps += st.num_decode_steps
        h.update(str(out.token_ids).encode())
    res[m] = dict(tps=round(toks / dec, 1), ms_step=round(1e3 * dec / steps, 3), tok_step=round(toks / steps, 3), h=h.hexdigest()[:8])
print(json.dumps(res), flush=True)
