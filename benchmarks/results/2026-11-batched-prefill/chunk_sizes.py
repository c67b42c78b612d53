"""Batched decoding's throughput and step gaps by the prefill chunk: 8 rows at a time against one at a time.

    .venv/bin/python benchmarks/results/2026-11-batched-prefill/chunk_sizes.py METHOD 0,16,32,64,128,256

SmolLM2-135M on the default path, the first turns of Spec-Bench questions 11-13 of every category (held out
from what is reported), 128 new tokens, greedy, the machine's cost curve for the batch's plan. Every prompt is
queued at once: `generate_batch` with max_batch 8 (chunk 0: max_batch 1, one at a time). Prints tokens/s over
the whole run and, over the steps taken while some row decoded, the median, 95th percentile and largest step
(a running stream's gap between its tokens). Two rounds, the chunks in turn.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts  # noqa: E402

from specdec.engine import batch as L  # noqa: E402
from specdec.engine.costs import load_or_measure  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine, generate_batch  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

gaps: list[float] = []


def timed_step(inner):  # noqa: ANN001, ANN201 - Batch.step
    def step(self):  # noqa: ANN001, ANN202
        busy = bool(self.rows)
        start = time.perf_counter()
        out = inner(self)
        if busy:
            gaps.append(time.perf_counter() - start)
        return out

    return step


def main(method: str, chunks: list[int]) -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded)
    costs = load_or_measure(loaded, None)
    prompts = held_out_prompts(loaded, last=13)
    print("prompts", len(prompts), "mean len", sum(map(len, prompts)) / len(prompts))
    config = GenerationConfig(max_new_tokens=128)
    L.Batch.step = timed_step(L.Batch.step)
    make = lambda: parse_method(method).build(loaded)  # noqa: E731
    generate_batch(engine, prompts[:2], make, config, costs, 8, prefill_chunk=16)  # warm-up
    for _ in range(2):
        for chunk in chunks:
            gaps.clear()
            start = time.perf_counter()
            outs = generate_batch(engine, prompts, make, config, costs, 1 if chunk == 0 else 8, prefill_chunk=chunk or 16)
            seconds = time.perf_counter() - start
            tokens = sum(len(out.token_ids) for out in outs)
            ordered = sorted(gaps)
            print(f"{method} chunk {chunk or '1-at-a-time'}: {tokens / seconds:.1f} tok/s ({tokens} tokens, "
                  f"{seconds:.1f} s); step gap p50 {1e3 * statistics.median(ordered):.1f} "
                  f"p95 {1e3 * ordered[int(0.95 * len(ordered))]:.1f} max {1e3 * ordered[-1]:.1f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(c) for c in sys.argv[2].split(",")])
