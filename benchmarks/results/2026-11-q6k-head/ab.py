# ruff: noqa: B023  (each timed closure runs within the loop iteration that defines it)
"""The Q6_K head from its own bits (`q6_k.Q6Linear`) against the 8-bit form with fp32 scales per 16 (`Q8Linear`),
in one process: the head alone at 1 / 4 / 8 rows, then decoding held-out Spec-Bench turns (math_reasoning
questions 11-13, first turns; Spec-Bench's coding questions are MT-bench's ten, all among the reported first
ten) with each form in alternating rounds. The two forms compute the same bits, so
the texts must be equal; only the bytes read differ. Usage: ab.py METHOD..."""
import collections
import hashlib
import os
import sys
import time

import torch

from specdec.backends.registry import verifier
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.kernels import q4_kernel, q6_k
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

loaded = load_model("qwen2.5-coder-1.5b")
engine = Engine(loaded)
head = verifier(loaded).model.get_output_embeddings()
assert isinstance(head, q6_k.Q6Linear), head
old = q4_kernel.Q8Linear(*head.blocks())


def median_ms(fn, n: int = 9) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1e3


print("head alone, ms (median of 9), Q6_K bits / 8-bit values with fp32 scales per 16:")
for rows in (1, 4, 8):
    x = torch.randn(rows, head.in_features).to(torch.bfloat16)
    assert torch.equal(head(x), old(x))
    print(f"  {rows} rows: {median_ms(lambda: head(x)):.2f} / {median_ms(lambda: old(x)):.2f}", flush=True)

seen, held = collections.Counter(), []
for question in load_questions():
    seen[question.category] += 1
    if question.category == "math_reasoning" and 11 <= seen[question.category] <= 13:
        held.append(question)
prompts = [encode_prompt(loaded.tokenizer, q.turns[0], chat=True) for q in held]
engine.generate(prompts[0], parse_method("plain").build(loaded), GenerationConfig(max_new_tokens=16))
print(f"decoding {len(prompts)} held-out prompts, 128 new tokens, greedy; decode tokens/s (prefill left out):")
for round_ in range(3):
    for form in ("q6_k", "q8/16"):
        if form == "q6_k":
            head.__dict__.pop("forward", None)
        else:  # the engine's head object multiplies by the 8-bit form for this round (same bits)
            head.forward = old.forward
        for method in sys.argv[1:]:
            decode, tokens, steps, digest = 0.0, 0, 0, hashlib.sha1()
            for prompt in prompts:
                out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
                decode += out.stats.wall_time_s - out.stats.prefill_s
                tokens += out.stats.num_new_tokens - 1
                steps += out.stats.num_decode_steps
                digest.update(str(out.token_ids).encode())
            print(f"  round {round_} {form:6s} {method:10s} {tokens / decode:6.1f} tok/s  MAT {tokens / steps:.2f}  "
                  f"texts {digest.hexdigest()[:10]}", flush=True)
print("threads", torch.get_num_threads(), "load", os.getloadavg())
