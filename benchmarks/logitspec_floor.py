"""Where logitspec accepts fewer tokens than pld's chain would have at the same step (same greedy text)."""
import json, sys, dataclasses, collections
from specdec.models.loading import load_model
from specdec.engine import Engine, GenerationConfig
from specdec.bench.config import parse_method_spec
from specdec.prompts import encode_prompt
loaded = load_model(dtype="bf16"); engine = Engine(loaded)
qs = [json.loads(l) for l in open(sys.argv[1])]
cats = sys.argv[2].split(",")
method = sys.argv[3] if len(sys.argv) > 3 else "logitspec"
p = parse_method_spec(method).config.build(dataclasses.replace(loaded, state_scope="x"))
log = []
orig = p.propose
def propose(ctx):
    tree = orig(ctx)
    log.append((len(ctx.token_ids), list(p._last.floor_chain) if p._last else [], p.floor_held, tree.num_nodes))
    return tree
p.propose = propose
engine.generate(encode_prompt(loaded.tokenizer, "Name three colours.", chat=True), p, GenerationConfig(max_new_tokens=16))
agg = collections.Counter()
for q in qs:
    if q["category"] not in cats: continue
    ids = encode_prompt(loaded.tokenizer, q["turns"][0], chat=True)
    log.clear()
    out = engine.generate(ids, p, GenerationConfig(max_new_tokens=128))
    full = ids + out.token_ids
    steps = out.stats.steps
    for (pos, chain, held, n), st in zip(log, steps):
        nxt = full[pos:]
        a_p = 0
        while a_p < len(chain) and a_p < len(nxt) and chain[a_p] == nxt[a_p]: a_p += 1
        a_l = st.num_accepted
        key = {True: "held", False: "declined", None: "none"}[held]
        agg[key + "_steps"] += 1
        agg[key + "_pld_acc"] += a_p; agg[key + "_ls_acc"] += a_l
        if a_p > a_l: agg[key + "_lost"] += a_p - a_l
        if a_l > a_p: agg[key + "_gained"] += a_l - a_p
    agg["steps"] += len(steps); agg["tokens"] += out.stats.num_new_tokens
for k in sorted(agg): print(k, agg[k])
