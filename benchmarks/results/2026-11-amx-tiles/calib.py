"""Is LogitSpec's planner calibrated? Predicted accepted drafts (sum of chosen nodes' probabilities) vs realized, by tree size."""
import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_prompts  # Spec-Bench questions 11-12 of each category

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.proposers import parse_method
from specdec.proposers.logitspec import plan as PL
from specdec.proposers.logitspec import proposer as P

loaded = load_model("smollm2-135m")
engine = Engine(loaded)
prompts = held_out_prompts(loaded, 1000)
pending = []
orig_plan = PL.NodePool.plan
def plan(self, *a, **k):
    chosen = orig_plan(self, *a, **k)
    pending.append(sum(self.probs[i] for i in chosen if i != 0))
    return chosen
PL.NodePool.plan = plan
rec = collections.defaultdict(lambda: [0, 0.0, 0])
orig_obs = P.LogitSpecProposer.observe
def observe(self, result):
    n = result.tree.num_nodes
    if n > 1 and pending:
        r = rec[min(n, 20)]
        r[0] += 1
        r[1] += pending[-1]
        r[2] += result.num_accepted
    pending.clear()
    return orig_obs(self, result)
P.LogitSpecProposer.observe = observe
for p in prompts:
    engine.generate(p, parse_method("logitspec").build(loaded), GenerationConfig(max_new_tokens=128))
tp = ta = 0
for n, (c, pr, ac) in sorted(rec.items()):
    print(f"nodes {n}: {c} steps, predicted {pr/c:.2f}, accepted {ac/c:.2f}")
    tp += pr
    ta += ac
print(f"all: predicted {tp:.0f} accepted {ta} ratio {ta/tp:.2f}")
