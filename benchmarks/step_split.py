"""Per-step time split (propose / verify / observe / rest) of methods on the first turns of a question file.

    .venv/bin/python benchmarks/step_split.py QUESTIONS.jsonl summarization,rag pld,logitspec

Where `specdec bench` reports draft and verification time per step, this also times the proposer's
`observe` and the prefill, and counts tree nodes per step. bf16, bundled model, 128 new tokens.
"""
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from specdec.bench.config import parse_method_spec
from specdec.engine.loop import Engine, GenerationConfig
from specdec.models.loading import load_model
from specdec.prompts import encode_prompt

torch.manual_seed(0)
loaded = load_model(dtype="bf16")
engine = Engine(loaded)
qs = [json.loads(line) for line in open(sys.argv[1])]
cats = sys.argv[2].split(",")
methods = sys.argv[3].split(",")
qs = [q for q in qs if q["category"] in cats]
cfg = GenerationConfig(max_new_tokens=128)

class Timed:
    def __init__(self, p): self.p, self.obs = p, 0.0
    def begin(self, ids): self.p.begin(ids)
    def propose(self, ctx): return self.p.propose(ctx)
    def observe(self, r):
        t = time.perf_counter()
        self.p.observe(r)
        self.obs += time.perf_counter() - t
    def __getattr__(self, name): return getattr(self.p, name)

props = {m: Timed(parse_method_spec(m).config.build(dataclasses.replace(loaded, state_scope=m))) for m in methods}
for _m, p in props.items():
    engine.generate(encode_prompt(loaded.tokenizer, "Name three colours.", chat=True), p, GenerationConfig(max_new_tokens=16))
agg = {m: dict(wall=0.0, draft=0.0, verify=0.0, obs=0.0, steps=0, nodes=0, tok=0, prefill=0.0) for m in methods}
for q in qs:
    ids = encode_prompt(loaded.tokenizer, q["turns"][0], chat=True)
    for m in methods:
        p = props[m]
        p.obs = 0.0
        t = time.perf_counter()
        out = engine.generate(ids, p, cfg)
        w = time.perf_counter() - t
        s = out.stats
        a = agg[m]
        a["wall"] += w
        a["draft"] += s.draft_time_s
        a["verify"] += s.verify_time_s
        a["obs"] += p.obs
        a["steps"] += s.num_decode_steps
        a["nodes"] += sum(x.tree_size for x in s.steps)
        a["tok"] += s.num_new_tokens
        a["prefill"] += s.prefill_s
    print(q["category"], len(ids), {m: round(agg[m]["tok"] / agg[m]["wall"], 1) for m in methods}, flush=True)
for m, a in agg.items():
    n = a["steps"]
    rest = a["wall"] - a["draft"] - a["verify"] - a["obs"] - a["prefill"]
    print(f"{m:28s} tok/s {a['tok']/a['wall']:.1f} MAT {(a['tok']-len(qs))/n:.2f} nodes {a['nodes']/n:.1f} "
          f"ms/step: draft {1e3*a['draft']/n:.2f} verify {1e3*a['verify']/n:.2f} observe {1e3*a['obs']/n:.2f} "
          f"rest {1e3*rest/n:.2f} prefill/q {1e3*a['prefill']/len(qs):.0f}")
