"""The floor's try share, 2% (the default) against 1%, for `hydra` and `medusa`, with the floor timing every step.

    .venv/bin/python benchmarks/results/2026-11-draft-ceiling/try_share.py

Held-out first turns (Spec-Bench questions 11-13 of every category), 128 new tokens, greedy, an engine (and a
floor) per arm on one loaded model, arms interleaved per prompt (order rotating), two rounds; tokens/s against
`plain` and drafting steps after each round.
"""

import collections
import os
import sys

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts  # noqa: E402

from specdec.engine import floor as F  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

ARMS = (("plain", "plain", 0.02), ("hydra", "hydra", 0.02), ("hydra-1%", "hydra", 0.01), ("medusa", "medusa", 0.02),
        ("medusa-1%", "medusa", 0.01))  # fmt: skip


def main() -> None:
    loaded = load_model("smollm2-135m")
    engines = {name: Engine(loaded, floor=F.Floor()) for name, _, _ in ARMS}
    prompts = held_out_prompts(loaded, last=13)
    for name, method, _ in ARMS:
        engines[name].generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    totals = collections.defaultdict(lambda: [0, 0.0, 0, 0])  # tokens, seconds, steps, drafting steps
    for round_ in range(2):
        for i, prompt in enumerate(prompts):
            for name, method, share in ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]:
                F.TRY_SHARE = share
                stats = engines[name].generate(prompt, parse_method(method).build(loaded),
                                               GenerationConfig(max_new_tokens=128)).stats  # fmt: skip
                entry = totals[name]
                entry[0] += stats.num_new_tokens
                entry[1] += stats.wall_time_s - stats.prefill_s
                entry[2] += stats.num_decode_steps
                entry[3] += sum(step.tree_size > 1 for step in stats.steps)
        base = totals["plain"][0] / totals["plain"][1]
        print(f"after round {round_ + 1}: " + "; ".join(
            f"{name} x{totals[name][0] / totals[name][1] / base:.3f} (drafting {totals[name][3]}/{totals[name][2]})"
            for name, _, _ in ARMS), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
