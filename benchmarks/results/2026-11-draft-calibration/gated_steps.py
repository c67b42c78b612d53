"""What a step costs where the floor keeps a method to plain steps, against `plain`'s own step.

    .venv/bin/python gated_steps.py plain hydra medusa logitspec

A price under which no draft pays (a tree of more than one node charged three times its seconds), so after its
warm-up every method steps plainly but for the floor's tries; `plain` without a floor. The first turns of held-out
Spec-Bench questions 11-12 of each category, 128 new tokens, greedy, every method on each prompt in turn, `ROUNDS`
rounds (default 2); each piece the engine's own method timed in place (as `benchmarks/step_pieces.py`), ms a step.
"""

import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.backends.torch import rows as R  # noqa: E402
from specdec.data import load_questions  # noqa: E402
from specdec.engine import generation as G  # noqa: E402
from specdec.engine import loop as L  # noqa: E402
from specdec.engine import verify as V  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

spent: dict[str, float] = collections.defaultdict(float)


def timed(name: str, owner: object, attr: str) -> None:
    """Replace owner.attr by a wrapper that adds its time to spent[name]."""
    inner = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    setattr(owner, attr, wrapper)


def main(methods: list[str]) -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded, floor=Floor(price=lambda nodes, seconds: seconds * (3.0 if nodes > 1 else 1.0)))
    seen: collections.Counter = collections.Counter()
    held = []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= 12:
            held.append(question)
    prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
    for name, owner, attr in (("propose", L.Batch, "_propose"), ("pass", R.BatchedTarget, "verify_trees"),
                              ("accept", V, "accept"), ("commit", R.BatchedTarget, "commit"),
                              ("verify", L, "verify"), ("advance", L.Batch, "_advance"),
                              ("emit", G.Emitter, "emit"), ("step", L.Batch, "step"), ("capture", L.Batch, "_capture_for_next")):  # fmt: skip
        timed(name, owner, attr)
    for method in methods:
        engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    acc = {m: collections.defaultdict(float) for m in methods}
    cnt = {m: [0, 0.0, 0] for m in methods}
    engines = {m: (Engine(loaded) if m == "plain" else engine) for m in methods}
    for _ in range(int(os.environ.get("ROUNDS", "2"))):
        for prompt in prompts:
            for method in methods:
                spent.clear()
                out = engines[method].generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
                for k, v in spent.items():
                    acc[method][k] += v
                c = cnt[method]
                c[0] += out.stats.num_new_tokens
                c[1] += out.stats.wall_time_s - out.stats.prefill_s
                c[2] += out.stats.num_decode_steps
    for method in methods:
        tokens, seconds, steps = cnt[method]
        pieces = " ".join(f"{name} {1e3 * value / steps:.3f}" for name, value in acc[method].items())
        print(f"{method}: {tokens / seconds:.1f} tok/s, {1e3 * seconds / steps:.3f} ms/step; {pieces}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["plain", "logitspec"])
