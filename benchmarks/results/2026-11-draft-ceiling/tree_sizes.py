"""Tokens a step (MAT) of LogitSpec's adaptive tree, of the paper's 64-node tree, and of the adaptive tree on a
prompt it has just answered (the recycle table then holds the target's own successors of that very text).

    .venv/bin/python benchmarks/results/2026-11-draft-ceiling/tree_sizes.py

SmolLM2-135M on the default path, first turns of Spec-Bench questions 11-14 of every category, 128 new tokens,
greedy, no floor. Two loaded models, so no state is shared between the arms: A runs `logitspec` on a prompt,
then again on the same prompt; B runs `logitspec:adaptive=false` (the paper's tree, no recycle table). Per
category: MAT, tree nodes a step, and tokens/s (each arm's own; for speed compare docs/benchmarks.md, not this).
"""

import collections
import os
import sys

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts  # noqa: E402

from specdec.data import load_questions  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402


def main() -> None:
    first, paper = load_model("smollm2-135m"), load_model("smollm2-135m")
    engines = {id(first): Engine(first), id(paper): Engine(paper)}
    prompts = held_out_prompts(first, last=14)
    seen: collections.Counter = collections.Counter()
    categories = []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= 14:
            categories.append(question.category)
    totals = collections.defaultdict(lambda: [0, 0, 0, 0.0])  # tokens, steps, nodes, seconds
    arms = (("adaptive", first, "logitspec"), ("adaptive, same prompt again", first, "logitspec"),
            ("paper (64 nodes)", paper, "logitspec:adaptive=false"))  # fmt: skip
    config = GenerationConfig(max_new_tokens=128)
    for category, prompt in zip(categories, prompts, strict=True):
        for name, loaded, method in arms:
            stats = engines[id(loaded)].generate(prompt, parse_method(method).build(loaded), config).stats
            entry = totals[name, category]
            entry[0] += stats.num_new_tokens - 1
            entry[1] += stats.num_decode_steps
            entry[2] += sum(step.tree_size for step in stats.steps)
            entry[3] += stats.wall_time_s - stats.prefill_s
    for name, _, _ in arms:
        cells = []
        for category in dict.fromkeys(categories):
            tokens, steps, nodes, seconds = totals[name, category]
            cells.append(f"{category} {tokens / steps:.2f} ({nodes / steps:.1f} nodes, {tokens / seconds:.0f} tok/s)")
        print(f"{name}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
