"""Where a step's time goes around the pass: proposing, the pass, acceptance, the cache's commit, the rest.

    SRC=path/to/src .venv/bin/python benchmarks/step_pieces.py [METHOD ...]   (default: plain logitspec)

SmolLM2-135M on the default path (the exact fused 4-bit pass where the machine has it), the first turns of
Spec-Bench questions 11-12 of every category (held out from what is reported), 128 new tokens, greedy,
`ROUNDS` rounds (default 2) after a warm-up. Each piece is the engine's own method, timed in place; ms per
decode step. `SRC` picks the checkout, so two of them alternate (A, B, A, B) in one sitting. `FLOOR=1` runs
the engine with its floor, as the API does (a method's steps are then plain where its drafting loses).
Rounds after the first answer the same prompts again: LogitSpec's recycle table, kept across requests, then
holds their own successors (more tokens a step than on new text: docs/results/2026-12-logitspec-planned-floor).
"""

import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.backends.registry import load_model  # noqa: E402  (the default path: the backend picks dtype and pass)
from specdec.backends.torch import rows as R  # noqa: E402
from specdec.data import load_questions  # noqa: E402
from specdec.engine import batch as L  # noqa: E402
from specdec.engine import generation as G  # noqa: E402
from specdec.engine import verify as V  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
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


def held_out_prompts(loaded, last: int = 12) -> list[list[int]]:  # noqa: ANN001 - a LoadedModel
    """The chat-templated first turns of Spec-Bench questions 11-`last` of every category."""
    seen: collections.Counter = collections.Counter()
    held = []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= last:
            held.append(question)
    return [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]


def time_pieces() -> None:
    """Wrap the engine's own methods so each adds its time to `spent`."""
    for name, owner, attr in (("propose", L.Batch, "_propose"), ("pass", R.BatchedTarget, "verify_trees"),
                              ("accept", V, "accept"), ("commit", R.BatchedTarget, "commit"),
                              ("verify", L, "verify"), ("advance", L.Batch, "_advance"),
                              ("emit", G.Emitter, "emit"), ("step", L.Batch, "step")):  # fmt: skip
        timed(name, owner, attr)


def main(methods: list[str]) -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded, floor=Floor() if os.environ.get("FLOOR") == "1" else None)
    prompts = held_out_prompts(loaded)
    time_pieces()
    for method in methods:
        engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    for _ in range(int(os.environ.get("ROUNDS", "2"))):
        for method in methods:
            spent.clear()
            tokens = seconds = steps = 0
            for prompt in prompts:
                out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
                tokens += out.stats.num_new_tokens
                seconds += out.stats.wall_time_s - out.stats.prefill_s
                steps += out.stats.num_decode_steps
            pieces = " ".join(f"{name} {1e3 * value / steps:.3f}" for name, value in spent.items())
            print(f"{method}: {tokens / seconds:.1f} tok/s, {1e3 * seconds / steps:.3f} ms/step, "
                  f"{tokens / steps:.2f} tok/step; {pieces}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["plain", "logitspec"])
