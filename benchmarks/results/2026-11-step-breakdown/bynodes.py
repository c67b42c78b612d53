"""LogitSpec's steps on SmolLM2 held-out turns by tree size: the pass (verify_trees), accept, commit; then the
cost curve's probes in the same process (minimum and median) at the decoding's mean context."""
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import probe_times

from specdec.backends.torch import rows as R
from specdec.data import load_questions
from specdec.engine import verify as V
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

method = sys.argv[1] if len(sys.argv) > 1 else "logitspec"
loaded = load_model("smollm2-135m")
engine = Engine(loaded)
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if 11 <= seen[q.category] <= 12:
        held.append(q)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
cur = {}
rec = collections.defaultdict(lambda: collections.defaultdict(list))
ctxs = []
def timed(name, f):
    def g(self_or_tree, *a, **k):
        t = time.perf_counter()
        r = f(self_or_tree, *a, **k)
        rec[name][cur.get("n", 0)].append(time.perf_counter() - t)
        return r
    return g
orig_vt = R.BatchedTarget.verify_trees
def vt(self, trees):
    cur["n"] = trees[0].num_nodes
    ctxs.append(self.lengths[0])
    t = time.perf_counter()
    r = orig_vt(self, trees)
    rec["pass"][cur["n"]].append(time.perf_counter() - t)
    return r
R.BatchedTarget.verify_trees = vt
V.accept = timed("accept", V.accept)
R.BatchedTarget.commit = timed("commit", R.BatchedTarget.commit)
engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
for p in prompts:
    engine.generate(p, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
ctx = int(statistics.mean(ctxs))
print(f"{method}: mean context {ctx}, {len(ctxs)} steps")
for name in ("pass", "accept", "commit"):
    print(name, " ".join(f"{n}:{len(v)}x{1e3*statistics.median(v):.2f}" for n, v in sorted(rec[name].items()) if len(v) >= 5))
sizes = [1, 2, 3, 4, 6, 8, 12, 16]
for c in (384, ctx):  # the same probes as the cost curve, 16 repeats; report min and median
    s = probe_times(loaded, c, sizes)
    print(f"probes at context {c}: " + " ".join(f"{n}:{1e3*min(v):.2f}/{1e3*statistics.median(v[2:]):.2f}" for n, v in s.items()))
