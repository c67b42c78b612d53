"""Each `specdec.generate(loaded, ...)` call builds its own engine: does a method's floor carry from one call to
the next (`kept`, the floor's store) or start fresh each time (`fresh`, what every call got before the store)?

    [REVERSE=1] .venv/bin/python docs/results/2026-12-floor-store/api_calls.py [METHOD ...]

The first turns of Spec-Bench questions 11-12 of every category (held out from what is reported elsewhere),
128 new tokens, greedy, one call per prompt and method, the two arms and plain decoding in turn on each
prompt. Decode tokens/s (prefill left out) over all prompts, and each text against plain decoding's.
"""

import collections
import os
import sys
import tempfile
import time

import specdec
from specdec.data import load_questions
from specdec.engine.floor import Floor
from specdec.engine.floor_store import remembered_floor
from specdec.engine.loop import Engine
from specdec.models import load_model


def held_out(last: int = 12) -> list[str]:
    seen: collections.Counter = collections.Counter()
    turns = []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= last:
            turns.append(question.turns[0])
    return turns


def main(methods: list[str]) -> None:
    loaded = load_model("smollm2-135m")
    prompts = held_out()
    folder = tempfile.mkdtemp(prefix="floor-store-")  # the kept arm's store starts empty
    arms = {"fresh": lambda: Engine(loaded, floor=Floor()), "kept": lambda: Engine(loaded, floor=remembered_floor(loaded, folder))}
    if os.environ.get("REVERSE") == "1":  # the kept arm first on each prompt: an order effect shows as a change
        arms = dict(reversed(arms.items()))
    specdec.generate(Engine(loaded, floor=Floor()), prompts[0], "plain", max_new_tokens=16, chat=True)  # warm-up
    tokens, seconds, same = collections.Counter(), collections.Counter(), collections.Counter()
    started = time.strftime("%H:%M:%S")
    for prompt in prompts:
        reference = None
        for method in methods:
            for arm, engine in arms.items():
                if method == "plain" and arm == "kept":
                    continue
                out = specdec.generate(engine(), prompt, method, max_new_tokens=128, chat=True)
                reference = out.token_ids if method == "plain" else reference
                name = "plain" if method == "plain" else f"{method} {arm}"
                tokens[name] += out.stats.num_new_tokens
                seconds[name] += out.stats.wall_time_s - out.stats.prefill_s
                same[name] += out.token_ids == reference
    print(f"{len(prompts)} prompts, {started}-{time.strftime('%H:%M:%S')}")
    plain = tokens["plain"] / seconds["plain"]
    for name in tokens:
        rate = tokens[name] / seconds[name]
        print(f"{name:18s} {rate:7.1f} tok/s {rate / plain:5.2f}x plain  same text as plain {same[name]}/{len(prompts)}")


if __name__ == "__main__":
    main(["plain", *(sys.argv[1:] or ["eagle", "medusa", "hydra", "pld", "logitspec"])])
