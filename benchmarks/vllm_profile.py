"""Where our vLLM proposer spends its time per step: cProfile around `propose`, inside a real engine.

Why: at one request a vLLM step on two cores takes ~38 ms and our LogitSpec proposer
spent ~0.8 ms of it (vllm_bench's `propose_s`), against a fraction of that for vLLM's
numba `ngram`; the proposer's own overhead decides the concurrency-1 comparison. This
runs one in-process engine (`vllm_bench`'s settings), wraps the drafter's `propose`
(ours, or vLLM's own `ngram` drafter) with a timer and, with `--profile`, a profiler,
generates greedily for a spread of Spec-Bench prompts, and prints the mean
milliseconds per `propose` call (and the top functions by cumulative time). With
`--profile` the profiler's own overhead inflates small functions.

    .venv-vllm/bin/python benchmarks/vllm_profile.py --limit 12 --method logitspec --profile
    .venv-vllm/bin/python benchmarks/vllm_profile.py --limit 12 --method ngram
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine, and so the drafter, in this process

from vllm_bench import CUSTOM, load_prompts, model_folder, speculative_config  # noqa: E402

PROFILER = cProfile.Profile()
TIMES = [0, 0.0]  # propose calls, seconds in them


def _wrap(worker: Any, profile: bool) -> int:
    """Runs in the engine: time (and profile) every `propose` call of the drafter from now on."""
    drafter = worker.model_runner.drafter
    inner = drafter.propose

    def propose(*args: Any, **kwargs: Any) -> Any:
        if profile:
            PROFILER.enable()
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TIMES[0] += 1
            TIMES[1] += time.perf_counter() - start
            if profile:
                PROFILER.disable()

    drafter.propose = propose
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="logitspec", choices=["ngram", *sorted(CUSTOM)])
    p.add_argument("--profile", action="store_true", help="cProfile the calls (inflates small functions)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    from vllm import LLM, SamplingParams

    folder = model_folder(args.model)
    prompts = load_prompts(folder, per_category=10, limit=None)[:: max(1, 60 // args.limit)][: args.limit]
    spec = speculative_config(args.method, argparse.Namespace(num_speculative_tokens=5, ngram_max=3, ngram_min=1))
    llm = LLM(model=folder, dtype="float32", max_model_len=4096, max_num_seqs=1, enforce_eager=True,
              kv_cache_memory_bytes=4 << 30, speculative_config=spec, seed=0)  # fmt: skip
    llm.collective_rpc(_wrap, args=(args.profile,))
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    wall = time.perf_counter() - start
    if args.profile:
        out = io.StringIO()
        pstats.Stats(PROFILER, stream=out).sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
    calls, seconds = TIMES
    print(f"{args.method}: {calls} propose calls, {1000 * seconds / max(calls, 1):.3f} ms each"
          f"{' (profiled)' if args.profile else ''}, {wall:.1f} s wall")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
