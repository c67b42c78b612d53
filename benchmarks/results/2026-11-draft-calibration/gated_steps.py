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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: step_pieces
import step_pieces as S  # noqa: E402  (puts SRC, default src, on the path)

from specdec.engine import batch as L  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402


def main(methods: list[str]) -> None:
    loaded = load_model("smollm2-135m")
    gated = Engine(loaded, floor=Floor(price=lambda nodes, seconds: seconds * (3.0 if nodes > 1 else 1.0)))
    engines = {m: (Engine(loaded) if m == "plain" else gated) for m in methods}
    prompts = S.held_out_prompts(loaded)
    S.time_pieces()
    S.timed("capture", L.Batch, "_capture_for_next")
    for method in methods:
        engines[method].generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    acc = {m: collections.defaultdict(float) for m in methods}
    cnt = {m: [0, 0.0, 0] for m in methods}
    for _ in range(int(os.environ.get("ROUNDS", "2"))):
        for prompt in prompts:
            for method in methods:
                S.spent.clear()
                out = engines[method].generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
                for name, value in S.spent.items():
                    acc[method][name] += value
                counts = cnt[method]
                counts[0] += out.stats.num_new_tokens
                counts[1] += out.stats.wall_time_s - out.stats.prefill_s
                counts[2] += out.stats.num_decode_steps
    for method in methods:
        tokens, seconds, steps = cnt[method]
        pieces = " ".join(f"{name} {1e3 * value / steps:.3f}" for name, value in acc[method].items())
        print(f"{method}: {tokens / seconds:.1f} tok/s, {1e3 * seconds / steps:.3f} ms/step; {pieces}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["plain", "hydra", "medusa", "logitspec"])
