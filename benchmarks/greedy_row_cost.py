"""What greedy acceptance pays to reduce one bf16 logits row in the engine, right after the pass.

    .venv/bin/python benchmarks/greedy_row_cost.py

Plain decoding of one prompt (150 new tokens) on the default path; before each step's acceptance the
root's row is reduced twice more, converted for numpy and by the top-k kernel (`argmax_rows`), each
timed; medians over steps 20-199. Beside a tight loop over one row (hot in the caches) it shows what the
pass's cold caches add.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
import torch  # noqa: E402

from specdec.backends.torch.top_tokens import argmax_rows  # noqa: E402
from specdec.engine import verify as V  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402


def loop_us(fn, repeats: int = 2000) -> float:
    for _ in range(100):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e6 * (time.perf_counter() - start) / repeats


def main() -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded)
    samples: list[tuple[float, float, float]] = []
    accept = V.accept

    def probed(tree, logits, *args, **kwargs):
        first = time.perf_counter()
        int(logits[0].float().numpy().argmax())
        second = time.perf_counter()
        argmax_rows(logits[:1])
        third = time.perf_counter()
        result = accept(tree, logits, *args, **kwargs)
        samples.append((second - first, third - second, time.perf_counter() - third))
        return result

    V.accept = probed
    prompt = encode_prompt(loaded.tokenizer, "Write a long story about a cat who learns to code.", chat=True)
    engine.generate(prompt, parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=150))
    numpy_us, kernel_us, accept_us = (1e6 * statistics.median(s[i] for s in samples[20:200]) for i in range(3))
    print(f"in the engine (first read after the pass): numpy {numpy_us:.1f} us, kernel {kernel_us:.1f} us; "
          f"then acceptance itself {accept_us:.1f} us")
    row = torch.randn(1, loaded.model.config.vocab_size).bfloat16()
    print(f"a tight loop over one row: numpy {loop_us(lambda: int(row[0].float().numpy().argmax())):.1f} us, "
          f"kernel {loop_us(lambda: argmax_rows(row)):.1f} us")


if __name__ == "__main__":
    main()
