"""Does LogitSpec keep prompt lookup's chain (its floor)? Per step of a greedy run: whether the floor
was held, declined or absent, and how many tokens the chain alone would have accepted against what
the tree accepted.

    .venv/bin/python benchmarks/logitspec_floor.py QUESTIONS.jsonl summarization,rag,math_reasoning [METHOD]

METHOD defaults to `logitspec:floor=true` (the floor is an option, off by default).

Reads the proposer's last-step record (`_last.floor_chain`, `floor_held`): a diagnostic tied to
LogitSpec's internals, to be updated with them.
"""
import collections
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from specdec.bench.config import parse_method_spec
from specdec.engine.loop import Engine, GenerationConfig
from specdec.models.loading import load_model
from specdec.prompts import encode_prompt

loaded = load_model(dtype="bf16")
engine = Engine(loaded)
qs = [json.loads(line) for line in open(sys.argv[1])]
cats = sys.argv[2].split(",")
method = sys.argv[3] if len(sys.argv) > 3 else "logitspec:floor=true"  # the floor it reads is an option
p = parse_method_spec(method).config.build(dataclasses.replace(loaded, state_scope="x"))
log = []


class Logged:
    """The proposer, with each step's floor chain recorded (a wrapper: the proposer is left as built)."""

    def __init__(self, inner):
        self.inner = inner

    def begin(self, ids):
        self.inner.begin(ids)

    def propose(self, ctx):
        tree = self.inner.propose(ctx)
        last = self.inner._last
        log.append((len(ctx.token_ids), list(last.floor_chain) if last else [], self.inner.floor_held, tree.num_nodes))
        return tree

    def observe(self, result):
        self.inner.observe(result)

    def __getattr__(self, name):  # anything else the engine asks of a proposer
        return getattr(self.inner, name)


p = Logged(p)
engine.generate(encode_prompt(loaded.tokenizer, "Name three colours.", chat=True), p, GenerationConfig(max_new_tokens=16))
agg = collections.Counter()
for q in qs:
    if q["category"] not in cats:
        continue
    ids = encode_prompt(loaded.tokenizer, q["turns"][0], chat=True)
    log.clear()
    out = engine.generate(ids, p, GenerationConfig(max_new_tokens=128))
    full = ids + out.token_ids
    steps = out.stats.steps
    for (pos, chain, held, _n), st in zip(log, steps, strict=False):
        nxt = full[pos:]
        a_p = 0
        while a_p < len(chain) and a_p < len(nxt) and chain[a_p] == nxt[a_p]:
            a_p += 1
        a_l = st.num_accepted
        key = {True: "held", False: "declined", None: "none"}[held]
        agg[key + "_steps"] += 1
        agg[key + "_pld_acc"] += a_p
        agg[key + "_ls_acc"] += a_l
        if a_p > a_l:
            agg[key + "_lost"] += a_p - a_l
        if a_l > a_p:
            agg[key + "_gained"] += a_l - a_p
    agg["steps"] += len(steps)
    agg["tokens"] += out.stats.num_new_tokens
for k in sorted(agg):
    print(k, agg[k])
