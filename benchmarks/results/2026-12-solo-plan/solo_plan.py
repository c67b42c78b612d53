"""`Engine.generate` under the floor, pld's trees planned by the cost curve (as now) against kept whole (as before).

    .venv/bin/python benchmarks/results/2026-12-solo-plan/solo_plan.py [per_category] [rounds]

Spec-Bench first turns (the first `per_category` questions of each category, default 10), 128 new tokens,
greedy; arms `plain`, `pld` (planned: `Proposer.sized_by_costs` False, what `Engine.generate` now does) and
`pld-whole` (the same proposer told it sizes its own trees, so a lone row keeps them whole: the behaviour
before), each with a model and an engine of its own, the floor on; arms interleaved per prompt, order
rotating. Prints each arm's decode tokens/s against `plain`, tokens a step and nodes a step after each round,
and every arm's texts against plain's.
"""

import collections
import sys

sys.path.insert(0, "src")

from specdec.data import load_questions  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

ARMS = (("plain", "plain", None), ("pld", "pld", None), ("pld-whole", "pld", True))


def main(per_category: int, rounds: int) -> None:
    models = {name: load_model("smollm2-135m") for name, _, _ in ARMS}
    engines = {name: Engine(models[name], floor=Floor()) for name, _, _ in ARMS}
    tokenizer = models["plain"].tokenizer
    prompts = [encode_prompt(tokenizer, q.turns[0], chat=True) for q in load_questions(per_category=per_category)]

    def run(name: str, method: str, whole: bool | None, prompt: list[int], new: int = 128):  # noqa: ANN202
        proposer = parse_method(method).build(models[name])
        if whole:
            proposer.sized_by_costs = True
        return engines[name].generate(prompt, proposer, GenerationConfig(max_new_tokens=new))

    for arm in ARMS:
        run(*arm, prompts[-1][::-1], 16)  # warm-up on no timed prompt
    totals = collections.defaultdict(lambda: [0, 0.0, 0, 0])  # tokens, seconds, steps, tree nodes
    texts: dict[str, list] = collections.defaultdict(list)
    for round_ in range(rounds):
        for i, prompt in enumerate(prompts):
            for name, method, whole in ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]:
                out = run(name, method, whole, prompt)
                stats, entry = out.stats, totals[name]
                entry[0] += stats.num_new_tokens - 1
                entry[1] += stats.wall_time_s - stats.prefill_s
                entry[2] += stats.num_decode_steps
                entry[3] += sum(step.tree_size for step in stats.steps)
                if round_ == 0:
                    texts[name].append(out.token_ids)
        base = totals["plain"][0] / totals["plain"][1]
        print(f"after round {round_ + 1} ({len(prompts)} prompts): " + "; ".join(
            f"{name} {t[0] / t[1]:.1f} tok/s x{t[0] / t[1] / base:.3f} MAT {t[0] / t[2]:.2f} nodes {t[3] / t[2]:.2f}"
            for name, t in ((name, totals[name]) for name, _, _ in ARMS)), flush=True)  # fmt: skip
    same = {name: sum(a == b for a, b in zip(texts[name], texts["plain"], strict=True)) for name in texts}
    print("same text as plain:", {name: f"{n}/{len(prompts)}" for name, n in same.items()})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
