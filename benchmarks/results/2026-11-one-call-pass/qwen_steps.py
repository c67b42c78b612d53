"""The engine's own verification steps by tree size: Qwen2.5-Coder-1.5B (or MODEL) on held-out questions 11-13 of
CATEGORY, `plain` then `logitspec`, 128 new tokens, greedy; per tree size the steps, the median verification
time and the mean accepted drafts. Usage: qwen_steps.py MODEL CATEGORY. SRC picks the source tree."""
import collections
import os
import statistics
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

model = sys.argv[1]
cat = sys.argv[2]
loaded = load_model(model)
engine = Engine(loaded)
qs = [q for q in load_questions() if q.category == cat][10:13]
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in qs]
engine.generate(prompts[0], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
by = collections.defaultdict(list)
acc = collections.defaultdict(list)
draft = []
for m in ("plain", "logitspec"):
    for p in prompts:
        out = engine.generate(p, parse_method(m).build(loaded), GenerationConfig(max_new_tokens=128))
        for st in out.stats.steps:
            by[(m, st.tree_size)].append(st.verify_s)
            acc[(m, st.tree_size)].append(st.num_accepted)
            if m == "logitspec":
                draft.append(st.draft_s)
for k in sorted(by):
    v = by[k]
    print(f"{k[0]:10s} nodes {k[1]:3d}: steps {len(v):4d} verify median {1e3*statistics.median(v):6.2f} ms, accepted mean {statistics.mean(acc[k]):.2f}")
print(f"draft median {1e3*statistics.median(draft):.2f} ms")
