"""Does a cost curve measured now (in this process) size LogitSpec's trees better than the cached one? SmolLM2,
held-out turns of the categories where logitspec lost to plain (mt_bench, summarization, qa; questions 11-14),
128 new tokens, greedy; plain, logitspec on the cached curve, logitspec on a curve measured here, in turn, rounds
(ROUNDS, default 3; SWAP=1: the fresh curve's turn before the cached one's)."""
import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.backends.registry import timing_target
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
config = parse_method("logitspec")
cached = C.load_or_measure(loaded)
target = timing_target(loaded)
fresh = C._measure(target, C.DEFAULT_SIZES, C.DEFAULT_REPEATS, C.DEFAULT_CONTEXT)[0]
target.close()
def show(c):
    return " ".join(f"{n}:{s / c.seconds[0]:.2f}" for n, s in zip(c.sizes, c.seconds, strict=False) if n <= 16)
print("cached", show(cached))
print("fresh ", show(fresh))
makers = {"plain": lambda: parse_method("plain").build(loaded),
          "logitspec cached": lambda: config.assemble(loaded, cached, None),
          "logitspec fresh": lambda: config.assemble(loaded, fresh, None)}
if os.environ.get("SWAP"):  # the fresh curve first in each round (rates carry from request to request)
    makers = {k: makers[k] for k in ("plain", "logitspec fresh", "logitspec cached")}
engine.generate(prompts[0], makers["plain"](), GenerationConfig(max_new_tokens=16))
for rnd in range(int(os.environ.get("ROUNDS", "3"))):
    for name, make in makers.items():
        toks = dec = steps = 0
        for p in prompts:
            st = engine.generate(p, make(), GenerationConfig(max_new_tokens=128)).stats
            toks += st.num_new_tokens
            dec += st.wall_time_s - st.prefill_s
            steps += st.num_decode_steps
        print(f"round {rnd} {name}: {toks / dec:.1f} tok/s, {toks / steps:.2f} tok/step, {1e3 * dec / steps:.2f} ms/step", flush=True)
