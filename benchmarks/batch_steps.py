"""A library batch of 1 and of 8 rows (no server): ms a step once every prompt is in, and its pieces.

    SRC=path/to/src .venv/bin/python benchmarks/batch_steps.py [METHOD ...]   (default: plain logitspec)

SmolLM2-135M on the default path; 8 Spec-Bench first turns held out from what is reported (questions
after the tenth of their category); the batch's node budget on the machine's cost curve, as the server
plans it; 60 steps after every row has joined (96 new tokens a row). Per step: the whole step, the
verification pass, the proposals. `SRC` picks the checkout, so two of them can alternate in one sitting.
"""

from __future__ import annotations

import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch  # noqa: E402
from step_pieces import spent, timed  # noqa: E402 - the same timing wrapper

from specdec.backends.torch import rows as R  # noqa: E402
from specdec.data import load_questions  # noqa: E402
from specdec.engine import costs  # noqa: E402
from specdec.engine.costs import load_or_measure  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Batch, Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402


def held_out_turns(loaded, last: int = 12) -> list[tuple[str, list[int]]]:
    """(category, first-turn prompt ids) of Spec-Bench questions 11..last of each category: never the reported first 10."""
    seen: collections.Counter = collections.Counter()
    turns = []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= last:
            turns.append((question.category, encode_prompt(loaded.tokenizer, question.turns[0], chat=True)))
    return turns


def held_out_prompts(loaded, count: int) -> list[list[int]]:
    return [prompt for _, prompt in held_out_turns(loaded)][:count]


def probe_times(loaded, context: int, sizes: list[int], repeats: int = 16) -> dict[int, list[float]]:
    """Seconds of each of the cost curve's probe trees (`costs._probe_parents`) after `context` random tokens,
    `repeats` times, sizes in turn ascending and descending: the curve's own probes timed in this process."""
    target = costs.timing_target(loaded)
    vocab = int(target.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    target.prefill(torch.randint(0, vocab, (context,), generator=generator))
    probes = {n: (torch.randint(0, vocab, (n,), generator=generator), costs._probe_parents(n)) for n in sizes}
    seconds: dict[int, list[float]] = {n: [] for n in sizes}
    for repeat in range(repeats):
        for n in sizes if repeat % 2 == 0 else sizes[::-1]:
            start = time.perf_counter()
            target.forward_tree(*probes[n])
            seconds[n].append(time.perf_counter() - start)
            target.trim(context)
    if hasattr(target, "close"):
        target.close()
    return seconds


def main(methods: list[str]) -> None:
    loaded = load_model("smollm2-135m")
    engine, costs = Engine(loaded, floor=Floor()), load_or_measure(loaded)
    prompts = held_out_prompts(loaded, 8)
    timed("pass", R.BatchedTarget, "verify_trees")
    timed("propose", Batch, "_propose")
    for method in methods:
        for rows in (1, 8):
            batch = engine.batch(costs, 8, 16)
            for prompt in prompts[:rows]:
                batch.add(prompt, parse_method(method).build(loaded), GenerationConfig(96, ignore_eos=True))
            while batch.waiting:
                batch.step()
            spent.clear()
            steps, made, start = 0, 0, time.perf_counter()
            while batch.rows and steps < 60:
                before = {id(row): len(row.tokens) for row in batch.rows}
                rows_before = list(batch.rows)
                batch.step()
                made += sum(len(row.tokens) - before[id(row)] for row in rows_before)
                steps += 1
            seconds = time.perf_counter() - start
            print(f"{method}, {rows} rows: {1000 * seconds / steps:.2f} ms a step (pass {1000 * spent['pass'] / steps:.2f}, "
                  f"proposals {1000 * spent['propose'] / steps:.2f}), {made / seconds:.0f} tokens/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:] or ["plain", "logitspec"])
