"""How well LogitSpec's node probabilities predict acceptance: MODEL's `logitspec` on held-out Spec-Bench first
turns (questions FIRST..LAST of each of CATEGORIES, 1-based; the first 10 are the reported ones), 128 new tokens,
greedy. Per verified node: its estimated chance of acceptance (the planner's), its source and depth, and whether
the target accepted it; printed by probability bucket and by depth, and per step the expected against the
accepted drafts. OPTIONS: logitspec's options (e.g. "budget=4"). Usage: calibration.py MODEL FIRST LAST
[CATEGORIES] [OPTIONS]. SRC picks the source tree."""
import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

model, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cats = sys.argv[4].split(",") if len(sys.argv) > 4 and sys.argv[4] else None
method = "logitspec" + (":" + sys.argv[5] if len(sys.argv) > 5 else "")
loaded = load_model(model)
engine = Engine(loaded)
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if lo <= seen[q.category] <= hi and (cats is None or q.category in cats):
        held.append(q)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
engine.generate(prompts[0], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=8))
rows, steps = [], []  # (source, depth, prob, accepted); (nodes, expected, accepted)


def watched(proposer):
    propose, observe = proposer.propose, proposer.observe
    pending = {}

    def propose_(ctx):
        tree = propose(ctx)
        pool = proposer.last_pool
        pending.clear()
        if pool is not None:
            ids, parents, tokens = [0], tree.parents.tolist(), tree.token_list
            for i in range(1, len(tokens)):
                ids.append(pool.child(ids[parents[i]], tokens[i]))
            pending["nodes"] = [(pool.sources[n], pool.depths[n], pool.probs[n]) for n in ids[1:]]
        return tree

    def observe_(result):
        nodes = pending.pop("nodes", None)
        if nodes is not None:
            path = set(result.path[1:])
            for i, (source, depth, prob) in enumerate(nodes, start=1):
                rows.append((source, depth, prob, i in path))
            steps.append((len(nodes) + 1, sum(p for _, _, p in nodes), len(result.path) - 1))
        observe(result)

    proposer.propose, proposer.observe = propose_, observe_
    return proposer


proposer = None
toks = dec = 0.0
for p in prompts:
    proposer = watched(parse_method(method).build(loaded))
    out = engine.generate(p, proposer, GenerationConfig(max_new_tokens=128))
    toks += out.stats.num_new_tokens
    dec += out.stats.wall_time_s - out.stats.prefill_s
print(f"{model} {method} questions {lo}-{hi} {cats or 'all'}: {len(prompts)} prompts, {toks / dec:.1f} decode tokens/s, "
      f"{len(steps)} steps, {toks / len(steps):.3f} tokens a step")
edges = [0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01]
print("estimated chance      nodes  mean estimate  accepted")
for a, b in zip(edges, edges[1:], strict=False):
    part = [r for r in rows if a <= r[2] < b]
    if part:
        print(f"[{a:.2f}, {min(b, 1):.2f})  {len(part):10d}  {sum(r[2] for r in part) / len(part):13.3f}  "
              f"{sum(r[3] for r in part) / len(part):8.3f}")
print("depth  nodes  mean estimate  accepted")
for depth in sorted({r[1] for r in rows}):
    part = [r for r in rows if r[1] == depth]
    print(f"{depth:5d}  {len(part):5d}  {sum(r[2] for r in part) / len(part):13.3f}  {sum(r[3] for r in part) / len(part):8.3f}")
print("source     nodes  mean estimate  accepted")
for source in sorted({r[0] for r in rows}):
    part = [r for r in rows if r[0] == source]
    print(f"{source:9s}  {len(part):5d}  {sum(r[2] for r in part) / len(part):13.3f}  {sum(r[3] for r in part) / len(part):8.3f}")
print("tree nodes  steps  expected drafts  accepted drafts")
for size in sorted({s[0] for s in steps}):
    part = [s for s in steps if s[0] == size]
    print(f"{size:10d}  {len(part):5d}  {sum(s[1] for s in part) / len(part):15.3f}  {sum(s[2] for s in part) / len(part):15.3f}")
