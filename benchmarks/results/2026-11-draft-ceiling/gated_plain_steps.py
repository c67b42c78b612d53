"""The heads' plain steps under the floor: `hydra` and `medusa` against `plain` with a price under which
drafting never pays (`Floor(price=lambda nodes, seconds: nodes)`), so their steps are the floor's plain steps
and its tries.

    .venv/bin/python benchmarks/results/2026-11-draft-ceiling/gated_plain_steps.py plain,hydra,medusa

Held-out first turns (Spec-Bench questions 11-12 of every category), 128 new tokens, greedy, one engine, the
methods interleaved per prompt (order rotating), three rounds; per method: tokens/s against `plain`, ms a step,
drafting steps, and the batch's proposal, capture and advance pieces in us a step.
"""

import collections
import os
import sys

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts, spent, timed  # noqa: E402

from specdec.engine import batch as B  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402


def main(methods: list[str]) -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded, floor=Floor(price=lambda nodes, seconds: float(nodes)))  # drafting never pays
    prompts = held_out_prompts(loaded)
    for method in methods:
        engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=16))
    for name in ("_propose", "_capture_for_next", "_advance"):
        timed(name.strip("_"), B.Batch, name)
    totals = collections.defaultdict(lambda: [0, 0.0, 0, 0])  # tokens, seconds, steps, drafting steps
    pieces: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for _ in range(3):
        for i, prompt in enumerate(prompts):
            for method in methods[i % len(methods) :] + methods[: i % len(methods)]:
                spent.clear()
                stats = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128)).stats
                entry = totals[method]
                entry[0] += stats.num_new_tokens
                entry[1] += stats.wall_time_s - stats.prefill_s
                entry[2] += stats.num_decode_steps
                entry[3] += sum(step.tree_size > 1 for step in stats.steps)
                pieces[method].update(spent)
    base = totals["plain"][0] / totals["plain"][1]
    for method in methods:
        tokens, seconds, steps, drafting = totals[method]
        print(f"{method}: {tokens / seconds:.1f} tok/s x{tokens / seconds / base:.3f}, {1e3 * seconds / steps:.3f} ms/step, "
              f"drafting steps {drafting}/{steps}; "
              + " ".join(f"{name} {1e6 * value / steps:.1f}us" for name, value in pieces[method].items()))


if __name__ == "__main__":
    main(sys.argv[1].split(","))
