"""Held-out A/B: first turns of Spec-Bench questions FIRST..LAST of each category, each prompt once per arm
(no repeated prompt: shared state such as the recycle table sees each text once), arms interleaved per prompt
with rotating order, a loaded model + engine (floor on, as the API runs) per arm.

    .venv/bin/python docs/results/2026-12-logitspec-planned-floor/ab.py FIRST LAST ARM,ARM,...

An arm is a method string ("+" for "," between its options), then optional tags: "#keep" (one proposer for
every prompt, as the bench runner keeps it; else one a prompt, as the API builds it), "#cut" (the lone row's trees
cut by the batch's plan: `sized_by_costs` false), "#nolookup" (no `lookup_depth` on the floor's plain steps),
"#rootlookup" (the root's own retrieval on the floor's plain steps, before it became the default), "%NAME=VALUE/..."
(`specdec.proposers.plain_lookup`'s constants, e.g. "medusa%MIN_GAIN=0.0", set around that arm's lookups), "&NAME=VALUE/..."
(`specdec.proposers.logitspec.proposer`'s, around LogitSpec's plain steps' lookups), "@nofloor" (an
engine without the floor), "@A" (the floor's try schedule restarted per request).
TEMP=0.7 samples (seed 0).
"""
import collections, sys, os
sys.path.insert(0, "src")
from specdec.data import load_questions
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.sampling import SamplingParams
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

first, last = int(sys.argv[1]), int(sys.argv[2])
arms = ["plain"] + sys.argv[3].split(",")
temp = float(os.environ.get("TEMP", "0"))
models = {a: load_model("smollm2-135m") for a in arms}
from specdec.engine import floor as F
class FloorA(Floor):
    def start(self, proposer, greedy=True):
        st = super().start(proposer, greedy)
        st.since, st.gap = 0, F.EXPLORE[0]
        return st
def mkfloor(a):
    if "@nofloor" in a: return None
    if "@A" in a: return FloorA()
    return Floor()
engines = {a: Engine(models[a], floor=mkfloor(a)) for a in arms}
seen = collections.Counter(); qs = []
for q in load_questions():
    seen[q.category] += 1
    if first <= seen[q.category] <= last:
        qs.append(q)
prompts = [(q.category, encode_prompt(models["plain"].tokenizer, q.turns[0], chat=True)) for q in qs]
kept = {}
def build(a):
    if a in kept:
        return kept[a]
    name, _, tag = a.split("@")[0].partition("#")
    name, _, knobs = name.partition("%")
    name, _, own = name.partition("&")
    prop = parse_method(name.replace("+", ",")).build(models[a])
    if knobs or own:  # "%NAME=VALUE/...": plain_lookup's constants around this arm's lookups only; "&...":
        # logitspec.proposer's around its plain steps' lookups (`_looked_up`)
        from specdec.proposers import plain_lookup as PL
        from specdec.proposers.logitspec import proposer as LSP
        PL, knobs, owner, attr = (PL, knobs, prop.lookup, "propose") if knobs else (LSP, own, prop, "_looked_up")
        values = {k: type(getattr(PL, k))(v) for k, v in (kv.split("=") for kv in knobs.split("/"))}
        inner = getattr(owner, attr)
        def propose(ctx, inner=inner, values=values):
            saved = {k: getattr(PL, k) for k in values}
            for k, v in values.items():
                setattr(PL, k, v)
            try:
                return inner(ctx)
            finally:
                for k, v in saved.items():
                    setattr(PL, k, v)
        setattr(owner, attr, propose)
    import dataclasses as _dc
    attrs = {}
    if "cut" in tag:
        attrs["sized_by_costs"] = False
    if "nolookup" in tag:
        base = prop.__class__
        attrs["propose"] = lambda self, ctx: base.propose(self, _dc.replace(ctx, lookup_depth=0))
    if "rootlookup" in tag:
        from specdec.proposers.logitspec import proposer as LP
        from specdec.proposers.logitspec.retrieval import continue_match
        from specdec.proposers.logitspec.learn import Step, learn_chain, count_sources
        from specdec.proposers.logitspec.plan import best_prefix
        from specdec.proposers.pld import cut_after_eos
        from specdec.tree import DraftTree
        base = prop.__class__
        def _looked_up(self, ctx):
            config, root = self.config, ctx.token_ids[-1]
            chain, m = continue_match(self.index, (), min(config.max_continuation, ctx.lookup_depth))
            chain = cut_after_eos(chain, self.eos_token_ids)[: config.budget - 1]
            if m < LP.STRONG_MATCH or not chain:
                return DraftTree.chain(root)
            costs = self.priced.at(ctx.node_price)
            probs = self._chain(("root", m, self._heat), len(chain))
            kept = chain[: best_prefix(probs, costs, config.budget, config.min_gain)[0]]
            if not kept:
                return DraftTree.chain(root)
            self._last = Step(None, [], 0, self._heat, chains=[(("root", m, self._heat), chain)], sources=["", *["root"] * len(kept)])
            return DraftTree.chain(root, kept)
        def observe(self, result):
            step = self._last
            if step is not None and step.retrieval is None and step.chains:
                self._last = None
                heat, self._heat = self._heat, min(result.num_accepted, LP.MAX_HEAT)
                count_sources(self.source_stats, step.sources, result.path)
                for prefix, chain in step.chains:
                    learn_chain(self.stats, prefix, chain, result.tokens)
                return
            return base.observe(self, result)
        attrs["_looked_up"] = _looked_up
        attrs["observe"] = observe
    if attrs:
        prop.__class__ = type("Var", (prop.__class__,), attrs)
    if "keep" in tag:  # one proposer for every prompt (what it learned carries), as the bench runner keeps it
        kept[a] = prop
    return prop
def cfg(n):
    if temp > 0:
        return GenerationConfig(max_new_tokens=n, sampling=SamplingParams(temperature=temp, seed=0))
    return GenerationConfig(max_new_tokens=n)
for a in arms:
    engines[a].generate(prompts[0][1][:64], build(a), cfg(8))
tot = collections.defaultdict(lambda: [0, 0.0, 0, 0]); cat = collections.defaultdict(lambda: [0, 0.0])
texts = {}
for i, (c, p) in enumerate(prompts):
    order = arms[i % len(arms):] + arms[:i % len(arms)]
    for a in order:
        out = engines[a].generate(p, build(a), cfg(128))
        s = out.stats; t = tot[a]
        t[0] += s.num_new_tokens; t[1] += s.wall_time_s - s.prefill_s; t[2] += s.num_decode_steps; t[3] += sum(st.tree_size == 1 for st in s.steps)
        cat[(a, c)][0] += s.num_new_tokens; cat[(a, c)][1] += s.wall_time_s - s.prefill_s
        texts[(a, i)] = out.token_ids
    if (i + 1) % 12 == 0 or i + 1 == len(prompts):
        base = tot["plain"][0] / tot["plain"][1]
        same = {a: sum(texts[(a, j)] == texts[("plain", j)] for j in range(i + 1)) for a in arms}
        print(f"[{i+1}] plain {base:.1f} tok/s; " + "; ".join(
            f"{a} x{t[0]/t[1]/base:.3f} MAT {t[0]/t[2]:.2f} one-node {t[3]/t[2]:.2f} same {same[a]}" for a in arms[1:] for t in [tot[a]]), flush=True)
cats = sorted({c for c, _ in prompts})
for a in arms[1:]:
    print(a, " ".join(f"{c[:6]} {cat[(a,c)][0]/cat[(a,c)][1]/(cat[('plain',c)][0]/cat[('plain',c)][1]):.2f}" for c in cats))
