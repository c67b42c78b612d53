"""A lone row's trees cut by a batch's node budget (`Batch._budget` with the machine's cost curve, as the server
runs a single client) against the trees as the proposer sized them (no curve, as `Engine.generate` runs).

    .venv/bin/python benchmarks/results/2026-11-draft-ceiling/solo_budget.py logitspec,pld [floor]

Held-out first turns (Spec-Bench questions 11-13 of every category), 128 new tokens, greedy, `generate_batch`
with max_batch 1; a loaded model and an engine per arm (no state shared), without the engine's floor unless
`floor` is given (then its timing-driven choices differ arm to arm); arms interleaved per prompt, order rotating,
two rounds. Prints tokens/s against `plain`, tokens a step and tree nodes a step after each round.

Since `Batch._budget` keeps a lone gated row's tree whole where its proposer sized it by the costs
(`Proposer.sized_by_costs`, docs/results/2026-12-solo-plan), the "cut" arm with `floor` cuts only the trees of
proposers that size nothing themselves (pld, recycle, session); the runs recorded in the results folders ran
before that. Its second round answers the same prompts again, which LogitSpec's recycle table (kept across
requests) remembers: compare arms after the first round (docs/results/2026-12-logitspec-planned-floor).
"""

import collections
import os
import sys

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts  # noqa: E402

from specdec.engine.costs import load_or_measure  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine, generate_batch  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402


def main(methods: list[str], floor: bool) -> None:
    arms = [("plain", "plain", True)] + [(f"{m}{tag}", m, cut) for m in methods for tag, cut in (("-cut", True), ("-whole", False))]
    models = {name: load_model("smollm2-135m") for name, _, _ in arms}
    engines = {name: Engine(models[name], floor=Floor() if floor else None) for name, _, _ in arms}
    costs = load_or_measure(models["plain"], None)
    prompts = held_out_prompts(models["plain"], last=13)

    def run(name: str, method: str, cut: bool, prompt: list[int], new: int = 128):  # noqa: ANN202
        make = lambda: parse_method(method).build(models[name])  # noqa: E731
        config = GenerationConfig(max_new_tokens=new)
        return generate_batch(engines[name], [prompt], make, config, costs if cut else None, 1)[0].stats

    for name, method, cut in arms:
        run(name, method, cut, prompts[0], 16)
    totals = collections.defaultdict(lambda: [0, 0.0, 0, 0])  # tokens, seconds, steps, tree nodes
    for round_ in range(2):
        for i, prompt in enumerate(prompts):
            for name, method, cut in arms[i % len(arms) :] + arms[: i % len(arms)]:
                stats = run(name, method, cut, prompt)
                entry = totals[name]
                entry[0] += stats.num_new_tokens
                entry[1] += stats.wall_time_s - stats.prefill_s
                entry[2] += stats.num_decode_steps
                entry[3] += sum(step.tree_size for step in stats.steps)
        base = totals["plain"][0] / totals["plain"][1]
        print(f"after round {round_ + 1}: " + "; ".join(
            f"{name} x{t[0] / t[1] / base:.3f} MAT {t[0] / t[2]:.2f} nodes {t[3] / t[2]:.2f}"
            for name, t in ((name, totals[name]) for name, _, _ in arms)), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1].split(","), len(sys.argv) > 2 and sys.argv[2] == "floor")
