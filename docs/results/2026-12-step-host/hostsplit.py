"""Host time of a decode step beside the pass, bundled SmolLM2 in bf16 (the fused pass): step, the pass itself
(`FusedDecoder.run`, timed by a wrapper), propose, verify less the pass, and the rest (observe, commit, emit).

Usage: python hostsplit.py ROUNDS METHOD... Three chat prompts, 128 new tokens each, the first round dropped;
medians of per-generation means, ms a step (the prefill's pass is spread over the steps, in step and pass alike).
`ab.sh` runs it over two checkouts in turn."""

import sys
import time

from specdec.backends.torch import fused
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

PROMPTS = (
    "Write a short story about a robot who learns to paint.",
    "Summarize: the cat sat on the mat. The cat sat on the mat again, and then the cat slept. Then the dog came.",
    "Write a python function that returns the n-th fibonacci number, with a docstring and tests.",
)
passes = [0.0]
untimed = fused.FusedDecoder.run


def timed_run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    start = time.perf_counter()
    try:
        return untimed(self, *args, **kwargs)
    finally:
        passes[0] += time.perf_counter() - start


def main(rounds: int, methods: list[str]) -> None:
    fused.FusedDecoder.run = timed_run
    loaded = load_model("smollm2-135m", dtype="bf16")
    prompts = [encode_prompt(loaded.tokenizer, text, chat=True) for text in PROMPTS]
    engine, config = Engine(loaded), GenerationConfig(max_new_tokens=128, ignore_eos=True)
    for method in methods:
        rows = []
        for round_ in range(rounds):
            for prompt in prompts:
                passes[0] = 0.0
                start = time.perf_counter()
                out = engine.generate(prompt, parse_method(method).build(loaded), config)
                wall, steps = time.perf_counter() - start, out.stats.steps
                if round_:
                    n = len(steps)
                    rows.append((wall / n, sum(s.draft_s for s in steps) / n, sum(s.verify_s for s in steps) / n,
                                 passes[0] / n, len(out.token_ids) / n))
        step, draft, verify, pass_, per_step = (sorted(column)[len(column) // 2] for column in zip(*rows, strict=True))
        ms = 1000.0
        print(f"{method:12s} step {step * ms:.3f} pass {pass_ * ms:.3f} host {(step - pass_) * ms:.3f} | propose "
              f"{draft * ms:.3f} verify-pass {(verify - pass_) * ms:.3f} rest {(step - draft - verify) * ms:.3f} "
              f"| tok/step {per_step:.2f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
