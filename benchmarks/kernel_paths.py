"""Decode tokens/s of `plain` and `logitspec` under one model setting, on the kernel paths this process runs.

    .venv/bin/python benchmarks/kernel_paths.py DTYPE PACK EXACT [METHOD ...]   (default methods: plain logitspec)

SmolLM2-135M, the first turns of Spec-Bench questions 11-12 of every category (held out from what is reported
elsewhere), 128 new tokens, greedy, the engine's floor on (as the CLI and server run). Prints the path decoded on
(`describe_path`: dtype, weights, exact, the kernels' paths), each method's decode tokens/s, and how many texts
equal plain's. To see another CPU's paths on this one, cap them: `SPECDEC_KERNELS=avx2` (specdec's kernels) with
`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` (PyTorch's), as docs/results/2026-11-avx2-kernels does.
"""

import sys

from specdec.backends.registry import describe_path
from specdec.data import load_questions
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method


def held_out_prompts(tokenizer) -> list[list[int]]:
    seen: dict[str, int] = {}
    prompts = []
    for question in load_questions():
        seen[question.category] = seen.get(question.category, 0) + 1
        if 11 <= seen[question.category] <= 12:
            prompts.append(encode_prompt(tokenizer, question.turns[0], chat=True))
    return prompts


def main(dtype: str, pack: str, exact: str, methods: list[str]) -> None:
    loaded = load_model("smollm2-135m", dtype=dtype, pack=pack, exact=exact)
    print("path:", describe_path(loaded), flush=True)
    engine = Engine(loaded, floor=Floor())
    prompts = held_out_prompts(loaded.tokenizer)
    for method in methods:  # warm-up: each method's first step and the cost curve, if not cached
        engine.generate(prompts[0], parse_method(method).build(loaded), GenerationConfig(max_new_tokens=8))
    texts = {}
    for method in methods:
        tokens = seconds = 0.0
        texts[method] = []
        for prompt in prompts:
            out = engine.generate(prompt, parse_method(method).build(loaded), GenerationConfig(max_new_tokens=128))
            tokens += out.stats.num_new_tokens
            seconds += out.stats.wall_time_s - out.stats.prefill_s
            texts[method].append(out.token_ids)
        print(f"{method}: {tokens / seconds:.1f} tok/s decode ({int(tokens)} tokens)", flush=True)
    if "plain" in texts:
        same = {m: sum(a == b for a, b in zip(texts[m], texts["plain"], strict=True)) for m in methods}
        print("same text as plain:", same, "of", len(prompts))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:4], sys.argv[4:] or ["plain", "logitspec"])
