"""A method's decode speed on held-out turns and its steps' drafting and verification time.
Usage: drafting.py MODEL METHOD [METHOD...]; turns: Spec-Bench math_reasoning questions 11-14 and the
code prompts in code_prompts.txt (none of them reported). One warm-up generation per method first."""
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

model, methods = sys.argv[1], sys.argv[2:]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
here = os.path.join(ROOT, "docs/results/2026-11-fused-draft")  # code_prompts.txt, beside the results
texts = [q.turns[0] for q in load_questions(categories=["math_reasoning"], per_category=14)[10:]]
texts += [t.strip() for t in open(os.path.join(here, "code_prompts.txt")).read().split("\n\n") if t.strip()]
loaded = load_model(model)
engine = Engine(loaded)
first = {}  # prompt -> the first method's tokens, which every other method's must equal
prompts = [encode_prompt(loaded.tokenizer, t, chat=True) for t in texts]
new = int(os.environ.get("NEW", 128))
for method in methods:
    built = parse_method(method).build(loaded)
    engine.generate(prompts[0], built, GenerationConfig(max_new_tokens=16))
    toks = dec = steps = dr = ve = nodes = same = 0
    for i, p in enumerate(prompts):
        out = engine.generate(p, parse_method(method).build(loaded) if os.environ.get("REBUILD") else built,
                              GenerationConfig(max_new_tokens=new))
        first.setdefault(i, out.token_ids)
        same += first[i] == out.token_ids
        st = out.stats
        toks += st.num_new_tokens
        dec += st.wall_time_s - st.prefill_s
        steps += st.num_decode_steps
        dr += sum(s.draft_s for s in st.steps)
        ve += sum(s.verify_s for s in st.steps)
        nodes += sum(s.tree_size for s in st.steps)
    print(f"{method}: {toks/dec:.1f} tok/s, {1e3*dec/steps:.2f} ms/step, {toks/steps:.2f} tok/step; draft {1e3*dr/steps:.2f}"
          f" verify {1e3*ve/steps:.2f} ms/step, {nodes/steps:.2f} nodes, same tokens as the first method {same}/{len(prompts)}", flush=True)
