"""How much does LogitSpec's speed depend on the cost curve it sizes trees by? SmolLM2, held-out mt_bench,
summarization and qa turns (questions 11-14), 128 new tokens, greedy, rates per request (shared_rates=false, so
no run learns from another): plain; logitspec on the cached curve; logitspec on the cached curve with every
extra node's cost raised by STEEP (default 1.25, about the spread between curves measured minutes apart).
Rounds in ABBA order."""
import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions
from specdec.engine import costs as C
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

loaded = load_model("smollm2-135m")
engine = Engine(loaded)
seen = collections.Counter()
held = []
for q in load_questions():
    seen[q.category] += 1
    if q.category in ("mt_bench", "summarization", "qa") and 11 <= seen[q.category] <= 14:
        held.append(q)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
config = parse_method("logitspec:shared_rates=false")
cached = C.load_or_measure(loaded)
steep_by = float(os.environ.get("STEEP", "1.25"))
one = cached.seconds[0]
steep = C.CostModel(cached.sizes, tuple(one + steep_by * (s - one) for s in cached.seconds))
makers = {"plain": lambda: parse_method("plain").build(loaded),
          "cached": lambda: config.assemble(loaded, cached, None),
          "steep": lambda: config.assemble(loaded, steep, None)}
engine.generate(prompts[0], makers["plain"](), GenerationConfig(max_new_tokens=16))
totals = collections.defaultdict(lambda: [0, 0.0])
for rnd in range(int(os.environ.get("ROUNDS", "6"))):
    order = ["plain", "cached", "steep"] if rnd % 2 == 0 else ["steep", "cached", "plain"]
    for name in order:
        toks = dec = steps = 0
        for p in prompts:
            st = engine.generate(p, makers[name](), GenerationConfig(max_new_tokens=128)).stats
            toks += st.num_new_tokens
            dec += st.wall_time_s - st.prefill_s
            steps += st.num_decode_steps
        totals[name][0] += toks
        totals[name][1] += dec
        print(f"round {rnd} {name}: {toks / dec:.1f} tok/s, {toks / steps:.2f} tok/step, {1e3 * dec / steps:.2f} ms/step", flush=True)
print("all rounds: " + ", ".join(f"{k} {t / d:.1f} tok/s" for k, (t, d) in totals.items()))
