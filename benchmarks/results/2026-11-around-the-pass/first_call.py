"""What a call that reads the logits costs right after a decode pass, against the same call once more right
after it: the one-row top-60 LogitSpec takes every step, timed twice after each pass of plain decoding.

    SRC=path/to/src .venv/bin/python first_call.py

Held-out turns (Spec-Bench questions 11-12 of each category), 128 new tokens, greedy, `plain`; the calls run
inside the pass's own function, right after the head, so nothing else comes between. Also times the same
call right after those on a tensor the pass never wrote, and that call alone in a loop.
"""

import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts  # noqa: E402

from specdec.backends.registry import top_tokens  # noqa: E402
from specdec.backends.torch import fused as F  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402

spent: dict[str, list[float]] = collections.defaultdict(list)
STATIC = torch.randn(49152).to(torch.bfloat16)


def after_pass(inner):  # noqa: ANN001, ANN201 - FusedDecoder.run
    def run(self, input_ids, *args, **kwargs):  # noqa: ANN001, ANN202
        logits, features = inner(self, input_ids, *args, **kwargs)
        if input_ids.shape[1] == 1:  # decode steps, not the prefill
            row = logits[0, -1]
            for name, scores in (("logits row, first", row), ("logits row, again", row), ("untouched, third", STATIC)):
                start = time.perf_counter()
                top_tokens(scores, 60)
                spent[name].append(time.perf_counter() - start)
        return logits, features

    return run


def main() -> None:
    loaded = load_model("smollm2-135m")
    held = held_out_prompts(loaded)
    engine, config = Engine(loaded), GenerationConfig(max_new_tokens=128)
    engine.generate(held[0], parse_method("plain").build(loaded), config)  # builds and loads the kernels
    F.FusedDecoder.run = after_pass(F.FusedDecoder.run)
    for prompt in held:
        engine.generate(prompt, parse_method("plain").build(loaded), config)
    for _ in range(100):
        top_tokens(STATIC, 60)
    start = time.perf_counter()
    for _ in range(1000):
        top_tokens(STATIC, 60)
    alone = (time.perf_counter() - start) / 1000
    for name, times in spent.items():
        print(f"{name:20s} {1e6 * sum(times) / len(times):6.1f} us a step ({len(times)} steps)")
    print(f"{'alone, in a loop':20s} {1e6 * alone:6.1f} us")


if __name__ == "__main__":
    main()
